"""What a step-granularity training log supports: the ``inspect --json`` object for logs.

A timer log gives, per logged step, each rank's (or the across-ranks min/max of) compute time
and the step time; it gives no per-op order. So this reports per-rank compute against step time,
the slowest rank and stage, and the implied bubble share ``1 - compute / step time``; the SPEC
keys that need the op timeline (structural and dynamic bubbles, steady bubbles, slow-rank tests)
are ``null``. With values aggregated across ranks (Megatron ``max``/``minmax``, the older one-line
form) the busiest rank's compute gives a lower bound of the bubble share of the other ranks and
per-rank keys are ``null``. ``input_fixes`` is what the import normalised (clock jitter
clamped, :mod:`~bubblecast.telemetry.importers.fixes`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from bubblecast.telemetry.events import Events
from bubblecast.telemetry.importers.fixes import FIXES_KEY, input_fixes

_COMPUTE = ("F", "B", "W")
_STEP_TIMERS = ("forward-backward", "train_batch")


def _quantiles(values: pd.Series) -> dict[str, float] | None:
    if values.empty:
        return None
    return {"median": float(values.median()), "p90": float(values.quantile(0.9))}


def _step_times(frame: pd.DataFrame, extra: dict[str, Any]) -> tuple[pd.Series, str | None]:
    """Seconds per logged step and where they come from (None: the log gives none)."""
    logged = extra.get("step_time_s") or {}
    if logged:
        return pd.Series({int(k): float(v) for k, v in logged.items()}).sort_index(), \
            "the log's step-time lines"
    for timer in _STEP_TIMERS:
        rows = frame.loc[frame["name"] == timer]
        if not rows.empty:
            return rows.groupby("step")["duration_s"].max(), f"timer '{timer}' (max over ranks)"
    return pd.Series(dtype=np.float64), None


def _per_rank(compute: pd.DataFrame, steps: pd.Series) -> list[dict[str, Any]]:
    rows = []
    for rank, part in compute.groupby("rank"):
        step_s = steps.reindex(part["step"]).to_numpy()
        share = 1.0 - part["compute_s"].to_numpy() / step_s
        rows.append({
            "rank": int(rank), "stage": int(part["stage"].iat[0]),
            "replica": int(part["replica"].iat[0]),
            "compute_s": float(part["compute_s"].median()),
            "step_s": float(np.nanmedian(step_s)) if np.isfinite(step_s).any() else None,
            "bubble_fraction": float(np.nanmean(share)) if np.isfinite(share).any() else None,
        })
    return rows


def _per_stage(compute: pd.DataFrame, steps: pd.Series, stages: int) -> list[dict[str, Any]]:
    """Busy (compute) and idle (step time minus compute) seconds per stage over the steps."""
    out = []
    joined = compute.assign(step_s=steps.reindex(compute["step"]).to_numpy())
    for stage in range(stages):
        part = joined.loc[joined["stage"] == stage]
        busy = float(part["compute_s"].sum())
        idle = float((part["step_s"] - part["compute_s"]).clip(lower=0).sum())
        out.append({"stage": stage, "busy_s": busy, "idle_s": idle,
                    "bubble_fraction": idle / (busy + idle) if busy + idle > 0 else None})
    return out


def _basis(extra: dict[str, Any], per_rank_values: bool) -> str:
    """How ``bubble_fraction`` was derived from what the log holds."""
    if per_rank_values:
        return "mean over ranks and steps of 1 - compute / step time"
    if str(extra.get("values", "")).startswith("one rank"):
        return "1 - the logging rank's compute / step time (which rank the log does not say)"
    return "1 - the busiest rank's compute / step time (a lower bound for the other ranks)"


def step_summary(events: Events, run_id: str) -> dict[str, Any]:
    """The ``inspect --json`` object of one step-granularity run (underivable keys ``null``)."""
    meta = events.runs[run_id]
    extra = meta.extra
    frame = events.run(run_id).frame
    per_rank_values = bool(extra.get("per_rank"))
    stages_known = bool(extra.get("stages_known"))
    comp = frame.loc[frame["op"].isin(_COMPUTE)]
    compute = comp.groupby(["step", "rank"], as_index=False).agg(
        compute_s=("duration_s", "sum"), stage=("stage", "first"), replica=("replica", "first"))
    steps, steps_from = _step_times(frame, extra)
    rank_share = 1.0 - compute["compute_s"].to_numpy() / steps.reindex(compute["step"]).to_numpy()
    bubble = float(np.nanmean(rank_share)) if np.isfinite(rank_share).any() else None
    per_rank = _per_rank(compute, steps) if per_rank_values else None
    slowest_rank = slowest_stage = None
    if per_rank_values and not compute.empty:
        med = compute.groupby("rank")["compute_s"].median()
        slowest_rank = int(med.idxmax())
        if stages_known:
            by_stage = compute.groupby(["step", "stage"])["compute_s"].sum()
            slowest_stage = int(by_stage.groupby("stage").median().idxmax())
    return {
        "run_id": run_id,
        "granularity": "step",
        "timing": str(extra.get("timing", "host")),
        "steps": int(frame["step"].nunique()),
        "stages": meta.stages if stages_known else None,
        "replicas": meta.replicas if stages_known else None,
        "bubble_fraction": bubble,
        "bubble_fraction_basis": None if bubble is None else _basis(extra, per_rank_values),
        "structural_bubble_fraction": None,
        "dynamic_bubble_fraction": None,
        "steady_bubble_fraction": None,
        "step_time_s": _quantiles(steps),
        "step_time_from": steps_from,
        "compute_s": _quantiles(compute["compute_s"]),
        "bottleneck_stage": slowest_stage,
        "slowest_rank": slowest_rank,
        "slow_ranks": None,
        "per_stage": _per_stage(compute, steps, meta.stages)
        if per_rank_values and stages_known and not steps.empty else None,
        "per_rank": per_rank,
        "values": extra.get("values"),
        "source": meta.source,
        "needs_per_op_order": ["whatif", "dataset", "policy-eval"],
        FIXES_KEY: input_fixes(extra),
    }


__all__ = ["step_summary"]
