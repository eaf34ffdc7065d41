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


def run_info(events: Events) -> dict[str, dict[str, Any]]:
    """Per run, what replaying forecasts through the timing engine needs (see FeaturesMeta)."""
    comp = events.compute()
    totals = comp.groupby(["run_id", "op"], observed=True)["duration_s"].sum()
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
                  sources: list[str] | None = None) -> tuple[pd.DataFrame, FeaturesMeta]:
    """The features frame of ``events`` and its metadata (config, fingerprint, runs).

    Runs are independent, so this can run per run (or per partition of runs) and the frames
    concatenated; the result is the same.
    """
    config = config or DatasetConfig()
    note = progress or (lambda _msg: None)
    note("step series")
    series = step_series(events)
    frame = build_features(series, config, progress=note)
    meta = FeaturesMeta(config=config, fingerprint=fingerprint(frame, config),
                        runs=[str(r) for r in frame["run_id"].cat.categories],
                        sources=list(sources or []), run_info=run_info(events))
    frame.attrs["bubblecast_features"] = meta.to_json()
    return frame, meta
