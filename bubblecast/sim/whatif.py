"""What-if analysis (SPEC §3 ``whatif``): replay a run under counterfactual durations.

Scenarios, each replayed with the same dependency graphs as the observed run:

- ``ideal``: every compute op takes the mean duration of its op type over the run, every
  communication op (send, receive, collective) the median pure transfer time of its type;
  other ops (optimizer, host work) keep theirs;
- ``fix_bottleneck``: the ops of the bottleneck stage (all replicas) take their ideal values;
- ``no_slow_ranks``: the ops of every slow rank take their ideal values;
- ``balanced``: within each replica, every compute op of stage s is scaled by (mean over the
  replica's stages of their total compute) / (stage s's total compute).

Step times are means over the run's steps; ``speedup`` is replayed_step_s / step_s.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bubblecast.sim.accounting import bottleneck_stage, per_kind
from bubblecast.sim.replay import ReplayConfig, ReplayModel
from bubblecast.sim.slow_ranks import detect_slow_ranks
from bubblecast.telemetry.events import Events

SCENARIOS: tuple[str, ...] = ("ideal", "fix_bottleneck", "no_slow_ranks", "balanced")


def ideal_durations(model: ReplayModel) -> np.ndarray:
    """Compute ops at their type's mean, communication ops at their type's median transfer."""
    out = model.pure.copy()
    comp, comm = model.is_compute, model.is_comm
    out[comp] = per_kind(model.observed[comp], model.kind[comp], "mean")
    out[comm] = per_kind(model.pure[comm], model.kind[comm], "median")
    return out


def with_ideal_ranks(model: ReplayModel, ranks: list[int] | np.ndarray,
                     ideal: np.ndarray | None = None) -> np.ndarray:
    """Pure durations where the ops of ``ranks`` take their ideal values."""
    ideal = ideal_durations(model) if ideal is None else ideal
    mask = np.isin(model.rank, np.asarray(ranks, dtype=np.int64))
    return np.where(mask, ideal, model.pure)


def balanced_durations(model: ReplayModel) -> np.ndarray:
    """Compute ops scaled so that every stage of a replica carries the same total compute."""
    f = model.frame
    comp = model.is_compute
    stage = f["stage"].to_numpy(np.int64)[comp]
    replica = f["replica"].to_numpy(np.int64)[comp]
    shape = (int(replica.max()) + 1, int(stage.max()) + 1) if stage.size else (1, 1)
    key = replica * shape[1] + stage
    size = shape[0] * shape[1]
    total = np.bincount(key, weights=model.observed[comp], minlength=size).reshape(shape)
    present = np.bincount(key, minlength=size).reshape(shape) > 0
    mean = (total * present).sum(axis=1, keepdims=True) / np.maximum(present.sum(axis=1,
                                                                                 keepdims=True), 1)
    factor = np.divide(np.broadcast_to(mean, shape), total, out=np.ones(shape), where=total > 0)
    out = model.pure.copy()
    out[comp] = model.observed[comp] * factor.ravel()[key]
    return out


def whatif(events: Events, run_id: str | None = None, *,
           config: ReplayConfig | None = None) -> dict[str, Any]:
    """The ``whatif --json`` object for one run (SPEC §3 keys, then extras)."""
    from bubblecast.telemetry.importers import require_per_op

    require_per_op(events, "whatif", "run " + ", ".join(events.run_ids[:3]))
    model = ReplayModel(events, run_id, config)
    base = model.run()
    replayed = float(base.replayed_step_s.mean())
    ideal = ideal_durations(model)
    bottleneck = bottleneck_stage(model.frame)
    slow = [int(r["rank"]) for r in detect_slow_ranks(model.frame)]
    stage = model.frame["stage"].to_numpy(np.int64)
    bottleneck_ranks = np.unique(model.rank[stage == bottleneck]) if bottleneck is not None \
        else np.zeros(0, dtype=np.int64)
    variants = {
        "ideal": ideal,
        "fix_bottleneck": with_ideal_ranks(model, bottleneck_ranks, ideal),
        "no_slow_ranks": with_ideal_ranks(model, slow, ideal) if slow else None,
        "balanced": balanced_durations(model),
    }
    scenarios = {}
    for name, dur in variants.items():
        step_s = replayed if dur is None else float(model.run(dur).replayed_step_s.mean())
        scenarios[name] = {"step_s": step_s, "speedup": replayed / step_s if step_s > 0 else None}
    err = base.error
    return {
        "observed_step_s": float(base.observed_step_s.mean()),
        "replayed_step_s": replayed,
        "replay_error": float(np.median(err)),
        "scenarios": scenarios,
        "run_id": model.run_id,
        "steps": int(len(base.steps)),
        "replay_error_p90": float(np.quantile(err, 0.9)),
        "bottleneck_stage": bottleneck,
        "slow_ranks": slow,
        "replay_comm_s": model.comm,
        "launch_delays": model.config.launch_delays,
        "timing": str(events.runs[model.run_id].extra.get("timing", "host")),
    }
