"""Write one rank's events straight from numpy arrays: no pandas, one vectorised check pass.

The runtime recorder writes a part every few seconds from rows it built itself (known dtypes,
one run, one rank). Going through a DataFrame, :func:`~bubblecast.telemetry.from_frame` and
:func:`~bubblecast.telemetry.write_events` cost ~9 ms of CPU per part of ~850 rows, nearly
all of it fixed pandas overhead (frame construction, per-column dtype dispatch, categorical
conversion), taken from the training ranks on a small machine. :func:`write_rank_arrays`
checks the same SPEC §1 row invariants with a few numpy passes (dtypes, finite times,
non-negative durations, lower bounds, ranges from the run metadata, unique compute ops) and
builds the Arrow table directly (``run_id`` and ``op`` as dictionary arrays from codes): the
file is byte for byte the one the DataFrame path writes, atomically. Files a user hands to
bubblecast are still validated by :func:`~bubblecast.telemetry.read_events` in full.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bubblecast.telemetry.io import atomic_write, parquet_options
from bubblecast.telemetry.schema import (
    COMPUTE_OPS,
    METADATA_KEY,
    MINIMUM,
    OPS,
    OPTIONAL,
    REQUIRED,
    UNIQUE_KEY,
    RunMeta,
    encode_metadata,
)
from bubblecast.telemetry.validate import SchemaError

#: The per-row array columns of :class:`RankArrays` and their numpy dtypes.
ARRAY_DTYPES: dict[str, np.dtype] = {
    "step": np.dtype(np.int64), "chunk": np.dtype(np.int32),
    "microbatch": np.dtype(np.int32), "op": np.dtype(np.int8),
    "start_s": np.dtype(np.float64), "duration_s": np.dtype(np.float64),
    "layers": np.dtype(np.int32), "tokens": np.dtype(np.int64),
}  # fmt: skip
_INT32 = np.iinfo(np.int32)


@dataclass(frozen=True)
class RankArrays:
    """Events of one run on one rank, stage and replica, as arrays with SPEC dtypes.

    ``op`` holds codes into :data:`~bubblecast.telemetry.schema.OPS`; ``tokens`` < 0 are
    unknown (written as null); ``layers``, ``tokens``, ``host`` and ``device`` are optional
    columns (None: absent)."""

    run_id: str
    rank: int
    stage: int
    replica: int
    step: np.ndarray
    chunk: np.ndarray
    microbatch: np.ndarray
    op: np.ndarray
    start_s: np.ndarray
    duration_s: np.ndarray
    layers: np.ndarray | None = None
    tokens: np.ndarray | None = None
    host: str | None = None
    device: str | None = None

    def __len__(self) -> int:
        return int(self.step.shape[0])


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _check_types(a: RankArrays, source: str) -> None:
    """Array dtypes and lengths, scalar columns' values (no pass over the rows)."""
    n = len(a)
    for col, dtype in ARRAY_DTYPES.items():
        values = getattr(a, col)
        if values is None and col in ("layers", "tokens"):
            continue
        if not isinstance(values, np.ndarray) or values.dtype != dtype or values.ndim != 1:
            got = values.dtype if isinstance(values, np.ndarray) else type(values).__name__
            raise SchemaError(source, col, None, f"expected a 1-d {dtype} array, got {got}")
        if values.shape[0] != n:
            raise SchemaError(source, col, None, f"has {values.shape[0]} rows, step has {n}")
    for col in ("rank", "stage", "replica"):
        value = getattr(a, col)
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) \
                or not MINIMUM[col] <= value <= _INT32.max:
            raise SchemaError(source, col, None, f"value {value!r} is not an int32 >= "
                                                 f"{MINIMUM[col]}")


def _check_values(a: RankArrays, meta: RunMeta, source: str) -> None:
    """Op codes, finite times, non-negative durations, lower bounds and metadata ranges."""
    if not len(a):
        return
    op = a.op
    if op.min() < 0 or op.max() >= len(OPS):
        row = _first((op < 0) | (op >= len(OPS)))
        raise SchemaError(source, "op", row, f"unknown op code {op[row]}")
    for col in ("start_s", "duration_s"):
        values = getattr(a, col)
        if not np.isfinite(values.sum()):  # NaN or inf anywhere makes the sum so
            bad = ~np.isfinite(values)
            if bad.any():
                row = _first(bad)
                raise SchemaError(source, col, row, f"value {values[row]} is not finite")
    if a.duration_s.min() < 0:
        row = _first(a.duration_s < 0)
        raise SchemaError(source, "duration_s", row, f"negative duration {a.duration_s[row]}")
    for col in ("step", "chunk", "microbatch", "layers"):
        values, low = getattr(a, col), MINIMUM.get(col, 0)
        if values is not None and values.min() < low:
            row = _first(values < low)
            raise SchemaError(source, col, row, f"value {values[row]} is below {low}")
    for col, attr in (("stage", "stages"), ("microbatch", "microbatches"), ("chunk", "chunks"),
                      ("replica", "replicas")):
        limit, values = getattr(meta, attr), getattr(a, col)
        if isinstance(values, np.ndarray):
            if values.max() < limit:
                continue
            row = _first(values >= limit)
            value = values[row]
        elif values < limit:
            continue
        else:
            row, value = 0, values  # a scalar column: every row has it
        raise SchemaError(source, col, row, f"value {value} out of range for run "
                                            f"'{a.run_id}' ({attr}={limit})")


def _check_duplicates(a: RankArrays, source: str) -> None:
    """Compute ops unique on (step, chunk, microbatch, op); run, rank are one value here."""
    rows = np.flatnonzero(a.op < len(COMPUTE_OPS))
    if rows.size < 2:
        return
    keys = np.stack([a.step[rows], a.chunk[rows].astype(np.int64),
                     a.microbatch[rows].astype(np.int64), a.op[rows].astype(np.int64)])
    order = np.lexsort(keys[::-1])  # stable: of two equal rows the later is the duplicate
    ordered = keys[:, order]
    same = np.all(ordered[:, 1:] == ordered[:, :-1], axis=0)
    if same.any():
        row = int(rows[order[1:][same]].min())
        value = {"run_id": a.run_id, "step": a.step[row], "rank": a.rank,
                 "chunk": a.chunk[row], "microbatch": a.microbatch[row], "op": OPS[a.op[row]]}
        key = ", ".join(f"{c}={value[c]}" for c in UNIQUE_KEY)
        raise SchemaError(source, "op", row, f"duplicate compute op ({key})")


def check_rank_arrays(a: RankArrays, meta: RunMeta, source: str) -> None:
    """The SPEC §1 checks of :func:`~bubblecast.telemetry.validate.validate_frame` for one
    rank's arrays; raises :class:`SchemaError` naming the column and the first bad row."""
    _check_types(a, source)
    _check_values(a, meta, source)
    _check_duplicates(a, source)


def _dictionary(codes: np.ndarray, values: list[str]) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(pa.array(codes), pa.array(values, type=pa.string()))


def rank_table(a: RankArrays, meta: RunMeta) -> pa.Table:
    """The Arrow table :func:`~bubblecast.telemetry.io.to_table` builds for the same rows
    (same column order, types, nullability, dictionaries and run metadata)."""
    n = len(a)
    arrays: dict[str, pa.Array] = {
        "run_id": _dictionary(np.zeros(n, np.int8), [a.run_id]),
        "step": pa.array(a.step, type=pa.int64()),
        "rank": pa.array(np.full(n, a.rank, np.int32), type=pa.int32()),
        "stage": pa.array(np.full(n, a.stage, np.int32), type=pa.int32()),
        "replica": pa.array(np.full(n, a.replica, np.int32), type=pa.int32()),
        "chunk": pa.array(a.chunk, type=pa.int32()),
        "microbatch": pa.array(a.microbatch, type=pa.int32()),
        "op": _dictionary(a.op, list(OPS)),
        "start_s": pa.array(a.start_s, type=pa.float64()),
        "duration_s": pa.array(a.duration_s, type=pa.float64()),
    }
    if a.layers is not None:
        arrays["layers"] = pa.array(a.layers, type=OPTIONAL["layers"])
    if a.tokens is not None:
        unknown = a.tokens < 0
        arrays["tokens"] = pa.array(np.maximum(a.tokens, 0), type=OPTIONAL["tokens"],
                                    mask=unknown if unknown.any() else None)
    for col in ("host", "device"):
        value = getattr(a, col)
        if value is not None:
            arrays[col] = pa.array([value] * n, type=pa.string())
    fields = [pa.field(name, arr.type, nullable=name not in REQUIRED)
              for name, arr in arrays.items()]
    schema = pa.schema(fields, metadata={METADATA_KEY: encode_metadata({a.run_id: meta})})
    return pa.Table.from_arrays(list(arrays.values()), schema=schema)


def write_rank_arrays(a: RankArrays, meta: RunMeta, path: str | os.PathLike[str]) -> Path:
    """Check ``a`` (:func:`check_rank_arrays`) and write it to one Parquet file atomically,
    with ``meta`` as its run metadata and the events Parquet settings
    (:func:`~bubblecast.telemetry.io.parquet_options`); a refused part leaves no file."""
    check_rank_arrays(a, meta, str(path))
    table = rank_table(a, meta)
    options = parquet_options(table)
    return atomic_write(path, lambda tmp: pq.write_table(table, tmp, **options))


__all__ = ["ARRAY_DTYPES", "RankArrays", "check_rank_arrays", "rank_table",
           "write_rank_arrays"]
