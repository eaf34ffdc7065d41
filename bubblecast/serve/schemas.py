"""Request and response models of the prediction service (pydantic v2).

Everything a request can carry is bounded here, so that no input can make the service do
unbounded work or produce a non-finite number: times are finite, non-negative and at most
``MAX_SECONDS``; windows hold 1..``MAX_WINDOW`` steps; a pipeline has at most ``MAX_STAGES``
stages and ``MAX_OPS`` simulated ops; a step to plan holds at most ``MAX_DOCUMENTS``
documents and ``MAX_PLAN_MICROBATCHES`` micro-batches. Checks that need the loaded model (the
shortest window it accepts, the horizons it knows) live in :mod:`bubblecast.serve.predictor`
and fail the same way: a 422 whose JSON names the field.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from bubblecast.errors import BubblecastError
from bubblecast.sim.schedules import SCHEDULES as SCHEDULE_TABLE

MAX_WINDOW = 1024  # steps of history per rank
MAX_STAGES = 256
MAX_MICROBATCHES = 1024
MAX_CHUNKS = 8
MAX_OPS = 32_768  # stages x microbatches x chunks x 3 ops simulated per request
MAX_LAYERS = 1024
MAX_SOLVER_CELLS = 1 << 23  # stages x layers^2 the partition solver may touch
MAX_HORIZON = 10_000
MAX_SECONDS = 1e6  # any single time value
MAX_WORK = 1e12  # work units (layer cost, tokens) per value
MAX_DOCUMENTS = 16_384  # documents per planning request
MAX_TOKEN_BUDGET = 1 << 20  # tokens per packed micro-batch
MAX_REPLICAS = 64
MAX_PLAN_MICROBATCHES = 4096  # replicas x microbatches of one planned step
MAX_METRICS = 32  # device metrics per rank

#: The schedules the service accepts: every named row of THE schedule table
#: (:data:`bubblecast.sim.schedules.SCHEDULES`, whose flags the checks below read), the first
#: five in the order the OpenAPI schema always listed them, then the multi-chunk ones (zbv,
#: dualpipev, ...). ``torch:``/``csv:`` sources are not accepted over HTTP (no files).
_FIRST = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2")
SCHEDULES: tuple[str, ...] = _FIRST + tuple(n for n in SCHEDULE_TABLE if n not in _FIRST)

Seconds = Annotated[float, Field(ge=0.0, le=MAX_SECONDS, allow_inf_nan=False)]
PositiveWork = Annotated[float, Field(gt=0.0, le=MAX_WORK, allow_inf_nan=False)]
NonNegWork = Annotated[float, Field(ge=0.0, le=MAX_WORK, allow_inf_nan=False)]
Horizon = Annotated[int, Field(ge=1, le=MAX_HORIZON)]
Window = Annotated[list[Seconds], Field(min_length=1, max_length=MAX_WINDOW)]
WorkWindow = Annotated[list[PositiveWork], Field(min_length=1, max_length=MAX_WINDOW)]
LayerWindow = Annotated[list[Annotated[int, Field(ge=1, le=MAX_LAYERS)]],
                        Field(min_length=1, max_length=MAX_WINDOW)]
MetricName = Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")]
MetricValue = Annotated[float, Field(ge=-MAX_WORK, le=MAX_WORK, allow_inf_nan=False)]
MetricWindow = Annotated[list[MetricValue | None], Field(min_length=1, max_length=MAX_WINDOW)]


class RequestError(BubblecastError):
    """An input the schema accepts but the loaded model or pipeline cannot serve (-> 422)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False)


class RankWindow(_Strict):
    """Recent history of one rank, oldest step first; all lists have the same length."""

    rank: int = Field(ge=0, le=1_000_000, description="global rank id")
    stage: int = Field(ge=0, lt=MAX_STAGES, description="pipeline position (0 = first)")
    compute_s: Window = Field(description="compute seconds (F+B+W) per step")
    work: WorkWindow | None = Field(
        None, description="work held per step: the summed cost of the layers the rank held "
        "(1 per step when absent)")
    tokens: WorkWindow | None = Field(
        None, description="tokens processed per step, when the data loader knows them")
    layers: LayerWindow | None = Field(None, description="layers held per step, when known")
    device_metrics: dict[MetricName, MetricWindow] | None = Field(
        None, max_length=MAX_METRICS, description="device metrics of this rank per step, by "
        "name as in the device_metrics table (temperature_c, sm_clock_mhz, power_w, ...): the "
        "value sampled at that step, null where none was; a model trained with covariates "
        "reads its covariate features from them (422 naming the metric when one it needs is "
        "absent)")

    @model_validator(mode="after")
    def _same_length(self) -> RankWindow:
        n = len(self.compute_s)
        for name in ("work", "tokens", "layers"):
            values = getattr(self, name)
            if values is not None and len(values) != n:
                raise ValueError(f"{name}: has {len(values)} steps, compute_s has {n}")
        for metric, values in (self.device_metrics or {}).items():
            if len(values) != n:
                raise ValueError(f"device_metrics.{metric}: has {len(values)} steps, "
                                 f"compute_s has {n}")
        return self


class Pipeline(_Strict):
    """The schedule the bubble fraction and step times are simulated with."""

    schedule: Literal[SCHEDULES] = "1f1b"  # type: ignore[valid-type]
    stages: int = Field(ge=1, le=MAX_STAGES)
    microbatches: int = Field(ge=1, le=MAX_MICROBATCHES)
    chunks: int = Field(1, ge=1, le=MAX_CHUNKS, description="model chunks per rank (interleaved)")
    comm_s: Seconds = Field(0.0, description="point-to-point transfer time per op")
    op_weights: tuple[PositiveWork, PositiveWork, NonNegWork] = Field(
        (1.0, 1.0, 1.0), description="relative F, B, W cost splitting a stage's compute")

    @model_validator(mode="after")
    def _bounded(self) -> Pipeline:
        ops = self.stages * self.microbatches * self.chunks * 3
        if ops > MAX_OPS:
            raise ValueError(f"stages x microbatches x chunks x 3 = {ops} ops, limit {MAX_OPS}")
        if self.chunks > 1 and not SCHEDULE_TABLE[self.schedule].multi_chunk:
            multi = sorted(n for n, spec in SCHEDULE_TABLE.items() if spec.multi_chunk)
            raise ValueError(f"chunks: {self.chunks} chunks need a multi-chunk schedule "
                             f"({', '.join(multi)}), not '{self.schedule}'")
        return self


class ForecastRequest(_Strict):
    """One pipeline replica's recent per-rank history and the horizons to forecast."""

    run_id: str | None = Field(None, max_length=256)
    step: int | None = Field(
        None, ge=0, le=10**12, description="step number of the window's newest entry; with "
        "run_id, the service adapts this run's p10-p90 intervals across requests (adaptive "
        "conformal inference, as the policy layer serves them in process); without, the "
        "model's own intervals")
    pipeline: Pipeline
    horizons: list[Horizon] = Field(default_factory=lambda: [1, 5, 10], min_length=1,
                                    max_length=32)
    ranks: list[RankWindow] = Field(min_length=1, max_length=MAX_STAGES)
    next_tokens: list[PositiveWork] | None = Field(
        None, max_length=32, description="tokens per step at each horizon, when known ahead")

    @model_validator(mode="after")
    def _consistent(self) -> ForecastRequest:
        if len(set(self.horizons)) != len(self.horizons):
            raise ValueError("horizons: must be distinct")
        stages = self.pipeline.stages
        seen: dict[int, int] = {}
        ranks: set[int] = set()
        steps = len(self.ranks[0].compute_s)
        for i, r in enumerate(self.ranks):
            if r.stage >= stages:
                raise ValueError(f"ranks[{i}].stage: unknown stage {r.stage} in a pipeline of "
                                 f"{stages} stages")
            if r.stage in seen:
                raise ValueError(f"ranks[{i}].stage: stage {r.stage} also in "
                                 f"ranks[{seen[r.stage]}]")
            if r.rank in ranks:
                raise ValueError(f"ranks[{i}].rank: rank {r.rank} appears twice")
            if len(r.compute_s) != steps:
                raise ValueError(f"ranks[{i}].compute_s: {len(r.compute_s)} steps, ranks[0] has "
                                 f"{steps}")
            seen[r.stage] = i
            ranks.add(r.rank)
        if len(seen) != stages:
            missing = sorted(set(range(stages)) - set(seen))
            raise ValueError(f"ranks: stages {missing[:8]} have no rank")
        if self.next_tokens is not None and len(self.next_tokens) != len(self.horizons):
            raise ValueError(f"next_tokens: {len(self.next_tokens)} values for "
                             f"{len(self.horizons)} horizons")
        return self


class Migration(_Strict):
    """Cost of a repartition (``bubblecast.policy.cost``): bytes of the layers that change
    stage (parameters x (1 + optimizer_factor)) / bandwidth + a fixed pause, paid once."""

    param_bytes: list[NonNegWork] | None = Field(
        None, max_length=MAX_LAYERS, description="parameter bytes per layer (0 when absent)")
    bandwidth_bytes_per_s: PositiveWork = 10e9
    pause_s: Seconds = Field(0.05, description="fixed pause of every repartition")
    optimizer_factor: Annotated[float, Field(ge=0.0, le=1e3, allow_inf_nan=False)] = 6.0
    parallel_links: bool = False


class PolicyParams(_Strict):
    """Knobs of the predictive policy (``bubblecast.policy.policies.PredictivePolicy``)."""

    horizon: int = Field(32, ge=1, le=4096, description="steps a move must pay back within")
    risk: float = Field(0.3, ge=0.0, le=1.0, allow_inf_nan=False,
                        description="weight of p90 against p50 in the planning speed")
    margin: float = Field(0.5, ge=0.0, le=100.0, allow_inf_nan=False,
                          description="saving must exceed (1 + margin) x migration cost")
    min_gain: float = Field(0.01, ge=0.0, le=1.0, allow_inf_nan=False,
                            description="minimum predicted gain per step (fraction)")
    hold: int = Field(5, ge=0, le=100_000, description="steps without a move after one")
    min_history: int = Field(8, ge=1, le=MAX_WINDOW, description="steps seen before acting")


LayerCost = Annotated[float, Field(ge=0.0, le=MAX_WORK, allow_inf_nan=False)]
#: Sizes on each branch of the union (array keywords minItems/maxItems in the schema); on the
#: union itself pydantic wrote the string keywords minLength/maxLength, which bound nothing.
LayerCosts = Annotated[list[LayerCost], Field(min_length=1, max_length=MAX_LAYERS)]
LayerCostsFBW = Annotated[list[tuple[LayerCost, LayerCost, LayerCost]],
                          Field(min_length=1, max_length=MAX_LAYERS)]


class RecommendRequest(ForecastRequest):
    """A forecast request plus what a repartition needs."""

    partition: list[Annotated[int, Field(ge=1, le=MAX_LAYERS)]] = Field(
        min_length=1, max_length=MAX_STAGES * MAX_CHUNKS,
        description="layers held per (virtual) stage, chunk-major for interleaved schedules")
    layer_costs: LayerCosts | LayerCostsFBW = Field(
        description="cost per layer, or [F, B, W] cost per layer; a single cost is split "
        "by pipeline.op_weights")
    migration: Migration = Field(default_factory=Migration)
    policy: PolicyParams = Field(default_factory=PolicyParams)
    steps_since_action: int | None = Field(
        None, ge=0, le=10**9, description="steps since the last repartition, if any")

    @model_validator(mode="after")
    def _partition(self) -> RecommendRequest:
        width = self.pipeline.stages * self.pipeline.chunks
        if len(self.partition) != width:
            raise ValueError(f"partition: {len(self.partition)} entries for {width} "
                             "(virtual) stages")
        layers = len(self.layer_costs)
        if sum(self.partition) != layers:
            raise ValueError(f"partition: holds {sum(self.partition)} layers, layer_costs has "
                             f"{layers}")
        cells = width * layers**2
        if cells > MAX_SOLVER_CELLS:
            raise ValueError(f"layer_costs: {layers} layers x {width} stages is too large to "
                             f"solve per request (stages x layers^2 <= {MAX_SOLVER_CELLS})")
        total = sum(sum(c) if isinstance(c, tuple) else c for c in self.layer_costs)
        if total <= 0:
            raise ValueError("layer_costs: at least one layer must cost > 0")
        pb = self.migration.param_bytes
        if pb is not None and len(pb) != layers:
            raise ValueError(f"migration.param_bytes: {len(pb)} values for {layers} layers")
        return self


DocumentLength = Annotated[int, Field(ge=1, le=MAX_TOKEN_BUDGET)]
Coefficient = Annotated[float, Field(ge=0.0, le=MAX_WORK, allow_inf_nan=False)]
Speed = Annotated[float, Field(gt=0.0, le=MAX_SECONDS, allow_inf_nan=False)]


class PlanCost(_Strict):
    """What one packed micro-batch costs per layer (``bubblecast.WorkCost``): ``per_token *
    tokens + per_token_sq * tokens_sq + per_document * documents + per_microbatch``."""

    per_token: Coefficient = 0.0
    per_token_sq: Coefficient = Field(0.0, description="per squared document length")
    per_document: Coefficient = 0.0
    per_microbatch: Coefficient = 0.0

    @model_validator(mode="after")
    def _some_cost(self) -> PlanCost:
        if not any((self.per_token, self.per_token_sq, self.per_document,
                    self.per_microbatch)):
            raise ValueError("every coefficient is 0")
        return self


class PlanRequest(_Strict):
    """One step's documents to plan (``bubblecast.plan_batch``): which go into which
    micro-batch of which data-parallel replica, in what order, how many per replica."""

    lengths: list[DocumentLength] = Field(
        min_length=1, max_length=MAX_DOCUMENTS, description="the step's document lengths "
        "(tokens), each at most token_budget; at least replicas x microbatches of them")
    token_budget: int = Field(ge=1, le=MAX_TOKEN_BUDGET, description="tokens per micro-batch")
    replicas: int = Field(1, ge=1, le=MAX_REPLICAS, description="data-parallel pipelines")
    microbatches: int = Field(8, ge=1, le=MAX_MICROBATCHES,
                              description="micro-batches per replica (on average)")
    stages: int = Field(1, ge=1, le=MAX_STAGES, description="pipeline stages")
    schedule: Literal[SCHEDULES] = "1f1b"  # type: ignore[valid-type]
    speeds: list[Speed] | None = Field(
        None, min_length=1, max_length=MAX_REPLICAS,
        description="per-replica time multipliers (1.5 = 50% slower); null for equal")
    cost: PlanCost | Literal["served"] | None = Field(
        None, description="null: balance token counts; coefficients; or \"served\": the "
        "cost model the service was started with (--cost-model)")

    @model_validator(mode="after")
    def _bounded(self) -> PlanRequest:
        total = self.replicas * self.microbatches
        if total > MAX_PLAN_MICROBATCHES:
            raise ValueError(f"microbatches: replicas x microbatches = {total}, limit "
                             f"{MAX_PLAN_MICROBATCHES}")
        ops = self.stages * self.microbatches * 3
        if ops > MAX_OPS:
            raise ValueError(f"stages: stages x microbatches x 3 = {ops} ops, limit {MAX_OPS}")
        return self


class ModelRef(BaseModel):
    name: str
    version: str


class RankForecast(BaseModel):
    """Quantiles in seconds of compute per step, one value per requested horizon."""

    rank: int
    stage: int
    p10: list[float]
    p50: list[float]
    p90: list[float]


#: Which p10-p90 intervals an answer used.
Intervals = Literal["model", "run"]
INTERVALS = ("'model': the model's own p10-p90 intervals; 'run': adapted to this run across its "
             "requests (the request gave run_id and step)")


class ForecastResponse(BaseModel):
    model: ModelRef
    horizons: list[int]
    ranks: list[RankForecast]
    bubble_fraction: list[float] = Field(description="predicted, per horizon (from p50)")
    step_time_s: list[float] = Field(description="predicted step time per horizon (from p50)")
    intervals: Intervals = Field("model", description=INTERVALS)


class RecommendResponse(BaseModel):
    model: ModelRef
    action: dict[str, Any] = Field(description="SPEC action JSON form")
    step_time_s: float = Field(description="predicted mean step time over the policy horizon, "
                               "keeping the current plan")
    step_time_with_action_s: float = Field(description="the same after the action")
    migration_s: float = Field(description="one-off cost of applying the action")
    saving_s: float = Field(description="predicted seconds saved over the horizon, net of the "
                            "migration")
    horizon: int
    reason: str
    intervals: Intervals = Field("model", description=INTERVALS)


class ModelInfoResponse(BaseModel):
    name: str
    version: str
    alias: str | None
    source: str
    loaded_at: float
    metrics: dict[str, Any]
    min_window: int
    horizons: list[int] | None
    feature_path: str | None = Field(None, description="numpy, numpy+pandas or pandas (how "
                                     "the model's input features are computed)")


class PlanResponse(BaseModel):
    """The step's plan (``WorkPlan.to_json()``), the same as ``bubblecast.plan_batch``'s."""

    method: str = Field(description="tokens (cost null: token balancing) or balance")
    counts: list[int] = Field(description="micro-batches per replica")
    microbatches: list[list[list[int]]] = Field(
        description="[replica][j]: indices into lengths of the j-th micro-batch, in run order")
    cost: list[list[float]] = Field(description="each micro-batch's cost, in the cost's units")
    predicted_step: float | None = Field(description="predicted step time in cost units x "
                                         "speed; null for the loader's plan")
    fallback: str | None = Field(description="why the plan is the loader's packing; null "
                                 "when planned")


class ErrorResponse(BaseModel):
    error: str
    field: str | None = None
    detail: list[dict[str, Any]] = Field(default_factory=list)
