"""The SPEC §1 ``events`` table as a typed definition, plus run metadata.

One row per operation executed on a rank. ``REQUIRED`` maps each required column to its Arrow
type; ``OPTIONAL`` lists the optional columns bubblecast knows. Extra columns are kept as-is.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa

SCHEMA_VERSION = 1
METADATA_KEY = b"bubblecast"

OPS: tuple[str, ...] = (
    "F", "B", "W", "SEND_F", "RECV_F", "SEND_B", "RECV_B", "OPTIMIZER", "ALLREDUCE", "OTHER",
)  # fmt: skip
COMPUTE_OPS: tuple[str, ...] = ("F", "B", "W")
COMM_OPS: tuple[str, ...] = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")

REQUIRED: dict[str, pa.DataType] = {
    "run_id": pa.string(),
    "step": pa.int64(),
    "rank": pa.int32(),
    "stage": pa.int32(),
    "replica": pa.int32(),
    "chunk": pa.int32(),
    "microbatch": pa.int32(),
    "op": pa.string(),
    "start_s": pa.float64(),
    "duration_s": pa.float64(),
}
#: Lower bound of each integer column (SPEC §1).
MINIMUM: dict[str, int] = {
    "step": 0, "rank": 0, "stage": 0, "replica": 0, "chunk": 0, "microbatch": -1,
}  # fmt: skip
OPTIONAL: dict[str, pa.DataType] = {
    "layers": pa.int32(),  # layers the stage held at that step
    "tokens": pa.int64(),  # tokens in the microbatch
    "tokens_sq": pa.float64(),  # sum over the microbatch's packed documents of length**2
    "documents": pa.int32(),  # documents packed into the microbatch
    "host": pa.string(),
    "device": pa.string(),
    "name": pa.string(),  # the op's name in the source format (e.g. a Megatron optype)
    "speed": pa.float64(),  # the rank's ground-truth slowdown factor at that step (simulate)
    "wait_s": pa.float64(),  # time the op waited before it started (Kineto importer)
}
COLUMNS: tuple[str, ...] = tuple(REQUIRED)
#: Compute-op rows must be unique on these columns.
UNIQUE_KEY: tuple[str, ...] = ("run_id", "step", "rank", "chunk", "microbatch", "op")


@dataclass
class RunMeta:
    """Metadata of one run, stored in the Parquet key-value metadata (SPEC §1)."""

    schedule: str = "unknown"
    stages: int = 1
    microbatches: int = 1
    chunks: int = 1
    replicas: int = 1
    partition: list[int] | None = None
    source: str = "unknown"
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("stages", "microbatches", "chunks", "replicas"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(
                    f"run metadata: '{name}' must be a positive integer, got {value!r}"
                )
        if self.partition is not None:
            self.partition = [int(x) for x in self.partition]
            if len(self.partition) not in (self.stages * self.chunks, self.stages):
                raise ValueError(
                    f"run metadata: 'partition' has {len(self.partition)} entries "
                    f"for {self.stages} stages"
                )
            if any(x < 1 for x in self.partition):
                raise ValueError("run metadata: 'partition' entries must be >= 1")

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        extra = out.pop("extra")
        out.update(extra)
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> RunMeta:
        known = {"schedule", "stages", "microbatches", "chunks", "replicas", "partition", "source"}
        kwargs = {k: obj[k] for k in known if k in obj}
        extra = {k: v for k, v in obj.items() if k not in known}
        return cls(**kwargs, extra=extra)


def encode_metadata(runs: dict[str, RunMeta]) -> bytes:
    payload = {"schema_version": SCHEMA_VERSION, "runs": {r: m.to_json() for r, m in runs.items()}}
    return json.dumps(payload, sort_keys=True).encode()


def decode_metadata(raw: bytes | None) -> dict[str, RunMeta]:
    """Parse the ``bubblecast`` key; raises ValueError with the problem."""
    if raw is None:
        return {}
    payload = json.loads(raw)
    version = payload.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ValueError(f"unsupported schema_version {version!r} (this bubblecast reads 1)")
    return {str(r): RunMeta.from_json(m) for r, m in payload.get("runs", {}).items()}
