"""The ``device_metrics`` side table: covariates sampled next to the ``events``.

One row per sample: ``run_id`` (string), ``step`` (int64 >= 0), ``rank`` (int32 >= 0),
``metric`` (string) and ``value`` (float64, finite). Two kinds of metric:

- **observed** (``temperature_c``, ``sm_clock_mhz``, ``power_w``, ``throttle``, ``cpu_mhz``,
  ``load1``...): measured at ``step``; a forecast made at origin ``t`` may use rows with
  ``step <= t`` only;
- **known-future** (:func:`is_known_future`: ``tokens`` and names starting ``planned_``):
  the workload the training loop announced for ``step`` ahead of time (tokens per
  micro-batch of the next K steps); a forecast for ``t + h`` may read its row at ``t + h``.

Storage: Parquet files with the extension ``.metrics`` (so no events reader, which globs
``*.parquet``, ever mistakes them for events): beside an events file ``runs.parquet`` the file
``runs.metrics``; inside an events directory any number of ``*.metrics`` files (the recorder
writes ``rank0000.metrics`` into its parts directory); of a fleet, in its sidecar folder
beside it (``_FLEET.sidecars/run_id=<id>/part-00000.metrics``, outside the data every reader
lists; fleets written before hold them inside ``run_id=<id>/``, still read).
Written atomically with page checksums, verified on read; rows are validated on write and read
(one line naming the file and column).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from bubblecast.errors import BubblecastError

SUFFIX = ".metrics"
COLUMNS: dict[str, pa.DataType] = {
    "run_id": pa.string(), "step": pa.int64(), "rank": pa.int32(),
    "metric": pa.string(), "value": pa.float64(),
}
#: Known-future metrics without the ``planned_`` prefix.
KNOWN_FUTURE: frozenset[str] = frozenset({"tokens"})


def is_known_future(metric: str) -> bool:
    """Whether ``metric`` is known before its step runs (announced workload, calendar)."""
    return metric in KNOWN_FUTURE or metric.startswith("planned_")


def empty() -> pd.DataFrame:
    """A device-metrics frame with no rows (the right columns and dtypes)."""
    return pd.DataFrame({"run_id": pd.Series([], dtype=str), "step": np.zeros(0, np.int64),
                         "rank": np.zeros(0, np.int32), "metric": pd.Series([], dtype=str),
                         "value": np.zeros(0)})


def metrics_path(events_path: str | os.PathLike[str]) -> Path:
    """Where the metrics of an events *file* go: ``runs.parquet`` -> ``runs.metrics``."""
    p = Path(events_path)
    return p.with_suffix(SUFFIX) if p.suffix == ".parquet" else p.with_name(p.name + SUFFIX)


def validate_metrics(frame: pd.DataFrame, source: str = "<memory>") -> pd.DataFrame:
    """The frame with SPEC dtypes; raise one line naming ``source`` and the column if bad."""
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise BubblecastError(f"{source}: device metrics lack column '{missing[0]}'")
    out = pd.DataFrame({"run_id": frame["run_id"].astype(str),
                        "metric": frame["metric"].astype(str)})
    for col, kind in (("step", np.int64), ("rank", np.int32), ("value", np.float64)):
        raw = frame[col]
        if raw.isna().any():
            raise BubblecastError(f"{source}: device metrics column '{col}' holds nulls")
        try:
            values = pd.to_numeric(raw).to_numpy()
        except (ValueError, TypeError):
            raise BubblecastError(f"{source}: device metrics column '{col}' is not "
                                  "numeric") from None
        if col != "value" and (values < 0).any():
            raise BubblecastError(f"{source}: device metrics column '{col}' holds negatives")
        if col == "value" and not np.isfinite(values).all():
            raise BubblecastError(f"{source}: device metrics column 'value' holds non-finite "
                                  "numbers")
        if col != "value" and not np.all(values == np.round(values)):
            raise BubblecastError(f"{source}: device metrics column '{col}' is not integer")
        out[col] = values.astype(kind)
    if (out["metric"] == "").any():
        raise BubblecastError(f"{source}: device metrics column 'metric' holds empty names")
    return out[list(COLUMNS)].reset_index(drop=True)


def write_metrics(frame: pd.DataFrame, path: str | os.PathLike[str]) -> Path:
    """Validate and write ``frame`` atomically to ``path`` (Parquet, page checksums)."""
    from bubblecast.telemetry.io import atomic_write

    checked = validate_metrics(frame, str(path))
    schema = pa.schema([pa.field(c, t, nullable=False) for c, t in COLUMNS.items()])
    table = pa.Table.from_pandas(checked, schema=schema, preserve_index=False)
    return atomic_write(path, lambda tmp: pq.write_table(
        table, tmp, compression="lz4", use_dictionary=["run_id", "metric"],
        write_page_checksum=True))


def metrics_files(path: str | os.PathLike[str]) -> list[Path]:
    """The metrics files of an events file or directory (none: empty list); of a fleet or
    one of its run directories, those in its sidecar folder too."""
    from bubblecast.telemetry.fleet import run_id_of, run_sidecar_dir, sidecar_dir

    p = Path(path)
    if p.is_dir():
        side = run_sidecar_dir(p) if run_id_of(p) is not None else sidecar_dir(p)
        return sorted(f for d in (p, side) if d.is_dir() for f in d.rglob(f"*{SUFFIX}")
                      if f.is_file()
                      and not any(s.startswith(".") for s in f.relative_to(d).parts))
    if p.suffix == SUFFIX:
        return [p] if p.exists() else []
    side = metrics_path(p)
    return [side] if side.exists() else []


def _read_one(path: Path) -> pd.DataFrame:
    try:
        table = pq.read_table(path, page_checksum_verification=True)
    except (pa.ArrowInvalid, OSError) as exc:
        text = " ".join(str(exc).split())
        what = "corrupted (page checksum mismatch)" if "checksum" in text.lower() \
            else "not a readable Parquet file"
        raise BubblecastError(f"{path}: device metrics {what}: {text}") from None
    return validate_metrics(table.to_pandas(), str(path))


def read_metrics(path: str | os.PathLike[str]) -> pd.DataFrame:
    """All device metrics belonging to the events at ``path`` (empty frame when none)."""
    parts = [_read_one(f) for f in metrics_files(path)]
    if not parts:
        return empty()
    return pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]


__all__ = ["COLUMNS", "KNOWN_FUTURE", "SUFFIX", "empty", "is_known_future", "metrics_files",
           "metrics_path", "read_metrics", "validate_metrics", "write_metrics"]
