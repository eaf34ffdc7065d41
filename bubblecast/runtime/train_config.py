"""Configuration of a pipeline training run: the model, the plan, the optimizer, telemetry.

Both dataclasses validate at construction with one-line :class:`BubblecastError` messages, so
the CLI refuses a bad request before it launches any process. JSON round-trips (``to_json`` /
``from_json``) carry a config from the CLI to the torchrun workers.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from bubblecast.errors import BubblecastError
from bubblecast.runtime.inject import Injection, expand_replicas, parse_inject
from bubblecast.runtime.plan import Plan, check_plan

MODELS = ("mlp", "gpt", "packed")
#: How each step's documents are planned (packed model): the data loader's own packing, token
#: balancing, or the learned cost model with the replicas' forecast speeds.
PLANNERS = ("static", "tokens", "balance")
#: Smallest token budget (``seq_len``) of the packed model (the document presets' minimum).
MIN_BUDGET = 64
OPTIMIZERS = ("sgd", "adam", "adamw")
DTYPES = ("float32", "float64")
BACKENDS = ("auto", "gloo", "nccl")


def _positive(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise BubblecastError(f"{name}: must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class ModelSpec:
    """An example model as an ordered list of ``layers`` layers.

    ``mlp``: ``layers`` Linear(hidden, hidden) layers (tanh between them), MSE to a fixed
    teacher. ``gpt``: layer 0 embeds tokens and positions, the last layer is the head
    (LayerNorm + vocabulary projection), the ones between are pre-norm transformer blocks.
    ``packed``: the same GPT on packed documents (:mod:`bubblecast.runtime.packed_gpt`):
    micro-batches of ``seq_len`` tokens (the token budget), attention causal within each
    document, so a micro-batch's cost follows its documents.
    """

    kind: str = "mlp"
    layers: int = 8
    hidden: int = 64
    seq_len: int = 16
    vocab: int = 128
    heads: int = 4
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.kind not in MODELS:
            raise BubblecastError(f"--model: unknown model '{self.kind}' (choose from "
                                  f"{', '.join(MODELS)})")
        for name in ("layers", "hidden", "seq_len", "vocab", "heads"):
            _positive(f"--{name.replace('_', '-')}", getattr(self, name))
        if self.kind == "packed" and self.seq_len < MIN_BUDGET:
            raise BubblecastError(f"--seq-len: the packed model's token budget must be >= "
                                  f"{MIN_BUDGET}, got {self.seq_len}")
        if self.kind in ("gpt", "packed"):
            if self.layers < 3:
                raise BubblecastError(f"--layers: gpt needs >= 3 layers (embedding, block, "
                                      f"head), got {self.layers}")
            if self.hidden % self.heads:
                raise BubblecastError(f"--hidden: {self.hidden} is not divisible by "
                                      f"{self.heads} heads")
        if self.dtype not in DTYPES:
            raise BubblecastError(f"dtype: choose from {', '.join(DTYPES)}, got '{self.dtype}'")

    def tokens_per_sample(self) -> int:
        return self.seq_len if self.kind == "gpt" else 1

    @property
    def packed(self) -> bool:
        """Whether micro-batches are packed documents (the ``packed`` model)."""
        return self.kind == "packed"


@dataclass(frozen=True)
class TrainConfig:
    """A pipeline training run; ``plan`` is derived and validated at construction.

    ``flush_every``: steps between background Parquet writes of the events buffer.
    ``layer_cost_every``: steps between per-layer cost samples (0 = never).
    ``replicas``: data-parallel pipeline copies (``replicas x stages`` ranks; gradients summed
    over replicas). The packed model only: ``documents`` (a document preset or a JSON file of
    lengths, :func:`bubblecast.sim.documents.load_documents`; default ``lognormal``),
    ``planner`` (``static``: the data loader's packing; ``tokens``; ``balance``: the learned
    cost model ``cost_model`` and the replicas' forecast speeds) and ``microbatches``, each
    replica's micro-batches per step on average (a balanced plan may give a replica more or
    fewer).
    """

    model: ModelSpec = field(default_factory=ModelSpec)
    stages: int = 2
    microbatches: int = 4
    schedule: str = "1f1b"
    chunks: int | None = None
    partition: tuple[int, ...] | None = None
    steps: int = 10
    batch_size: int = 16
    seed: int = 0
    optimizer: str = "adam"
    lr: float = 1e-3
    momentum: float = 0.9
    weight_decay: float = 0.0
    inject: str | None = None
    run_id: str = "run"
    events_dir: str | None = None
    flush_every: int = 50
    layer_cost_every: int = 10
    backend: str = "auto"
    profile_dir: str | None = None
    replicas: int = 1
    documents: str | None = None
    planner: str = "static"
    cost_model: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.model, dict):
            object.__setattr__(self, "model", ModelSpec(**self.model))
        if self.partition is not None:
            object.__setattr__(self, "partition", tuple(int(x) for x in self.partition))
        for name in ("steps", "batch_size", "flush_every", "replicas"):
            _positive(f"--{name.replace('_', '-')}", getattr(self, name))
        if not isinstance(self.layer_cost_every, int) or self.layer_cost_every < 0:
            raise BubblecastError(f"layer_cost_every: must be >= 0, got {self.layer_cost_every!r}")
        if self.optimizer not in OPTIMIZERS:
            raise BubblecastError(f"--optimizer: choose from {', '.join(OPTIMIZERS)}, "
                                  f"got '{self.optimizer}'")
        if not self.lr > 0:
            raise BubblecastError(f"--lr: must be > 0, got {self.lr}")
        if self.backend not in BACKENDS:
            raise BubblecastError(f"--backend: choose from {', '.join(BACKENDS)}, "
                                  f"got '{self.backend}'")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise BubblecastError(f"--seed: must be a non-negative integer, got {self.seed!r}")
        if not self.run_id or any(c in self.run_id for c in "/\\\n"):
            raise BubblecastError(f"--run-id: invalid run id {self.run_id!r}")
        self._check_documents()
        plan = self.plan  # validates
        if self.model.packed and plan.info.multi:
            raise BubblecastError(f"--schedule: the packed model runs single-chunk schedules "
                                  f"(gpipe, 1f1b), got '{plan.schedule}'")
        if not self.model.packed and self.batch_size % (self.replicas * plan.microbatches):
            raise BubblecastError(f"--batch-size: {self.batch_size} does not split into "
                                  f"{self.replicas} replicas x {plan.microbatches} equal "
                                  "micro-batches")
        for inj in parse_inject(self.inject):
            if inj.replica is not None and inj.replica >= self.replicas:
                raise BubblecastError(f"--inject: replica {inj.replica} does not exist "
                                      f"({self.replicas} replicas)")
            if inj.replica is None and inj.rank >= self.ranks:
                raise BubblecastError(f"--inject: rank {inj.rank} does not exist "
                                      f"({self.ranks} ranks)")

    def _check_documents(self) -> None:
        if self.planner not in PLANNERS:
            raise BubblecastError(f"planner: choose from {', '.join(PLANNERS)}, "
                                  f"got '{self.planner}'")
        if not self.model.packed:
            for name, value, default in (("--documents", self.documents, None),
                                         ("planner", self.planner, "static")):
                if value != default:
                    raise BubblecastError(f"{name}: needs the packed model (--model packed), "
                                          f"this run's is '{self.model.kind}'")
        if self.model.packed:  # refuses a missing file, a document longer than the budget
            from bubblecast.sim.documents import load_documents

            load_documents(self.documents or "lognormal", self.model.seq_len)
        if self.planner == "balance" and not self.cost_model:
            raise BubblecastError("planner balance: needs a cost model (--model DIR: `bubblecast "
                                  "train EVENTS --model cost`)")
        if self.cost_model and self.planner != "balance":
            raise BubblecastError(f"cost_model: only the balance planner uses one, this run "
                                  f"plans '{self.planner}'")

    @property
    def ranks(self) -> int:
        """Processes of the job: ``replicas x stages``."""
        return self.replicas * self.stages

    @property
    def plan(self) -> Plan:
        return check_plan(self.schedule, self.stages, self.microbatches, self.model.layers,
                          self.partition, self.chunks,
                          None if self.model.packed else self.batch_size)

    @property
    def injections(self) -> list[Injection]:
        return expand_replicas(parse_inject(self.inject), self.stages)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        if out["partition"] is not None:
            out["partition"] = list(out["partition"])
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> TrainConfig:
        obj = dict(obj)
        obj["model"] = ModelSpec(**obj["model"])
        return cls(**obj)

    def dumps(self) -> str:
        return json.dumps(self.to_json())
