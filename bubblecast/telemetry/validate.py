"""Validation of an events table against SPEC §1.

A bad table is refused whole with one :class:`SchemaError` naming the source, the column, the
first offending row and the problem. Every check is one vectorised pass over a column that
only looks for the offending row when the pass fails, so a valid table of 2.5M rows takes
tens of milliseconds; no check copies a column that already has its SPEC dtype.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from bubblecast.errors import BubblecastError
from bubblecast.telemetry.schema import (
    COMPUTE_OPS,
    MINIMUM,
    OPS,
    OPTIONAL,
    REQUIRED,
    UNIQUE_KEY,
    RunMeta,
)

_INT_DTYPES = {"step": "int64", "rank": "int32", "stage": "int32", "replica": "int32",
               "chunk": "int32", "microbatch": "int32"}  # fmt: skip
_OPT_INT = {"layers": "int32", "tokens": "int64"}
_OPT_FLOAT = tuple(c for c, t in OPTIONAL.items() if pa.types.is_floating(t))
_N_COMPUTE = len(COMPUTE_OPS)
assert OPS[:_N_COMPUTE] == COMPUTE_OPS  # compute ops are the first op codes


class SchemaError(BubblecastError):
    """An events table that breaks the schema."""

    def __init__(self, source: str, column: str, row: int | None, problem: str) -> None:
        self.source, self.column, self.row, self.problem = source, column, row, problem
        where = f"column '{column}'" + (f", row {row}" if row is not None else "")
        super().__init__(f"{source}: {where}: {problem}")


def _first(mask: np.ndarray) -> int | None:
    idx = np.flatnonzero(mask)
    return int(idx[0]) if idx.size else None


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
                raise SchemaError(source, col, _first(bad), "missing value")
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
        row = _first(unknown)
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
            row = _first((values < info.min) | (values > info.max))
            raise SchemaError(source, col, row, f"value {values[row]} does not fit {dtype}")


def _check_values(frame: pd.DataFrame, source: str) -> None:
    """Finite times, non-negative durations, integer lower bounds (one pass per column)."""
    for col in ("start_s", "duration_s"):
        values = frame[col].to_numpy(dtype=np.float64)
        if not np.isfinite(values.sum()):  # one pass: NaN or inf anywhere makes the sum so
            bad = ~np.isfinite(values)
            if bad.any():
                row = _first(bad)
                raise SchemaError(source, col, row, f"value {values[row]} is not finite")
    dur = frame["duration_s"].to_numpy(dtype=np.float64)
    if dur.size and dur.min() < 0:
        row = _first(dur < 0)
        raise SchemaError(source, "duration_s", row, f"negative duration {dur[row]}")
    for col, low in MINIMUM.items():
        values = frame[col].to_numpy()
        if values.size and values.min() < low:
            row = _first(values < low)
            raise SchemaError(source, col, row, f"value {values[row]} is below {low}")


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
    for col, attr in (("stage", "stages"), ("microbatch", "microbatches"), ("chunk", "chunks"),
                      ("replica", "replicas")):
        values = frame[col].to_numpy()
        limits = np.array([getattr(runs[c], attr) if c in runs else np.iinfo(np.int32).max
                           for c in categories], dtype=np.int64)
        if values.size == 0 or values.max() < limits.min(initial=np.iinfo(np.int64).max):
            continue  # fast path: below every run's limit, no per-row limits needed
        limit = limits[codes]
        bad = values >= limit
        if bad.any():
            row = _first(bad)
            raise SchemaError(source, col, row,
                              f"value {values[row]} out of range for run "
                              f"'{categories[codes[row]]}' ({attr}={limit[row]})")


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
    """The row checks of SPEC §1 on a frame from :func:`prepare_frame`: finite times,
    non-negative durations and counts, ranges from the run metadata, unique compute ops."""
    _check_values(frame, source)
    _check_ranges(frame, runs, source)
    _check_duplicates(frame, source)
    for col in _OPT_INT:
        if col in frame.columns:
            low = frame[col].min()
            if low is not pd.NA and low < 0:
                row = _first((frame[col] < 0).fillna(False).to_numpy())
                raise SchemaError(source, col, row, f"negative value {frame[col].iloc[row]}")


def validate_frame(frame: pd.DataFrame, runs: dict[str, RunMeta], source: str) -> pd.DataFrame:
    """Check ``frame`` against SPEC §1 and the run metadata; return it normalised.

    Runs that have no metadata get it inferred from the data (``source="inferred"``) and are
    added to ``runs`` in place.
    """
    frame = prepare_frame(frame, runs, source)
    check_rows(frame, runs, source)
    return frame


def _packed_keys(frame: pd.DataFrame, rows: np.ndarray | None) -> np.ndarray | None:
    """The UNIQUE_KEY of each row (of ``rows``, or all) packed into one int64 from 0 up (a
    mixed-radix number over each key's value range), or None when that needs over 63 bits."""
    keys, lows, spans = [], [], []
    for col in UNIQUE_KEY:
        series = frame[col]
        values = series.cat.codes.to_numpy() if isinstance(series.dtype, pd.CategoricalDtype) \
            else series.to_numpy()
        values = values if rows is None else values[rows]
        low, high = (int(values.min()), int(values.max())) if values.size else (0, 0)
        if high > low:  # a constant key adds nothing
            keys.append(values)
            lows.append(low)
            spans.append(high - low + 1)
    if sum(int(s - 1).bit_length() for s in spans) > 63:
        return None
    n = frame.shape[0] if rows is None else rows.size
    packed = np.zeros(n, dtype=np.int64)
    offset = 0
    for k, low, span in zip(keys, lows, spans, strict=True):
        packed *= span  # in place: no temporary per key
        packed += k
        offset = offset * span + low
    packed -= offset
    return packed


def _check_duplicates(frame: pd.DataFrame, source: str) -> None:
    codes = frame["op"].cat.codes.to_numpy()  # normalised: categories are OPS
    is_compute = codes < _N_COMPUTE
    everything = bool(is_compute.all())
    rows = None if everything else np.flatnonzero(is_compute)
    if not codes.size or (rows is not None and not rows.size):
        return
    packed = _packed_keys(frame, rows)
    n = frame.shape[0] if rows is None else rows.size
    dup_at: np.ndarray | None = None  # positions (into the compute rows) of later duplicates
    if packed is not None and int(packed.max(initial=0)) < 4 * n + 4096:
        # Dense key space (always, for simulated and recorded runs): count, O(n), no sort.
        counts = np.bincount(packed)
        if counts.max() > 1:
            cand = np.flatnonzero(counts[packed] > 1)
            _, first = np.unique(packed[cand], return_index=True)
            dup_at = np.setdiff1d(cand, cand[first])
    else:
        if packed is not None:
            order = np.argsort(packed, kind="stable")
            same = packed[order][1:] == packed[order][:-1]
        else:
            keys = [frame[c].cat.codes.to_numpy() if c in ("run_id", "op")
                    else frame[c].to_numpy() for c in UNIQUE_KEY]
            keys = [k if rows is None else k[rows] for k in keys]
            order = np.lexsort(keys[::-1])
            sorted_keys = np.stack([k[order] for k in keys])
            same = np.all(sorted_keys[:, 1:] == sorted_keys[:, :-1], axis=0)
        if same.any():
            # a stable sort keeps equal rows in order: the later of two equal rows is the dup
            dup_at = order[1:][same]
    if dup_at is not None and dup_at.size:
        row = int(dup_at.min()) if rows is None else int(rows[dup_at].min())
        key = ", ".join(f"{c}={frame[c].iloc[row]}" for c in UNIQUE_KEY)
        raise SchemaError(source, "op", row, f"duplicate compute op ({key})")


__all__ = ["OPTIONAL", "SchemaError", "check_rows", "normalize_frame", "prepare_frame",
           "validate_frame"]
