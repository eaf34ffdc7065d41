"""Write one rank's events straight from numpy arrays: no pandas, one vectorised check pass.

The runtime recorder writes a part every few seconds from rows it built itself (known dtypes,
one run, one rank). Going through a DataFrame, :func:`~bubblecast.telemetry.from_frame` and
:func:`~bubblecast.telemetry.write_events` costs mostly fixed pandas overhead per part (frame
construction, per-column dtype dispatch, categorical conversion), taken from the training ranks
on a small machine. :func:`write_rank_arrays` checks dtypes and op codes, then the SPEC §1 row
rules of :mod:`bubblecast.telemetry.row_rules` (the table :mod:`~bubblecast.telemetry.validate`
applies too: same order, same messages) with a few numpy passes, and builds the Arrow table
directly (``run_id`` and ``op`` as dictionary arrays from codes): the file is byte for byte the
one the DataFrame path writes, atomically. Files a user hands to bubblecast are still validated
by :func:`~bubblecast.telemetry.read_events` in full."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bubblecast.telemetry.io import atomic_write, parquet_options
from bubblecast.telemetry.row_rules import (
    RANGE_RULES,
    Column,
    Violation,
    check_row_rules,
    duplicate_problem,
    first,
    first_duplicate,
    out_of_range,
)
from bubblecast.telemetry.schema import (
    COMPUTE_OPS,
    METADATA_KEY,
    OPS,
    OPTIONAL,
    REQUIRED,
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
    "tokens_sq": np.dtype(np.float64), "documents": np.dtype(np.int32),
}  # fmt: skip
#: The optional array columns (None: absent), in the order they are written.
OPTIONAL_ARRAYS: tuple[str, ...] = ("layers", "tokens", "tokens_sq", "documents")
_SCALARS = ("rank", "stage", "replica")  # one value for every row
_INT32 = np.iinfo(np.int32)


@dataclass(frozen=True)
class RankArrays:
    """Events of one run on one rank, stage and replica, as arrays with SPEC dtypes.

    ``op`` holds codes into :data:`~bubblecast.telemetry.schema.OPS`; ``layers``, ``tokens``,
    ``tokens_sq``, ``documents``, ``host`` and ``device`` are optional columns (None:
    absent). ``nulls`` maps an optional array column to a boolean mask of its null (unknown)
    rows; the values under it are ignored (written as null). A NaN ``tokens_sq`` is a null
    too, as in a DataFrame."""

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
    tokens_sq: np.ndarray | None = None
    documents: np.ndarray | None = None
    nulls: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.step.shape[0])

    def column(self, name: str) -> Column | None:
        """Column ``name`` as the row rules see it (values, null mask); a scalar column as one
        value (row 0 stands for every row); None when absent."""
        if name in _SCALARS:
            return np.array([getattr(self, name)], dtype=np.int64), None
        values = getattr(self, name, None)
        return None if values is None else (values, self.nulls.get(name))


def _check_types(a: RankArrays, source: str) -> None:
    """Array dtypes and lengths, null masks, scalar columns' types (no pass over the rows)."""
    n = len(a)
    for col, dtype in ARRAY_DTYPES.items():
        values = getattr(a, col)
        if values is None and col in OPTIONAL_ARRAYS:
            continue
        if not isinstance(values, np.ndarray) or values.dtype != dtype or values.ndim != 1:
            got = values.dtype if isinstance(values, np.ndarray) else type(values).__name__
            raise SchemaError(source, col, None, f"expected a 1-d {dtype} array, got {got}")
        if values.shape[0] != n:
            raise SchemaError(source, col, None, f"has {values.shape[0]} rows, step has {n}")
    for col, mask in a.nulls.items():
        if col not in OPTIONAL_ARRAYS or getattr(a, col) is None:
            raise SchemaError(source, col, None, "null mask for a column that is not a present "
                                                 "optional array")
        if not isinstance(mask, np.ndarray) or mask.dtype != bool or mask.shape != (n,):
            raise SchemaError(source, col, None, f"null mask must be a 1-d bool array of {n} "
                                                 f"rows")
    for col in _SCALARS:
        value = getattr(a, col)
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) \
                or not _INT32.min <= value <= _INT32.max:
            raise SchemaError(source, col, None, f"value {value!r} is not an int32")


def _raise(found: Violation | None, source: str) -> None:
    if found is not None:
        raise SchemaError(source, found.column, found.row, found.problem)


def _check_values(a: RankArrays, meta: RunMeta, source: str) -> None:
    """Op codes, then the row rules and the metadata ranges (:mod:`row_rules`)."""
    if not len(a):
        return
    op = a.op
    if op.min() < 0 or op.max() >= len(OPS):
        row = first((op < 0) | (op >= len(OPS)))
        raise SchemaError(source, "op", row, f"unknown op code {op[row]}")
    _raise(check_row_rules(a.column), source)
    for col, attr in RANGE_RULES:
        values = a.column(col)
        assert values is not None
        _raise(out_of_range(col, attr, values[0], getattr(meta, attr), lambda _: a.run_id),
               source)


def _check_duplicates(a: RankArrays, source: str) -> None:
    """Compute ops unique on (step, chunk, microbatch, op); run, rank are one value here."""
    rows = np.flatnonzero(a.op < len(COMPUTE_OPS))
    at = first_duplicate([a.step[rows], a.chunk[rows], a.microbatch[rows], a.op[rows]])
    if at is not None:
        row = int(rows[at])
        key = {"run_id": a.run_id, "step": a.step[row], "rank": a.rank,
               "chunk": a.chunk[row], "microbatch": a.microbatch[row], "op": OPS[a.op[row]]}
        raise SchemaError(source, "op", row, duplicate_problem(key))


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
    for col in OPTIONAL_ARRAYS:
        values = getattr(a, col)
        if values is None:
            continue
        null = a.nulls.get(col)
        if values.dtype.kind == "f":  # NaN is a null, as the DataFrame path writes it
            nan = np.isnan(values)
            null = nan if null is None else null | nan
        if null is not None and null.any():
            values = np.where(null, 0, values).astype(values.dtype)  # no stray values below
        else:
            null = None
        arrays[col] = pa.array(values, type=OPTIONAL[col], mask=null)
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


__all__ = ["ARRAY_DTYPES", "OPTIONAL_ARRAYS", "RankArrays", "check_rank_arrays", "rank_table",
           "write_rank_arrays"]
