"""Write events straight from numpy arrays: no pandas, one vectorised check pass.

Two writers of events build their rows themselves, with known dtypes, and need no DataFrame:

- the runtime recorder writes a part every few seconds (one run, one rank:
  :class:`RankArrays`, :func:`write_rank_arrays`). Going through a DataFrame,
  :func:`~bubblecast.telemetry.from_frame` and :func:`~bubblecast.telemetry.write_events`
  costs mostly fixed pandas overhead per part (frame construction, per-column dtype dispatch,
  categorical conversion), taken from the training ranks on a small machine;
- ``bubblecast simulate`` writes the events of any runs (:class:`EventArrays`,
  :func:`write_event_arrays`) without importing pandas at all (~0.15 s of a command that
  takes a few tenths).

Both check dtypes and codes, then the SPEC §1 row rules of
:mod:`bubblecast.telemetry.row_rules` (the table :mod:`~bubblecast.telemetry.validate` applies
too: same order, same messages), metadata ranges and unique compute ops with a few numpy
passes, and build the Arrow table directly (``run_id`` and ``op`` as dictionary arrays from
codes): the file is byte for byte the one the DataFrame path writes, atomically, with the
events Parquet settings of :mod:`bubblecast.telemetry.parquet_write`. Files a user hands to
bubblecast are still validated by :func:`~bubblecast.telemetry.read_events` in full.
:class:`~bubblecast.telemetry.validate.SchemaError` is imported only to raise one (its module
loads pandas)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bubblecast.telemetry.parquet_write import (
    ROW_GROUP_ROWS,
    WRITE_BATCH_ROWS,
    atomic_write,
    parquet_options,
)
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
    UNIQUE_KEY,
    RunMeta,
    encode_metadata,
)

if TYPE_CHECKING:
    import pandas as pd

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


def _schema_error(source: str, column: str, row: int | None, problem: str) -> SchemaError:
    """:class:`~bubblecast.telemetry.validate.SchemaError`, imported on this error path alone
    (its module loads pandas)."""
    from bubblecast.telemetry.validate import SchemaError

    return SchemaError(source, column, row, problem)


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
            raise _schema_error(source, col, None, f"expected a 1-d {dtype} array, got {got}")
        if values.shape[0] != n:
            raise _schema_error(source, col, None, f"has {values.shape[0]} rows, step has {n}")
    for col, mask in a.nulls.items():
        if col not in OPTIONAL_ARRAYS or getattr(a, col) is None:
            raise _schema_error(source, col, None, "null mask for a column that is not a present "
                                                 "optional array")
        if not isinstance(mask, np.ndarray) or mask.dtype != bool or mask.shape != (n,):
            raise _schema_error(source, col, None, f"null mask must be a 1-d bool array of {n} "
                                                 f"rows")
    for col in _SCALARS:
        value = getattr(a, col)
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) \
                or not _INT32.min <= value <= _INT32.max:
            raise _schema_error(source, col, None, f"value {value!r} is not an int32")


def _raise(found: Violation | None, source: str) -> None:
    if found is not None:
        raise _schema_error(source, found.column, found.row, found.problem)


def _check_values(a: RankArrays, meta: RunMeta, source: str) -> None:
    """Op codes, then the row rules and the metadata ranges (:mod:`row_rules`)."""
    if not len(a):
        return
    op = a.op
    if op.min() < 0 or op.max() >= len(OPS):
        row = first((op < 0) | (op >= len(OPS)))
        raise _schema_error(source, "op", row, f"unknown op code {op[row]}")
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
        raise _schema_error(source, "op", row, duplicate_problem(key))


def check_rank_arrays(a: RankArrays, meta: RunMeta, source: str) -> None:
    """The SPEC §1 checks of :func:`~bubblecast.telemetry.validate.validate_frame` for one
    rank's arrays; raises :class:`SchemaError` naming the column and the first bad row."""
    _check_types(a, source)
    _check_values(a, meta, source)
    _check_duplicates(a, source)


def numpy_array(values: np.ndarray, typ: pa.DataType | None = None,
                null: np.ndarray | None = None) -> pa.Array:
    """A 1-d numeric array as an Arrow array sharing its memory (``typ``: its Arrow type,
    None for the numpy dtype's), null where ``null`` is True: what ``pa.array(values,
    type=typ, mask=null)`` gives, built from buffers because ``pa.array`` asks whether its
    input is a pandas object first, which imports pandas (~0.15 s)."""
    values = np.ascontiguousarray(values)
    typ = pa.from_numpy_dtype(values.dtype) if typ is None else typ
    kind = ("f" if pa.types.is_floating(typ) else "i" if pa.types.is_signed_integer(typ)
            else "u" if pa.types.is_unsigned_integer(typ) else None)
    if kind != values.dtype.kind or typ.bit_width != 8 * values.dtype.itemsize:
        raise TypeError(f"numpy_array: {values.dtype} values are not {typ}")
    validity, nulls = None, 0
    if null is not None:
        nulls = int(np.count_nonzero(null))
        if nulls:
            validity = pa.py_buffer(np.packbits(~null, bitorder="little"))
    return pa.Array.from_buffers(typ, len(values), [validity, pa.py_buffer(values)],
                                 null_count=nulls)


def string_array(values: list[str]) -> pa.StringArray:
    """Strings as an Arrow ``string`` array (built from buffers, see :func:`numpy_array`)."""
    encoded = [v.encode() for v in values]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int32)
    np.cumsum([len(b) for b in encoded], out=offsets[1:])
    return pa.Array.from_buffers(pa.string(), len(encoded),
                                 [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))])


def _dictionary(codes: np.ndarray, values: list[str]) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(numpy_array(codes), string_array(values))


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


# -- events of any runs -----------------------------------------------------------------------
def code_dtype(categories: int) -> np.dtype:
    """The integer type of codes into ``categories`` values: pandas' choice for a categorical
    (int8 below 127 values, then int16, int32), so that a dictionary column gets the Arrow
    index type (part of the file's stored schema) the DataFrame path writes."""
    for dtype in (np.int8, np.int16, np.int32):
        if categories < np.iinfo(dtype).max:
            return np.dtype(dtype)
    return np.dtype(np.int64)


#: The numpy dtype of each numeric SPEC column (required and known optional ones).
#: (Not ``DataType.to_pandas_dtype``: that imports pandas.)
SPEC_DTYPES: dict[str, np.dtype] = {
    name: np.dtype(f"{'i' if pa.types.is_integer(typ) else 'f'}{typ.bit_width // 8}")
    for name, typ in {**REQUIRED, **OPTIONAL}.items()
    if pa.types.is_signed_integer(typ) or pa.types.is_floating(typ)
}  # fmt: skip


@dataclass(frozen=True)
class Periodic:
    """A column whose row ``i`` holds ``pattern[i % len(pattern)]``, over ``rows`` rows: what
    repeats every step of a schedule (rank, stage, micro-batch, op...), held once. Written as
    slices of one small buffer, checked on one period (its first rows hold every value)."""

    pattern: np.ndarray
    rows: int

    @property
    def dtype(self) -> np.dtype:
        return self.pattern.dtype

    @property
    def period(self) -> int:
        return int(self.pattern.shape[0])

    def head(self, rows: int) -> np.ndarray:
        """The column's first ``rows`` rows (at most :attr:`rows`), a new array."""
        rows = min(rows, self.rows)
        reps = -(-rows // max(self.period, 1))
        return np.broadcast_to(self.pattern, (reps, self.period)).reshape(-1)[:rows]

    def full(self) -> np.ndarray:
        return self.head(self.rows)


#: A column of :class:`EventArrays`: one value per row, or a :class:`Periodic` one.
Values = np.ndarray | Periodic


def _full(values: Values) -> np.ndarray:
    return values.full() if isinstance(values, Periodic) else values


def _rows(values: Values) -> np.ndarray:
    """Every distinct value of a column in its first rows: one period of a periodic column."""
    return values.head(values.period) if isinstance(values, Periodic) else values


@dataclass(frozen=True)
class EventArrays:
    """Events of any runs as numpy columns: what a frame with these columns holds, without
    pandas.

    ``columns`` maps each column to its values, one per row (or :class:`Periodic`):
    ``run_id`` as codes into ``runs`` (its keys, in order), ``op`` as codes into
    :data:`~bubblecast.telemetry.schema.OPS`, every SPEC column with its SPEC dtype
    (:data:`SPEC_DTYPES`), an extra column with any numeric dtype. The table puts the
    required columns first, the others in ``columns``' order. ``nulls`` maps an optional
    integer column (an array) to its null rows (values under them are ignored): such a column
    is a pandas nullable integer in :meth:`to_frame`, even when the mask holds no null; a
    float optional column's NaN is a null."""

    columns: dict[str, Values]
    runs: dict[str, RunMeta]
    nulls: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        step = self.columns["step"]
        return step.rows if isinstance(step, Periodic) else int(step.shape[0])

    def column(self, name: str) -> Column | None:
        """Column ``name`` as the row rules see it (values, null mask); None when absent. A
        periodic column's first period: its first bad row is the column's."""
        values = self.columns.get(name)
        return None if values is None else (_rows(values), self.nulls.get(name))

    def to_frame(self) -> pd.DataFrame:
        """The same rows as a pandas frame (imports pandas): ``run_id`` and ``op``
        categorical (categories ``runs`` and OPS), columns under ``nulls`` nullable
        integers, the others the arrays themselves (no copy; periodic ones expanded)."""
        import pandas as pd

        data: dict[str, Any] = {}
        for name, values in self.columns.items():
            values = _full(values)
            if name in ("run_id", "op"):
                data[name] = pd.Categorical.from_codes(
                    values, categories=list(self.runs) if name == "run_id" else list(OPS))
            elif name in self.nulls:
                data[name] = pd.arrays.IntegerArray(values, self.nulls[name])
            else:
                data[name] = values
        return pd.DataFrame(data, copy=False)


def _check_event_types(a: EventArrays, source: str) -> None:
    """Columns present, dtypes, lengths, null masks and codes (the checks
    :func:`~bubblecast.telemetry.validate.prepare_frame` makes of a frame)."""
    for col in REQUIRED:
        if col not in a.columns:
            raise _schema_error(source, col, None, "missing required column")
    n = len(a)
    for col, values in a.columns.items():
        periodic = isinstance(values, Periodic)
        array = values.pattern if periodic else values
        if not isinstance(array, np.ndarray) or array.ndim != 1 or (periodic and not array.size):
            raise _schema_error(source, col, None, f"expected a 1-d array, got "
                                                   f"{type(array).__name__}")
        rows = values.rows if isinstance(values, Periodic) else array.shape[0]
        if rows != n:
            raise _schema_error(source, col, None, f"has {rows} rows, step has {n}")
        want = SPEC_DTYPES.get(col)
        if col in ("run_id", "op"):
            if array.dtype.kind not in "iu":
                raise _schema_error(source, col, None, f"expected integer codes, got "
                                                       f"{array.dtype}")
            values = _rows(values)
            limit = len(a.runs) if col == "run_id" else len(OPS)
            if n and (values.min() < 0 or values.max() >= limit):
                row = first((values < 0) | (values >= limit))
                raise _schema_error(source, col, row, f"code {values[row]} outside the "
                                                      f"{limit} {col} values")
        elif (want is not None and array.dtype != want) or array.dtype.kind not in "iuf":
            raise _schema_error(source, col, None, f"expected {want or 'a number'}, got "
                                                   f"{array.dtype}")
    for col, mask in a.nulls.items():
        values = a.columns.get(col)
        if col in REQUIRED or not isinstance(values, np.ndarray) or values.dtype.kind not in "iu":
            raise _schema_error(source, col, None, "null mask for a column that is not a "
                                                   "present optional integer array")
        if not isinstance(mask, np.ndarray) or mask.dtype != bool or mask.shape != (n,):
            raise _schema_error(source, col, None, f"null mask must be a 1-d bool array of "
                                                   f"{n} rows")


def check_event_rows(a: EventArrays, source: str) -> None:
    """The row checks of :func:`~bubblecast.telemetry.validate.check_rows`, in its order: the
    row rules, ranges from each row's run metadata, unique compute ops."""
    if not len(a):
        return
    _raise(check_row_rules(a.column), source)
    names = list(a.runs)
    for col, attr in RANGE_RULES:
        limits = np.array([getattr(meta, attr) for meta in a.runs.values()], dtype=np.int64)
        if _rows(a.columns[col]).max() < limits.min(initial=_INT32.max):
            continue  # below every run's limit: no per-row limits needed
        codes = _full(a.columns["run_id"])
        _raise(out_of_range(col, attr, _full(a.columns[col]), limits[codes],
                            lambda row, codes=codes: names[codes[row]]), source)
    row = _first_duplicate_row(a)
    if row is not None:
        key = {c: _at(a.columns[c], row) for c in UNIQUE_KEY}
        key["run_id"], key["op"] = names[key["run_id"]], OPS[key["op"]]
        raise _schema_error(source, "op", row, duplicate_problem(key))


def _at(values: Values, row: int) -> Any:
    return values.pattern[row % values.period] if isinstance(values, Periodic) else values[row]


def _first_duplicate_row(a: EventArrays) -> int | None:
    """The first compute row whose :data:`UNIQUE_KEY` an earlier compute row has
    (:func:`~bubblecast.telemetry.row_rules.first_duplicate`'s answer over the compute rows)."""
    found = _block_duplicate_row(a)
    if found is not NotImplemented:
        return found
    op = _full(a.columns["op"])
    compute = op < len(COMPUTE_OPS)
    rows = None if bool(compute.all()) else np.flatnonzero(compute)
    keys = [_full(a.columns[c]) for c in UNIQUE_KEY]
    at = first_duplicate(keys if rows is None else [k[rows] for k in keys])
    return at if at is None or rows is None else int(rows[at])


def _block_duplicate_row(a: EventArrays) -> Any:
    """:func:`_first_duplicate_row` of a table in blocks: ``rank``, ``chunk``, ``microbatch``
    and ``op`` periodic with one period, ``run_id`` and ``step`` constant over each period
    (a simulation's steps). A row repeats an earlier one's key either within its block (then
    within the pattern, first seen in block 0) or because two blocks share (run, step) (then
    first at the later block's first compute row). NotImplemented for other tables."""
    cols = [a.columns[c] for c in ("rank", "chunk", "microbatch", "op")]
    n = len(a)
    if not all(isinstance(c, Periodic) for c in cols):
        return NotImplemented
    p = cols[0].period
    if any(c.period != p for c in cols) or n % p:
        return NotImplemented
    blocks = [_full(a.columns[c]).reshape(n // p, p) for c in ("run_id", "step")]
    if not all(bool((b == b[:, :1]).all()) for b in blocks):
        return NotImplemented
    compute = np.flatnonzero(cols[3].pattern < len(COMPUTE_OPS))
    if not compute.size:
        return None
    at = first_duplicate([c.pattern[compute] for c in cols])
    if at is not None:
        return int(compute[at])
    block = first_duplicate([b[:, 0] for b in blocks])
    return None if block is None else block * p + int(compute[0])


#: Chunks of a periodic column start at multiples of the write batch, row groups too.
assert ROW_GROUP_ROWS % WRITE_BATCH_ROWS == 0


def _periodic_array(values: Periodic, build: Any) -> pa.ChunkedArray:
    """A periodic column as chunks of :data:`WRITE_BATCH_ROWS` rows, each a slice of one
    buffer of a batch and a period (``build(buffer)`` makes it an Arrow array). The writer
    encodes each chunk in batches from its start, so chunks at multiples of the batch size
    (row groups being multiples of it) give the bytes of one whole array."""
    batch, p = WRITE_BATCH_ROWS, values.period
    buffer = build(values.head(batch + p - 1))
    chunks = [buffer.slice(lo % p, min(values.rows, lo + batch) - lo)
              for lo in range(0, values.rows, batch)]
    return pa.chunked_array(chunks, type=buffer.type)


def _column_array(a: EventArrays, name: str) -> pa.Array | pa.ChunkedArray:
    """Column ``name`` as :func:`~bubblecast.telemetry.io.to_table` makes it of the frame."""
    values = a.columns[name]
    floating = name not in REQUIRED and values.dtype.kind == "f"  # NaN: a null, as in a frame
    if isinstance(values, Periodic) and floating and np.isnan(values.pattern).any():
        values = values.full()  # nulls: written from the whole column
    if name in ("run_id", "op"):
        categories = list(a.runs) if name == "run_id" else list(OPS)

        def build(codes: np.ndarray) -> pa.Array:
            return _dictionary(codes.astype(code_dtype(len(categories)), copy=False),
                               categories)
    else:
        typ = REQUIRED.get(name, OPTIONAL.get(name))
        if typ is not None and pa.types.is_string(typ):
            typ = None  # a number in a string column: kept as the number it is (to_table)

        def build(v: np.ndarray) -> pa.Array:
            null = a.nulls.get(name)  # arrays only (a periodic column has none)
            if floating:
                nan = np.isnan(v)
                null = nan if null is None else null | nan
            return numpy_array(v, typ, null if null is not None and null.any() else None)
    return _periodic_array(values, build) if isinstance(values, Periodic) else build(values)


def event_table(a: EventArrays) -> pa.Table:
    """The Arrow table :func:`~bubblecast.telemetry.io.write_events` writes for the frame
    :meth:`EventArrays.to_frame` (same column order, types, nullability, dictionaries and
    run metadata); numeric columns share the arrays' memory when they have no nulls."""
    names = [*REQUIRED, *(c for c in a.columns if c not in REQUIRED)]
    arrays = [_column_array(a, name) for name in names]
    fields = [pa.field(name, arr.type, nullable=name not in REQUIRED)
              for name, arr in zip(names, arrays, strict=True)]
    schema = pa.schema(fields, metadata={METADATA_KEY: encode_metadata(a.runs)})
    return pa.Table.from_arrays(arrays, schema=schema)


def write_event_arrays(a: EventArrays, path: str | os.PathLike[str]) -> Path:
    """Write ``a`` as :func:`~bubblecast.telemetry.io.write_events` writes its frame: the
    checks that need no pass over the rows first, the row checks (:func:`check_event_rows`)
    while the file is written atomically (a refused table leaves no file). A ``path`` that is
    a directory (or ends with ``/``) is a fleet: the events of one run are appended as
    ``run_id=<id>/part-00000.parquet`` in the fleet's part layout
    (:func:`bubblecast.telemetry.fleet.append_run`; a fleet is written a run at a time)."""
    from bubblecast.telemetry import fleet

    if fleet.is_directory_target(path):
        return fleet.append_run(a, path, lambda one, part: _write_arrays(  # type: ignore
            one, part, fleet_part=True))
    return _write_arrays(a, path)


def _write_arrays(a: EventArrays, path: str | os.PathLike[str], fleet_part: bool = False
                  ) -> Path:
    """:func:`write_event_arrays` of one file; ``fleet_part``: a part being added to the fleet
    two directories up, in the fleet's schema (:func:`bubblecast.telemetry.fleet.part_table`)."""
    source = str(path)
    _check_event_types(a, source)
    table = event_table(a)
    if fleet_part:
        from bubblecast.telemetry import fleet

        table = fleet.part_table(table, fleet.part_schema(Path(path).parent.parent), source)
    options = parquet_options(table)
    return atomic_write(path, lambda tmp: pq.write_table(table, tmp, **options),
                        alongside=lambda: check_event_rows(a, source))


__all__ = ["ARRAY_DTYPES", "OPTIONAL_ARRAYS", "SPEC_DTYPES", "EventArrays", "Periodic",
           "RankArrays", "Values", "check_event_rows", "check_rank_arrays", "code_dtype",
           "event_table", "numpy_array", "rank_table", "string_array", "write_event_arrays",
           "write_rank_arrays"]
