"""A trained forecaster's one-step speed forecasts for the ``balance`` policy (``--model``).

The model forecasts each rank's delay signal (``y`` of :mod:`bubblecast.dataset`) from
features built on telemetry only: this module builds the run's features from its events
without ground truth (:func:`observed_events`: no ``speed`` column, no true cost in the
metadata), asks the model for its smallest horizon at every origin step, and returns the
forecasts per (origin, replica, stage) with the signal they are in, so that the policy can
rescale them to its own speed unit from the steps it has seen (the two differ by the unit of
work only). Unlike the partition policies' table (:func:`bubblecast.policy.speeds.
model_forecaster`) replicas are kept apart: the planner gives each replica its own count.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from bubblecast.errors import BubblecastError
from bubblecast.policy.speeds import model_dataset_config
from bubblecast.policy.work_policies import WorkContext
from bubblecast.telemetry.events import Events


def observed_events(events: Events, run_id: str) -> Events:
    """The run's events as a real system has them: no ``speed`` column and no true cost in the
    metadata's ``documents``."""
    ev = events.run(run_id) if len(events.run_ids) > 1 else events
    meta = copy.deepcopy(ev.runs[run_id])
    docs = meta.extra.get("documents")
    if isinstance(docs, dict):
        docs.pop("cost", None)
    return Events(ev.frame.drop(columns=[c for c in ("speed",) if c in ev.frame.columns]),
                  {run_id: meta})


def model_speed_table(model: Any, events: Events, context: WorkContext
                      ) -> tuple[np.ndarray, np.ndarray]:
    """``(forecast, signal)``, each ``(T, R, P)``: the model's p50 at its smallest horizon
    made at each origin step, and the signal observed at that step (NaN where none);
    BubblecastError when the model cannot forecast this run."""
    from bubblecast.dataset import build_dataset

    horizons = sorted(int(h) for h in getattr(model, "horizons_", [1]))
    view = observed_events(events, context.run_id)
    try:
        frame, _ = build_dataset(view, model_dataset_config(model, horizons))
        pred = model.predict(frame, horizons[:1])
    except (BubblecastError, ValueError, KeyError) as exc:
        raise BubblecastError(f"cannot forecast with the model: {exc}") from None
    steps = context.table.steps
    T, R, P = context.table.layers.shape
    table, signal = np.full((T, R, P), np.nan), np.full((T, R, P), np.nan)
    for source, column, out in ((pred, "p50", table), (frame, "y", signal)):
        ti = np.searchsorted(steps, source["step"].to_numpy(np.int64))
        ok = (ti < T) & (steps[np.minimum(ti, T - 1)] == source["step"].to_numpy(np.int64))
        r = source["replica"].to_numpy(np.int64)
        s = source["stage"].to_numpy(np.int64)
        out[ti[ok], r[ok], s[ok]] = source[column].to_numpy(np.float64)[ok]
    return table, signal
