"""Events -> features frame in one call: step series, then features and targets."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd

from bubblecast.dataset.config import DatasetConfig
from bubblecast.dataset.features import build_features
from bubblecast.dataset.series import step_series
from bubblecast.dataset.store import FeaturesMeta, fingerprint
from bubblecast.telemetry.events import Events


def _op_totals(frame: pd.DataFrame) -> pd.Series:
    """Seconds per (run_id, op) over all rows (the compute ops' sums are those over the compute
    rows alone): grouped by one int32 key of the categorical codes, so neither the events nor
    a per-column group index are copied (pandas' compensated sum, as a groupby by columns)."""
    import numpy as np

    run, op = frame["run_id"], frame["op"]
    if not (isinstance(run.dtype, pd.CategoricalDtype) and isinstance(op.dtype,
                                                                       pd.CategoricalDtype)):
        return frame.groupby(["run_id", "op"], observed=True)["duration_s"].sum()
    n_ops = len(op.cat.categories)
    key = run.cat.codes.to_numpy().astype(np.int32)
    key *= n_ops
    key += op.cat.codes.to_numpy()
    sums = pd.Series(frame["duration_s"].to_numpy()).groupby(key).sum()
    codes = sums.index.to_numpy()
    runs, ops = run.cat.categories, op.cat.categories
    index = pd.MultiIndex.from_arrays([[str(runs[c // n_ops]) for c in codes],
                                       [str(ops[c % n_ops]) for c in codes]])
    return pd.Series(sums.to_numpy(), index=index)


def run_info(events: Events) -> dict[str, dict[str, Any]]:
    """Per run, what replaying forecasts through the timing engine needs (see FeaturesMeta)."""
    totals = _op_totals(events.frame)
    out: dict[str, dict[str, Any]] = {}
    for run_id, meta in events.runs.items():
        per_op = {op: float(totals.get((run_id, op), 0.0)) for op in ("F", "B", "W")}
        total = sum(per_op.values())
        sim = meta.extra.get("sim") if isinstance(meta.extra.get("sim"), dict) else {}
        out[run_id] = {
            "schedule": meta.schedule, "stages": meta.stages,
            "microbatches": meta.microbatches, "chunks": meta.chunks,
            "replicas": meta.replicas, "comm_s": float(sim.get("comm_ms", 0.0)) / 1000.0,
            "op_share": {k: v / total for k, v in per_op.items()} if total > 0 else {},
        }
    return out


def build_dataset(events: Events, config: DatasetConfig | None = None,
                  progress: Callable[[str], None] | None = None,
                  sources: list[str] | None = None,
                  metrics: pd.DataFrame | None = None,
                  n_jobs: int | None = None) -> tuple[pd.DataFrame, FeaturesMeta]:
    """The features frame of ``events`` and its metadata (config, fingerprint, runs).

    ``metrics``: the runs' ``device_metrics`` rows, read when ``config.covariates`` is
    ``auto`` (covariate features, :mod:`bubblecast.dataset.covariates`). ``n_jobs``: threads
    of the features (scikit-learn's convention, None or -1 every core); the values do not
    depend on it.

    Runs are independent, so this can run per run (or per partition of runs) and the frames
    concatenated; the result is the same.
    """
    config = config or DatasetConfig()
    note = progress or (lambda _msg: None)
    note("step series")
    info = run_info(events)  # before the features exist: its temporaries do not add to them
    series = step_series(events)
    frame = build_features(series, config, progress=note, n_jobs=n_jobs)
    if config.covariates != "none":
        from bubblecast.dataset.covariates import add_covariates

        note("covariates")
        frame = add_covariates(frame, events, metrics, config)
    meta = FeaturesMeta(config=config, fingerprint=fingerprint(frame, config),
                        runs=[str(r) for r in frame["run_id"].cat.categories],
                        sources=list(sources or []), run_info=info)
    frame.attrs["bubblecast_features"] = meta.to_json()
    return frame, meta


def load_for_dataset(path: Any, format: str = "auto") -> Events:
    """A ``dataset`` input's events: bubblecast events read with only the columns the dataset
    uses (:data:`~bubblecast.dataset.series.EVENT_COLUMNS`; strings as categoricals), other
    formats through their importer."""
    from bubblecast.dataset.series import EVENT_COLUMNS
    from bubblecast.telemetry.importers import detect_format, load_events
    from bubblecast.telemetry.io import read_events

    fmt = detect_format(path) if format == "auto" else format
    if fmt == "bubblecast":
        return read_events(path, columns=list(EVENT_COLUMNS))
    return load_events(path, fmt)
