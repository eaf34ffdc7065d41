"""Validation of an events table against SPEC §1.

A bad table is refused whole with one :class:`SchemaError` naming the source, the column, the
first offending row and the problem. Checks are vectorised (numpy), so 10M rows take seconds.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

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


class SchemaError(BubblecastError):
    """An events table that breaks the schema."""

    def __init__(self, source: str, column: str, row: int | None, problem: str) -> None:
        self.source, self.column, self.row, self.problem = source, column, row, problem
        where = f"column '{column}'" + (f", row {row}" if row is not None else "")
        super().__init__(f"{source}: {where}: {problem}")


def _first(mask: np.ndarray) -> int | None:
    idx = np.flatnonzero(mask)
    return int(idx[0]) if idx.size else None


def normalize_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """Cast already-valid columns to their in-memory dtypes (categoricals for run_id and op)."""
    out = _restore_optional_ints(frame.copy(deep=False))
    if not isinstance(out["run_id"].dtype, pd.CategoricalDtype):
        out["run_id"] = out["run_id"].astype(str).astype("category")
    if isinstance(out["op"].dtype, pd.CategoricalDtype):  # remap codes, never touch strings
        out["op"] = out["op"].cat.set_categories(list(OPS))
    else:
        out["op"] = pd.Categorical(out["op"].astype(str), categories=list(OPS))
    for col, dtype in _INT_DTYPES.items():
        out[col] = out[col].astype(dtype)
    for col in ("start_s", "duration_s"):
        out[col] = out[col].astype("float64")
    return out


def _check_column_types(frame: pd.DataFrame, source: str) -> None:
    for col in REQUIRED:
        if col not in frame.columns:
            raise SchemaError(source, col, None, "missing required column")
        series = frame[col]
        if col in ("run_id", "op"):
            ok = isinstance(series.dtype, pd.CategoricalDtype) or pd.api.types.is_string_dtype(
                series.dtype
            ) or series.dtype == object
            if not ok:
                raise SchemaError(source, col, None, f"expected string, got {series.dtype}")
            bad = series.isna().to_numpy()
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


def _restore_optional_ints(frame: pd.DataFrame) -> pd.DataFrame:
    """An optional integer column with nulls (Parquet, concat) comes back as float64 or object:
    make it a nullable integer again when every present value is whole."""
    for col, dtype in _OPT_INT.items():
        if col not in frame.columns or pd.api.types.is_integer_dtype(frame[col].dtype):
            continue
        values = pd.to_numeric(frame[col], errors="coerce")
        present = values.dropna()
        if present.size == frame[col].notna().sum() and (present == present.round()).all():
            frame = frame.assign(**{col: values.astype(dtype.capitalize())})
    return frame


def _meta_array(run_codes: np.ndarray, categories: list[str], runs: dict[str, RunMeta],
                attr: str) -> np.ndarray:
    values = np.array([getattr(runs[c], attr) if c in runs else np.iinfo(np.int32).max
                       for c in categories], dtype=np.int64)
    return values[run_codes]


def validate_frame(frame: pd.DataFrame, runs: dict[str, RunMeta], source: str) -> pd.DataFrame:
    """Check ``frame`` against SPEC §1 and the run metadata; return it normalised.

    Runs that have no metadata get it inferred from the data (``source="inferred"``) and are
    added to ``runs`` in place.
    """
    frame = _restore_optional_ints(frame.reset_index(drop=True))
    _check_column_types(frame, source)
    for col in ("start_s", "duration_s"):
        values = frame[col].to_numpy(dtype=np.float64)
        bad = ~np.isfinite(values)
        if bad.any():
            row = _first(bad)
            raise SchemaError(source, col, row, f"value {values[row]} is not finite")
    dur = frame["duration_s"].to_numpy(dtype=np.float64)
    if (dur < 0).any():
        row = _first(dur < 0)
        raise SchemaError(source, "duration_s", row, f"negative duration {dur[row]}")
    for col, low in MINIMUM.items():
        values = frame[col].to_numpy()
        if (values < low).any():
            row = _first(values < low)
            raise SchemaError(source, col, row, f"value {values[row]} is below {low}")
    op = frame["op"].astype("category")
    unknown = ~op.isin(OPS).to_numpy()
    if unknown.any():
        row = _first(unknown)
        known = ", ".join(OPS)
        raise SchemaError(source, "op", row, f"unknown op {op.iloc[row]!r} (known: {known})")

    frame = normalize_frame(frame)
    run_cat = frame["run_id"].cat
    categories = [str(c) for c in run_cat.categories]
    codes = run_cat.codes.to_numpy()
    for run_id in categories:
        if run_id not in runs:
            part = frame.loc[frame["run_id"] == run_id]
            runs[run_id] = RunMeta(
                stages=int(part["stage"].max()) + 1,
                microbatches=max(int(part["microbatch"].max()) + 1, 1),
                chunks=int(part["chunk"].max()) + 1,
                replicas=int(part["replica"].max()) + 1,
                source="inferred",
            )
    for col, attr in (("stage", "stages"), ("microbatch", "microbatches"), ("chunk", "chunks"),
                      ("replica", "replicas")):
        values = frame[col].to_numpy()
        smallest = min(getattr(runs[c], attr) for c in categories) if categories else 0
        if values.size == 0 or values.max() < smallest:  # fast path: no per-row limits needed
            continue
        limit = _meta_array(codes, categories, runs, attr)
        bad = values >= limit
        if bad.any():
            row = _first(bad)
            raise SchemaError(source, col, row,
                              f"value {values[row]} out of range for run "
                              f"'{categories[codes[row]]}' ({attr}={limit[row]})")
    _check_duplicates(frame, source)
    for col, dtype in _OPT_INT.items():
        if col in frame.columns:
            values = frame[col]
            frame[col] = values.astype(dtype.capitalize() if values.isna().any() else dtype)
            low = frame[col].min()
            if low is not pd.NA and low < 0:
                row = _first((frame[col] < 0).fillna(False).to_numpy())
                raise SchemaError(source, col, row, f"negative value {frame[col].iloc[row]}")
    return frame


def _check_duplicates(frame: pd.DataFrame, source: str) -> None:
    is_compute = frame["op"].isin(COMPUTE_OPS).to_numpy()
    if not is_compute.any():
        return
    rows = np.flatnonzero(is_compute)
    keys = []
    for col in UNIQUE_KEY:
        series = frame[col]
        values = series.cat.codes.to_numpy() if isinstance(series.dtype, pd.CategoricalDtype) \
            else series.to_numpy()
        keys.append(values[rows].astype(np.int64))
    # Pack the key into one int64 when the value ranges fit in 63 bits (they always do in
    # practice): one sort instead of a 6-key lexsort. Values are >= -1 after the range checks.
    spans = [int(k.max()) + 2 if k.size else 1 for k in keys]
    if sum(int(s - 1).bit_length() for s in spans) <= 63:
        packed = np.zeros(rows.size, dtype=np.int64)
        for k, span in zip(keys, spans, strict=True):
            packed = packed * span + (k + 1)
        order = np.argsort(packed, kind="stable")
        sorted_packed = packed[order]
        same = sorted_packed[1:] == sorted_packed[:-1]
    else:
        order = np.lexsort(keys[::-1])
        sorted_keys = np.stack([k[order] for k in keys])
        same = np.all(sorted_keys[:, 1:] == sorted_keys[:, :-1], axis=0)
    if same.any():
        # a stable sort keeps equal rows in order, so the later of two equal rows is the duplicate
        row = int(rows[order[1:][same]].min())
        key = ", ".join(f"{c}={frame[c].iloc[row]}" for c in UNIQUE_KEY)
        raise SchemaError(source, "op", row, f"duplicate compute op ({key})")


__all__ = ["SchemaError", "normalize_frame", "validate_frame", "OPTIONAL"]
