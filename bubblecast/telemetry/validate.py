"""Validation of an events table against SPEC §1.

A bad table is refused whole with one :class:`SchemaError` naming the source, the column, the
first offending row and the problem. The row checks are the table of
:mod:`bubblecast.telemetry.row_rules`, which the recorder's fast writer applies too (same
order, same messages). Every check is one vectorised pass over a column that only looks for
the offending row when the pass fails, so a valid table of 2.5M rows takes tens of
milliseconds; no check copies a column that already has its SPEC dtype.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from bubblecast.errors import BubblecastError
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
    OPS,
    OPTIONAL,
    REQUIRED,
    UNIQUE_KEY,
    RunMeta,
)

_INT_DTYPES = {"step": "int64", "rank": "int32", "stage": "int32", "replica": "int32",
               "chunk": "int32", "microbatch": "int32"}  # fmt: skip
#: Optional integer columns (nullable: pandas' Int32/Int64 when they hold nulls).
_OPT_INT = {c: str(t) for c, t in OPTIONAL.items() if pa.types.is_integer(t)}
_OPT_FLOAT = tuple(c for c, t in OPTIONAL.items() if pa.types.is_floating(t))
_N_COMPUTE = len(COMPUTE_OPS)
assert OPS[:_N_COMPUTE] == COMPUTE_OPS  # compute ops are the first op codes


class SchemaError(BubblecastError):
    """An events table that breaks the schema."""

    def __init__(self, source: str, column: str, row: int | None, problem: str) -> None:
        self.source, self.column, self.row, self.problem = source, column, row, problem
        where = f"column '{column}'" + (f", row {row}" if row is not None else "")
        super().__init__(f"{source}: {where}: {problem}")


def _raise(found: Violation | None, source: str) -> None:
    if found is not None:
        raise SchemaError(source, found.column, found.row, found.problem)


def _is_stringlike(dtype: object) -> bool:
    return isinstance(dtype, pd.CategoricalDtype) or pd.api.types.is_object_dtype(dtype) \
        or pd.api.types.is_string_dtype(dtype)


def _is_number(series: pd.Series) -> bool:
    """A numeric, non-boolean column, or one holding nothing but nulls."""
    dtype = series.dtype
    if pd.api.types.is_bool_dtype(dtype):
        return False
    if pd.api.types.is_numeric_dtype(dtype):
        return True
    return pd.api.types.is_object_dtype(dtype) and bool(series.isna().all())


def normalize_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """Cast already-valid columns to their in-memory dtypes (categoricals for run_id and op).

    A column that already has its dtype is kept as is (no copy)."""
    out = _restore_optional_ints(frame.copy(deep=False))
    if not isinstance(out["run_id"].dtype, pd.CategoricalDtype):
        out["run_id"] = out["run_id"].astype(str).astype("category")
    if isinstance(out["op"].dtype, pd.CategoricalDtype):  # remap codes, never touch strings
        if tuple(out["op"].cat.categories) != OPS:
            out["op"] = out["op"].cat.set_categories(list(OPS))
    else:
        out["op"] = pd.Categorical(out["op"].astype(str), categories=list(OPS))
    for col, dtype in {**_INT_DTYPES, "start_s": "float64", "duration_s": "float64"}.items():
        if out[col].dtype != dtype:
            out[col] = out[col].astype(dtype)
    for col in _OPT_FLOAT:
        if col in out.columns and out[col].dtype != "float64":
            out[col] = out[col].astype("float64")
    return out


def _check_column_types(frame: pd.DataFrame, source: str) -> None:
    """Dtypes only (no pass over the values, except missing run ids and ops)."""
    for col in REQUIRED:
        if col not in frame.columns:
            raise SchemaError(source, col, None, "missing required column")
        series = frame[col]
        if col in ("run_id", "op"):
            if not _is_stringlike(series.dtype):
                raise SchemaError(source, col, None, f"expected string, got {series.dtype}")
            codes = series.cat.codes.to_numpy() if isinstance(series.dtype, pd.CategoricalDtype) \
                else None
            bad = codes < 0 if codes is not None else series.isna().to_numpy()
            if bad.any():
                raise SchemaError(source, col, first(bad), "missing value")
        elif col in _INT_DTYPES:
            if not pd.api.types.is_integer_dtype(series.dtype):
                raise SchemaError(source, col, None, f"expected integer, got {series.dtype}")
        elif not pd.api.types.is_float_dtype(series.dtype):
            raise SchemaError(source, col, None, f"expected float, got {series.dtype}")
    for col in _OPT_INT:
        if col in frame.columns and not pd.api.types.is_integer_dtype(frame[col].dtype):
            raise SchemaError(source, col, None, f"expected integer, got {frame[col].dtype}")
    for col in _OPT_FLOAT:
        if col in frame.columns and not _is_number(frame[col]):
            raise SchemaError(source, col, None, f"expected float, got {frame[col].dtype}")


def _restore_optional_ints(frame: pd.DataFrame) -> pd.DataFrame:
    """An optional integer column with nulls (Parquet, concat) comes back as float64 or object:
    make it a nullable integer again when every present value is whole."""
    for col, dtype in _OPT_INT.items():
        if col not in frame.columns or pd.api.types.is_integer_dtype(frame[col].dtype):
            continue
        kind = pd.api.types.infer_dtype(frame[col], skipna=True)
        if kind not in ("integer", "floating", "mixed-integer-float", "empty"):
            continue  # strings stay strings: refused as mistyped, never parsed
        values = pd.to_numeric(frame[col], errors="coerce")
        present = values.dropna()
        if present.size == frame[col].notna().sum() and (present == present.round()).all():
            frame = frame.assign(**{col: values.astype(dtype.capitalize())})
    return frame


def _check_ops(frame: pd.DataFrame, source: str) -> None:
    """Every op is one of OPS (for a categorical: its categories, then the codes used)."""
    op = frame["op"]
    if isinstance(op.dtype, pd.CategoricalDtype):
        unknown_cat = ~np.isin(np.asarray(op.cat.categories, dtype=object), OPS)
        unknown = unknown_cat[op.cat.codes.to_numpy()] if unknown_cat.any() else None
    else:
        unknown = ~op.isin(OPS).to_numpy()
    if unknown is not None and unknown.any():
        row = first(unknown)
        known = ", ".join(OPS)
        raise SchemaError(source, "op", row, f"unknown op {op.iloc[row]!r} (known: {known})")


def _check_fit(frame: pd.DataFrame, source: str) -> None:
    """Integer columns about to be narrowed (int64 -> int32) hold values that fit."""
    for col, dtype in _INT_DTYPES.items():
        values = frame[col].to_numpy()
        info = np.iinfo(np.dtype(dtype))
        if values.dtype == dtype or values.dtype.kind not in "iu" or not values.size:
            continue
        if values.min() < info.min or values.max() > info.max:
            row = first((values < info.min) | (values > info.max))
            raise SchemaError(source, col, row, f"value {values[row]} does not fit {dtype}")


def _column(frame: pd.DataFrame, col: str) -> Column | None:
    """A column as the row rules see it: numpy values (no copy when it has no nulls) and its
    null mask (nullable integers: nulls read as 0; floats keep NaN, a null to the rules)."""
    if col not in frame.columns:
        return None
    series = frame[col]
    if isinstance(series.dtype, pd.api.extensions.ExtensionDtype) and \
            pd.api.types.is_integer_dtype(series.dtype):
        null = series.isna().to_numpy()
        values = series.to_numpy(dtype=series.dtype.numpy_dtype, na_value=0)
        return values, null if null.any() else None
    return series.to_numpy(), None


def _infer_runs(frame: pd.DataFrame, runs: dict[str, RunMeta]) -> None:
    """Add inferred metadata (``source="inferred"``) for runs that have none."""
    for run_id in frame["run_id"].cat.categories:
        if str(run_id) not in runs:
            part = frame.loc[frame["run_id"] == run_id]
            if part.empty:
                continue
            runs[str(run_id)] = RunMeta(
                stages=int(part["stage"].max()) + 1,
                microbatches=max(int(part["microbatch"].max()) + 1, 1),
                chunks=int(part["chunk"].max()) + 1,
                replicas=int(part["replica"].max()) + 1,
                source="inferred",
            )


def _check_ranges(frame: pd.DataFrame, runs: dict[str, RunMeta], source: str) -> None:
    """stage, microbatch, chunk and replica below their run's metadata."""
    run_cat = frame["run_id"].cat
    categories = [str(c) for c in run_cat.categories]
    codes = run_cat.codes.to_numpy()
    for col, attr in RANGE_RULES:
        limits = np.array([getattr(runs[c], attr) if c in runs else np.iinfo(np.int32).max
                           for c in categories], dtype=np.int64)
        values = frame[col].to_numpy()
        if values.size == 0 or values.max() < limits.min(initial=np.iinfo(np.int64).max):
            continue  # fast path: below every run's limit, no per-row limits needed
        _raise(out_of_range(col, attr, values, limits[codes],
                            lambda row: categories[codes[row]]), source)


def prepare_frame(frame: pd.DataFrame, runs: dict[str, RunMeta], source: str) -> pd.DataFrame:
    """The checks that need no pass over the rows (columns, dtypes, op names, narrowing), then
    the frame normalised (SPEC dtypes, categoricals); infer metadata of runs without it.

    :func:`check_rows` completes the validation; ``write_events`` runs it while the
    prepared frame is being written."""
    if not isinstance(frame.index, pd.RangeIndex) or frame.index.start != 0 \
            or frame.index.step != 1:
        frame = frame.reset_index(drop=True)
    frame = _restore_optional_ints(frame)
    _check_column_types(frame, source)
    _check_ops(frame, source)
    _check_fit(frame, source)
    frame = normalize_frame(frame)
    for col, dtype in _OPT_INT.items():
        if col in frame.columns:
            values = frame[col]
            wanted = dtype.capitalize() if values.isna().any() else dtype
            if values.dtype != wanted:
                frame[col] = values.astype(wanted)
    _infer_runs(frame, runs)
    return frame


def check_rows(frame: pd.DataFrame, runs: dict[str, RunMeta], source: str) -> None:
    """The row checks of SPEC §1 on a frame from :func:`prepare_frame`, as
    :mod:`~bubblecast.telemetry.row_rules` orders them: the row rules (finite times,
    non-negative durations and counts, lower bounds), ranges from the run metadata, unique
    compute ops."""
    _raise(check_row_rules(lambda col: _column(frame, col)), source)
    _check_ranges(frame, runs, source)
    _check_duplicates(frame, source)


def validate_frame(frame: pd.DataFrame, runs: dict[str, RunMeta], source: str) -> pd.DataFrame:
    """Check ``frame`` against SPEC §1 and the run metadata; return it normalised.

    Runs that have no metadata get it inferred from the data (``source="inferred"``) and are
    added to ``runs`` in place.
    """
    frame = prepare_frame(frame, runs, source)
    check_rows(frame, runs, source)
    return frame


def _check_duplicates(frame: pd.DataFrame, source: str) -> None:
    codes = frame["op"].cat.codes.to_numpy()  # normalised: categories are OPS
    is_compute = codes < _N_COMPUTE
    rows = None if bool(is_compute.all()) else np.flatnonzero(is_compute)
    keys = []
    for col in UNIQUE_KEY:
        series = frame[col]
        values = series.cat.codes.to_numpy() if isinstance(series.dtype, pd.CategoricalDtype) \
            else series.to_numpy()
        keys.append(values if rows is None else values[rows])
    at = first_duplicate(keys)
    if at is not None:
        row = at if rows is None else int(rows[at])
        key = {c: frame[c].iloc[row] for c in UNIQUE_KEY}
        raise SchemaError(source, "op", row, duplicate_problem(key))


__all__ = ["OPTIONAL", "SchemaError", "check_rows", "normalize_frame", "prepare_frame",
           "validate_frame"]
