"""Simulated telemetry: schedule + workload + scenario -> an ``events`` table (SPEC §1).

:func:`simulate_events` builds the schedule's dependency graph once, fills a
``(runs * steps * replicas, ops)`` duration matrix from the workload, partition and scenario,
times it with one engine call and writes one row per compute op. Columns beyond the SPEC's
required ones: ``layers`` (layers the rank holds, summed over its chunks), ``tokens``
(``seqlen`` scenarios and document runs), ``tokens_sq`` and ``documents`` (document runs) and
``speed`` (the rank's ground-truth slowdown factor at that step). ``start_s`` counts from each
step's origin (0 = the step's first op), shared by all ranks. The rows are built as numpy
columns (:func:`simulate_arrays`, a :class:`~bubblecast.telemetry.fastwrite.EventArrays`):
:func:`simulate_events` makes them a pandas frame, while ``bubblecast simulate``
(:func:`write_simulation`) writes them as they are, without importing pandas.

Document runs (``documents``, SPEC §3 "Work balancing"): run ``k``'s global batches come from
``draw_batches`` seeded from (``seed``, ``k``) alone (the same under any scenario or partition),
the loader's ``next_fit`` packs each into ``replicas * M`` micro-batches, replica ``r`` runs
``r*M .. r*M+M-1`` in order, and every compute op of a micro-batch (all stages of its replica)
takes its nominal time times the micro-batch's ``WorkCost.attention(attention_share, mean
length, token_budget)`` cost (1 = a full micro-batch of mean-length documents), speed, noise.

Ground truth saved in each run's metadata ``extra`` (so the run's compute under another
partition follows exactly, see :func:`bubblecast.sim.workload.counterfactual_stage_times`):
``workload`` (per-layer costs in ms, any ``imbalance`` head included), ``scenario``
(parameters, seed and ``realised`` choices), ``sim`` (``f_ms``, ``b_ms``, ``w_ms``,
``comm_ms``, ``seed``, ``run_index``, ``model``, ``steps``, ``noise_sigma``),
``partition_steps`` (``[[first_step, partition], ...]``, only when the partition changes
between steps; ``partition`` holds step 0's, per virtual stage) and ``tokens_model``
(``mean_tokens``, ``quadratic_share``) when ``seqlen`` fills ``tokens``; ``documents`` in
document runs: ``source`` (``DocumentSource.to_json()``), ``attention_share``, ``mean_length``,
``token_budget``, ``cost`` (the true ``WorkCost``: for the oracle and counterfactuals only) and
``lengths`` (each step's global batch in arrival order: what the loader holds; policies may),
with ``tokens_ref`` (the run's mean tokens per micro-batch: one unit of load for features).
Run ``k`` of a config is named ``{run_id}-{k}``; its scenario and noise are seeded from
(``seed``, ``k``) and do not depend on the partition, so a config differing only in
``partition`` simulates the same run's counterfactual, noise included.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from bubblecast.errors import BubblecastError
from bubblecast.sim import documents as packing
from bubblecast.sim.documents import DocumentSource, WorkCost
from bubblecast.sim.engine import simulate_rows
from bubblecast.sim.scenarios import Mixed, RunShape, Scenario, make_scenario
from bubblecast.sim.schedules import ScheduleGraph, check_schedule, schedule_graph
from bubblecast.sim.shape import PipelineShape
from bubblecast.sim.workload import (
    PartitionSpec,
    Workload,
    load_workload,
    partition_matrix,
    stage_costs,
)
from bubblecast.telemetry.fastwrite import (
    EventArrays,
    Periodic,
    Values,
    code_dtype,
    write_event_arrays,
)
from bubblecast.telemetry.schema import RunMeta

if TYPE_CHECKING:
    from bubblecast.telemetry.events import Events


@dataclass(frozen=True)
class SimConfig:
    """What to simulate. Times in ms per microbatch for a whole stage (SPEC §3); ``model``
    (``uniform:L``, a file or a :class:`Workload`) replaces ``f/b/w`` by per-layer costs
    (``uniform:L`` scales them from ``f/b/w``); ``partition`` is layers per stage (one list, a
    ``(steps, S)`` array or a callable ``step -> list``; default an even split);
    ``scenario`` a name or a :class:`Scenario` (its parameters; run ``k`` reseeds it from
    ``seed`` and ``k``, whatever the instance's own ``seed``).
    ``documents`` (a preset or JSON file, resolved here to a :class:`DocumentSource` of
    ``token_budget``) makes a document run (module doc): no ``seqlen``, ``mixed`` without it."""

    schedule: str = "1f1b"
    stages: int = 4
    microbatches: int = 8
    chunks: int = 1
    f: float = 1.0
    b: float = 1.0
    w: float = 1.0
    comm: float = 0.0
    model: str | Workload | None = None
    partition: PartitionSpec = None
    steps: int = 1
    replicas: int = 1
    scenario: str | Scenario = "none"
    seed: int = 0
    runs: int = 1
    run_id: str = "sim"
    #: Index of the first run (``runs`` runs from here): a fleet is simulated a run at a time
    #: with ``first_run=k, runs=1``, run ``k`` being the same as in one call for all runs.
    first_run: int = 0
    documents: str | DocumentSource | None = None
    token_budget: int = packing.DEFAULT_TOKEN_BUDGET
    attention_share: float = packing.DEFAULT_ATTENTION_SHARE

    def __post_init__(self) -> None:
        name, chunks = check_schedule(self.schedule, self.stages, self.microbatches,
                                      self.chunks)
        object.__setattr__(self, "schedule", name)  # canonical name (aliases resolved)
        object.__setattr__(self, "chunks", chunks)  # V-shape schedules hold 2
        if not isinstance(self.first_run, (int, np.integer)) or self.first_run < 0:
            raise BubblecastError(f"first_run: must be an integer >= 0, got {self.first_run}")
        for name in ("steps", "replicas", "runs"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise BubblecastError(f"--{name}: must be a positive integer, got {value}")
        for name in ("f", "b", "w", "comm"):
            value = getattr(self, name)
            if not np.isfinite(value) or value < 0:
                raise BubblecastError(f"--{name}: must be a finite number >= 0, got {value}")
        if self.f + self.b + self.w <= 0:
            raise BubblecastError("--f/--b/--w: at least one must be positive")
        if self.partition is not None and self.model is None:
            raise BubblecastError("--partition: needs --model (layers to partition)")
        if not self.run_id:
            raise BubblecastError("run id prefix must not be empty")
        self._check_documents()

    def _check_documents(self) -> None:
        source = self.documents
        if isinstance(source, (str, os.PathLike)):
            source = packing.load_documents(os.fspath(source), self.token_budget)
            object.__setattr__(self, "documents", source)
        elif source is None:
            DocumentSource(token_budget=self.token_budget)  # the budget's own checks
        elif source.token_budget != self.token_budget:
            raise BubblecastError(f"--token-budget: {self.token_budget} differs from the "
                                  f"document source's {source.token_budget}")
        WorkCost.attention(self.attention_share, 1.0, self.token_budget)  # the share's checks
        name = self.scenario.name if isinstance(self.scenario, Scenario) else self.scenario
        if source is not None and name == "seqlen":
            raise BubblecastError("--scenario seqlen: draws its own tokens per micro-batch, "
                                  "which --documents sets; choose another scenario")

    def workload(self) -> Workload:
        """Per-layer costs; without a model, one layer per virtual stage (f/V, b/V, w/V)."""
        if isinstance(self.model, Workload):
            return self.model
        if self.model is None:
            return Workload.uniform(self.stages * self.chunks, self.f, self.b, self.w,
                                    stages=self.stages)
        return load_workload(self.model, f=self.f, b=self.b, w=self.w, stages=self.stages)

    def run_ids(self) -> list[str]:
        return [f"{self.run_id}-{k}" for k in range(self.first_run, self.first_run + self.runs)]

    @property
    def shape(self) -> PipelineShape:
        """The simulated pipeline's shape (``comm`` in seconds)."""
        return PipelineShape(self.schedule, self.stages, self.microbatches, self.chunks,
                             self.comm / 1000.0)

    def scenario_for(self, k: int) -> Scenario:
        """Run ``k``'s scenario, seeded from (``seed``, ``k``) (a :class:`Scenario` instance
        gives the parameters; its own ``seed`` is replaced); ``mixed`` without ``seqlen`` in
        document runs."""
        proto = self.scenario if isinstance(self.scenario, Scenario) \
            else make_scenario(self.scenario)
        if self.documents is not None and isinstance(proto, Mixed) \
                and "seqlen" not in proto.exclude:
            proto = replace(proto, exclude=(*proto.exclude, "seqlen"))
        seed = int(np.random.SeedSequence([self.seed, k, 0]).generate_state(1)[0])
        return replace(proto, seed=seed)


#: Noise cells drawn at a time: a block of steps stays in cache while it multiplies the
#: durations, and no full-size noise array is allocated (the values are the same: the
#: generator's stream does not depend on how it is split).
NOISE_CELLS = 1 << 18


def _apply_noise(seed: int, k: int, sigma: float, out: np.ndarray) -> None:
    """Multiply row-major ``out`` ``(steps, replicas, ops)`` by lognormal noise (mean 1),
    drawn in that order, as always: the same values."""
    if sigma <= 0:
        return
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), k, 1]))
    steps, replicas, n = out.shape
    chunk = max(1, NOISE_CELLS // max(1, replicas * n))
    for lo in range(0, steps, chunk):
        hi = min(steps, lo + chunk)
        noise = rng.standard_normal((hi - lo, replicas, n))
        noise *= sigma
        noise -= sigma * sigma / 2
        np.exp(noise, out=noise)
        out[lo:hi] *= noise


@dataclass(frozen=True)
class DocumentWork:
    """A document run's work: per ``(steps, replicas, microbatches)`` micro-batch its
    ``tokens``, ``tokens_sq``, ``documents`` and compute multiplier ``work``; ``meta`` is the
    run's ``extra["documents"]`` (see the module doc)."""

    tokens: np.ndarray
    tokens_sq: np.ndarray
    documents: np.ndarray
    work: np.ndarray
    meta: dict[str, Any]


def document_work(config: SimConfig, k: int) -> DocumentWork | None:
    """Run ``k``'s packed documents (see the module doc); None without documents."""
    source = config.documents
    if not isinstance(source, DocumentSource):
        return None
    steps, replicas, m = config.steps, config.replicas, config.microbatches
    bins, budget = replicas * m, config.token_budget
    seed = int(np.random.SeedSequence([config.seed, k, 2]).generate_state(1)[0])
    batches = packing.draw_batches(source, seed, steps, bins)
    owner = np.concatenate([packing.next_fit(b, budget) + s * bins for s, b in enumerate(batches)])
    stats = packing.microbatch_stats(np.concatenate(batches), owner, steps * bins)
    tokens, tokens_sq, documents = (x.reshape(steps, replicas, m) for x in stats)
    mean = source.mean_length()
    cost = WorkCost.attention(config.attention_share, mean, budget)
    meta = {"source": source.to_json(), "attention_share": float(config.attention_share),
            "mean_length": mean, "token_budget": int(budget), "cost": cost.to_json(),
            "lengths": [b.tolist() for b in batches]}
    work = cost.microbatch(tokens, tokens_sq, documents)
    return DocumentWork(tokens, tokens_sq, documents, work, meta)


def _durations(config: SimConfig, sg: Any, k: int, workload: Workload, parts: np.ndarray,
               out: np.ndarray, docs: DocumentWork | None) -> tuple[Any, Workload]:
    """Fill ``out`` with run ``k``'s durations in ms, row-major ``(steps, replicas, ops)``
    (the events table's order: the ``duration_s`` column itself once in seconds; the engine
    reorders small blocks as it times them); its draw and workload."""
    p, steps, replicas = config.stages, config.steps, config.replicas
    scenario = config.scenario_for(k)
    draw = scenario.draw(RunShape(steps, p, replicas, config.microbatches))
    if draw.last_stage_extra:
        per_stage = stage_costs(workload, np.array([[workload.n_layers]]))[0, 0] / p
        workload = workload.with_extra_last(tuple(draw.last_stage_extra * per_stage))
    costs = stage_costs(workload, parts)  # (steps, S, 3)
    # Per step, (virtual stage, kind) costs, kind 3 = B + W (a backward without a W op
    # carries W): one gather builds every op's base cost per step, straight into ``out``.
    table = np.empty((steps, costs.shape[1], 4))
    table[:, :, :3] = costs
    table[:, :, 3] = table[:, :, 1] + table[:, :, 2]
    flat = sg.virtual_stage * 4 + np.where(sg.fused, 3, sg.kind)
    np.take(table.reshape(steps, -1), flat, axis=1, out=out[:, 0], mode="clip")
    out[:, 1:] = out[:, :1]  # every replica starts from the same base costs
    speed = draw.speed.reshape(steps, replicas, p)
    bounds = np.flatnonzero(np.diff(sg.stage)) + 1
    if (np.diff(sg.stage) >= 0).all():  # lane order: each rank's ops are one slice
        for a, b in zip(np.r_[0, bounds], np.r_[bounds, len(sg.stage)], strict=True):
            out[:, :, a:b] *= speed[:, :, sg.stage[a], None]
    else:
        out *= speed[:, :, sg.stage]
    if draw.work is not None and docs is not None:
        raise BubblecastError(f"--scenario {scenario.name}: draws its own micro-batch work, "
                              f"which --documents sets; choose another scenario")
    work = draw.work if docs is None else docs.work  # (steps, replicas, M)
    if work is not None:
        out *= work[:, :, sg.microbatch]
    _apply_noise(config.seed, k, draw.noise_sigma, out)
    return (scenario, draw), workload


def _record_placement(meta: RunMeta, sg: ScheduleGraph) -> None:
    """Save a non-looped placement (V shape, a ``csv:`` order's own) in ``extra["vstages"]``
    so that replay and what-if need neither the schedule's name nor its CSV file."""
    table = sg.schedule.vstages
    p, v = table.shape
    looped = np.arange(v)[None, :] * p + np.arange(p)[:, None]
    if not np.array_equal(table, looped):
        meta.extra["vstages"] = table.tolist()


def _partition_steps(parts: np.ndarray) -> list[list[Any]]:
    change = np.flatnonzero(np.any(parts[1:] != parts[:-1], axis=1)) + 1
    return [[int(s), parts[s].tolist()] for s in np.r_[0, change]]


def simulate_events(config: SimConfig) -> Events:
    """Simulate ``config`` and return the events of its ``runs`` runs (see the module doc)."""
    from bubblecast.telemetry.events import Events
    from bubblecast.telemetry.validate import normalize_frame

    arrays = simulate_arrays(config)
    return Events(normalize_frame(arrays.to_frame()), arrays.runs)


def simulate_arrays(config: SimConfig) -> EventArrays:
    """The events :func:`simulate_events` returns, as numpy columns (no pandas): what
    ``simulate`` writes (:func:`~bubblecast.telemetry.fastwrite.write_event_arrays`)."""
    return _simulate(config)[0]


def _simulate(config: SimConfig) -> tuple[EventArrays, list[Any]]:
    """The events of ``config``'s runs and each run's scenario draw.

    The columns that follow from the schedule alone (run, step, rank, ..., layers) are built
    on a worker thread while this one draws and times the durations: both are mostly numpy
    loops that release the GIL, so on two cores they overlap (same arrays either way)."""
    sg = schedule_graph(config.schedule, config.stages, config.microbatches, config.chunks)
    p, v, steps, replicas = config.stages, config.chunks, config.steps, config.replicas
    base_workload = config.workload()
    parts = partition_matrix(config.partition, steps, base_workload.n_layers, p, v,
                             config.schedule)
    n, runs = sg.graph.n_ops, config.runs
    total = runs * steps * replicas * n
    structure = _Background(_structure_columns, sg, parts, runs, steps, replicas) \
        if total >= PARALLEL_ROWS else None
    dur = np.empty((runs, steps, replicas, n))  # the rows' order
    metas, draws, docs = {}, [], []
    for i, run_id in enumerate(config.run_ids()):
        k = config.first_run + i
        work = document_work(config, k)
        (scenario, draw), workload = _durations(config, sg, k, base_workload, parts, dur[i],
                                                work)
        draws.append(draw)
        docs += [] if work is None else [work]
        metas[run_id] = _run_meta(config, k, scenario, draw, workload, parts, work)
        _record_placement(metas[run_id], sg)
    shape = (steps, replicas, config.microbatches)
    work = _Background(_work_columns, sg, draws, docs, shape) if structure is not None \
        else None
    dur /= 1000.0
    # Rows in (run, step, replica, op) order; the engine fills start times block by block
    # (no full-size transposition, no unused end times).
    start = simulate_rows(sg.graph, dur.reshape(-1, n), config.comm / 1000.0, row_major=True)
    columns = structure.result() if structure is not None \
        else _structure_columns(sg, parts, runs, steps, replicas)
    columns["start_s"] = start.reshape(total)
    columns["duration_s"] = dur.reshape(total)
    columns["layers"] = columns.pop("layers")  # after the required columns, as always
    extra, nulls = work.result() if work is not None \
        else _work_columns(sg, draws, docs, shape)
    columns.update(extra)
    return EventArrays(columns, metas, nulls), draws


#: Simulations of at least this many rows build their schedule columns on a worker thread.
PARALLEL_ROWS = 1 << 16


class _Background:
    """``fn(*args)`` on a daemon thread; :meth:`result` joins it and returns (or raises)."""

    def __init__(self, fn: Any, *args: Any) -> None:
        import threading

        self._out: list[Any] = []
        self._error: list[BaseException] = []

        def run() -> None:
            try:
                self._out.append(fn(*args))
            except BaseException as exc:  # handed to result()
                self._error.append(exc)

        self._thread = threading.Thread(target=run, name="bubblecast-sim", daemon=True)
        self._thread.start()

    def result(self) -> Any:
        self._thread.join()
        if self._error:
            raise self._error[0]
        return self._out[0]


def _structure_columns(sg: ScheduleGraph, parts: np.ndarray, runs: int, steps: int,
                       replicas: int) -> dict[str, Values]:
    """The columns that follow from the schedule and partition alone, rows in (run, step,
    replica, op) order: ``run_id`` codes, ``step``, ``rank``, ``stage``, ``replica``,
    ``chunk``, ``microbatch``, ``op`` codes and ``layers``; those that repeat every step
    (every run's, one run's ``run_id``; ``layers`` under one partition) as
    :class:`~bubblecast.telemetry.fastwrite.Periodic` columns of one step's rows."""
    n, p = sg.graph.n_ops, sg.schedule.stages
    rows_per_run = steps * replicas * n
    total = runs * rows_per_run

    def per_step(row: np.ndarray, dtype: type) -> Periodic:
        """``row`` (one value per op, or ``(replicas, ops)``) in every step."""
        row = np.asarray(row, dtype=dtype).reshape(-1)
        return Periodic(np.tile(row, replicas * n // row.size), total)

    replica_op = np.repeat(np.arange(replicas, dtype=np.int32), n)
    layers_rank = np.zeros((steps, p), dtype=np.int32)  # (steps, P): each rank's chunks
    np.add.at(layers_rank.T, sg.rank_of_vstage, parts.T)
    if (layers_rank == layers_rank[0]).all():
        layers: Values = per_step(layers_rank[0, sg.stage], np.int32)
    else:  # (runs, steps, replicas, ops) by broadcasting: no per-row multi-array indexing
        layers = np.broadcast_to(layers_rank[:, None, sg.stage], (runs, steps, replicas, n)
                                 ).reshape(total)
    return {
        "run_id": Periodic(np.zeros(1, code_dtype(1)), total) if runs == 1 else
        np.broadcast_to(np.arange(runs, dtype=code_dtype(runs))[:, None],
                        (runs, rows_per_run)).reshape(total),
        "step": np.broadcast_to(np.arange(steps, dtype=np.int64)[None, :, None],
                                (runs, steps, replicas * n)).reshape(total),
        "rank": per_step(replica_op * p + np.tile(sg.stage, replicas), np.int32),
        "stage": per_step(sg.stage, np.int32),
        "replica": per_step(replica_op, np.int32),
        "chunk": per_step(sg.chunk, np.int32),
        "microbatch": per_step(sg.microbatch, np.int32),
        "op": per_step(sg.kind, np.int8),  # codes into OPS: F, B, W are 0, 1, 2
        "layers": layers,
    }


def _work_columns(sg: Any, draws: list[Any], docs: list[DocumentWork],
                  shape: tuple[int, int, int]
                  ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The columns after ``layers`` (rows in (run, step, replica, op) order) and the null
    masks of the integer ones (nullable integers in a frame, even without nulls): document
    runs' ``tokens``, ``tokens_sq``, ``documents``, or ``seqlen``'s ``tokens`` (null where a
    run has none), then ``speed``."""
    steps, replicas, _ = shape
    runs, n, p = len(draws), sg.graph.n_ops, sg.schedule.stages
    total = runs * steps * replicas * n

    def per_op(cube: np.ndarray) -> np.ndarray:  # (runs, steps, replicas, M) -> one per row
        return cube[..., sg.microbatch].reshape(total)

    columns, nulls = {}, {}
    if docs:
        columns["tokens"] = per_op(np.stack([d.tokens for d in docs])).astype(np.int64)
        columns["tokens_sq"] = per_op(np.stack([d.tokens_sq for d in docs]))
        columns["documents"] = per_op(np.stack([d.documents for d in docs])).astype(np.int32)
        nulls = {"tokens": np.zeros(total, bool), "documents": np.zeros(total, bool)}
    elif any(d.tokens is not None for d in draws):
        # Runs without token counts get nulls (unknown), never 0 tokens.
        tok = per_op(np.stack([np.full(shape, np.nan) if d.tokens is None
                               else d.tokens.astype(np.float64) for d in draws]))
        nulls["tokens"] = np.isnan(tok)
        columns["tokens"] = np.where(nulls["tokens"], 0.0, tok).astype(np.int64)
    speed = np.stack([d.speed for d in draws])  # (runs, steps, ranks)
    columns["speed"] = speed.reshape(runs, steps, replicas, p)[..., sg.stage].reshape(total)
    return columns, nulls


def _run_meta(config: SimConfig, k: int, scenario: Scenario, draw: Any, workload: Workload,
              parts: np.ndarray, docs: DocumentWork | None) -> RunMeta:
    model = config.model if isinstance(config.model, str) or config.model is None \
        else workload.name
    extra: dict[str, Any] = {
        "workload": workload.to_json(),
        "scenario": {**scenario.params(), **{"realised": draw.info}},
        "sim": {"f_ms": config.f, "b_ms": config.b, "w_ms": config.w, "comm_ms": config.comm,
                "seed": config.seed, "run_index": k, "model": model,
                "steps": config.steps, "noise_sigma": float(draw.noise_sigma)},
    }
    if len(parts) > 1 and np.any(parts[1:] != parts[:-1]):
        extra["partition_steps"] = _partition_steps(parts)
    if draw.tokens is not None:
        extra["tokens_model"] = {"mean_tokens": draw.info.get("mean_tokens", 1.0),
                                 "quadratic_share": draw.info.get("quadratic_share", 0.0)}
    if docs is not None:
        extra["documents"] = docs.meta
        extra["tokens_ref"] = float(docs.tokens.mean())  # one unit of micro-batch load
    return RunMeta(schedule=config.schedule, stages=config.stages,
                   microbatches=config.microbatches, chunks=config.chunks,
                   replicas=config.replicas, partition=parts[0].tolist(),
                   source="bubblecast simulate", extra=extra)


def simulate_fleet(config: SimConfig, out: str) -> tuple[list[str], int]:
    """Simulate ``config`` a run at a time into the fleet directory ``out`` (each run appended
    atomically, memory bounded by one run); the run ids and the number of events."""
    run_ids, total, _ = _write_fleet(config, out)
    return run_ids, total


def _write_fleet(config: SimConfig, out: str) -> tuple[list[str], int, bool]:
    """:func:`simulate_fleet`, and whether a run's scenario draw carries device metrics."""
    run_ids, total, metrics = [], 0, False
    for k in range(config.first_run, config.first_run + config.runs):
        arrays, draws = _simulate(replace(config, first_run=k, runs=1))
        write_event_arrays(arrays, out if out.endswith(("/", os.sep)) else out + os.sep)
        run_ids.extend(arrays.runs)
        total += len(arrays)
        metrics = metrics or any(d.metrics for d in draws)
    return run_ids, total, metrics


def write_simulation(config: SimConfig, out: str) -> tuple[list[str], int]:
    """What ``bubblecast simulate`` writes: ``config``'s events to ``out`` (a Parquet file, or
    a fleet directory written a run at a time), then the runs' device metrics beside them
    when a scenario draws any (:mod:`bubblecast.sim.device_metrics`); pandas is loaded for
    those alone. The run ids and the number of events."""
    from bubblecast.telemetry.fleet import is_directory_target

    if is_directory_target(out):
        run_ids, total, metrics = _write_fleet(config, out)
    else:
        arrays, draws = _simulate(config)
        write_event_arrays(arrays, out)
        run_ids, total = list(arrays.runs), len(arrays)
        metrics = any(d.metrics for d in draws)
    if metrics:
        from bubblecast.sim.device_metrics import write_simulated_metrics

        write_simulated_metrics(config, out)
    return run_ids, total
