"""Bubble accounting (SPEC §2): windows, busy and idle time per rank, stage and step.

The pipeline window of a (step, replica) runs from the earliest start to the latest end of a
compute op on any of its ranks; a rank's busy time is the length of the union of its compute
intervals (the plain sum when they do not overlap, so idle is never negative); idle is the
window minus busy. Every function takes optional ``start``/``duration`` arrays aligned with the
frame's rows, so the same accounting applies to a replayed timeline (structural bubbles).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from bubblecast.errors import BubblecastError
from bubblecast.sim.replay import ReplayModel, select_run
from bubblecast.sim.replay_graph import lane_order
from bubblecast.sim.slow_ranks import detect_slow_ranks
from bubblecast.sim.steptime import observed_step_times, op_times
from bubblecast.telemetry.events import Events
from bubblecast.telemetry.importers.fixes import input_fixes
from bubblecast.telemetry.schema import COMPUTE_OPS


def rank_step_table(frame: pd.DataFrame, start: np.ndarray | None = None,
                    duration: np.ndarray | None = None) -> pd.DataFrame:
    """One row per (step, rank): stage, replica, window_start, window_s, busy_s, idle_s,
    span_s (the rank's own span: its first compute op's start to its last one's end).

    Ranks are those with any op in the step; a (step, replica) with no compute op has no window
    and is left out. O(n) numpy when the rows are in lane order, one sort otherwise.
    """
    s, e = op_times(frame, start, duration)
    step = frame["step"].to_numpy(np.int64)
    rank = frame["rank"].to_numpy(np.int64)
    order = lane_order(step, rank, s)
    st, rk = step[order], rank[order]
    new = np.r_[True, (st[1:] != st[:-1]) | (rk[1:] != rk[:-1])]
    first = np.flatnonzero(new)
    lane = np.cumsum(new) - 1
    comp = frame["op"].isin(COMPUTE_OPS).to_numpy()[order]
    cs, ce, cl = s[order][comp], e[order][comp], lane[comp]
    seg = np.r_[True, cl[1:] != cl[:-1]] if cl.size else np.zeros(0, dtype=bool)
    before = np.r_[-np.inf, ce[:-1]] if cl.size else ce
    before[seg] = -np.inf
    if not (cs >= before).all():  # overlapping compute on a rank: count the union only
        reach = pd.Series(ce).groupby(cl).cummax().to_numpy()
        before = np.r_[-np.inf, reach[:-1]]
        before[seg] = -np.inf
    covered = np.clip(ce - np.maximum(cs, before), 0.0, None)
    n_lanes = len(first)
    lo, hi = np.full(n_lanes, np.inf), np.full(n_lanes, -np.inf)
    starts = np.flatnonzero(seg)
    if starts.size:
        lo[cl[starts]] = np.minimum.reduceat(cs, starts)
        hi[cl[starts]] = np.maximum.reduceat(ce, starts)
    table = pd.DataFrame({
        "step": st[first], "rank": rk[first],
        "stage": frame["stage"].to_numpy(np.int64)[order][first],
        "replica": frame["replica"].to_numpy(np.int64)[order][first],
        "busy_s": np.bincount(cl, covered, minlength=n_lanes), "lo": lo, "hi": hi,
    })
    g = table.groupby(["step", "replica"], sort=False)
    table["window_start"] = g["lo"].transform("min")
    table["window_s"] = g["hi"].transform("max") - table["window_start"]
    table = table.loc[np.isfinite(table["window_s"].to_numpy())]
    # a rank's busy seconds are a sum of its segments: rounding can take them an ulp past the
    # window they lie in, and idle an ulp below 0
    table["busy_s"] = np.minimum(table["busy_s"], table["window_s"])
    table["idle_s"] = table["window_s"] - table["busy_s"]
    table["span_s"] = table["hi"] - table["lo"]
    cols = ["step", "rank", "stage", "replica", "window_start", "window_s", "busy_s", "idle_s",
            "span_s"]
    return table[cols].reset_index(drop=True)


def bubble_fraction(table: pd.DataFrame) -> float:
    """Total idle / total (ranks x window) of a :func:`rank_step_table`."""
    total = float(table["window_s"].sum())
    return float(table["idle_s"].sum()) / total if total > 0 else 0.0


def steady_bubble_fraction(table: pd.DataFrame) -> float:
    """SPEC §2 steady bubble fraction of a :func:`rank_step_table`: 1 - total busy / total
    (ranks x the longest single-rank span) over its (step, replica) windows.

    A rank's span runs from its first compute op of the step to its last, so the warm-up and
    cool-down skew between ranks, which iterations that tile overlap, does not count: the
    zero-bubble authors' measure for ZB-H2 and the V-shape schedules.
    """
    g = table.groupby(["step", "replica"], sort=False)
    cells = float((g["span_s"].max() * g["span_s"].size()).sum())
    return 1.0 - float(table["busy_s"].sum()) / cells if cells > 0 else 0.0


def stage_compute(frame: pd.DataFrame) -> pd.DataFrame:
    """Compute time per (step, stage), summed over replicas (steps as rows)."""
    comp = frame.loc[frame["op"].isin(COMPUTE_OPS), ["step", "stage", "duration_s"]]
    return comp.groupby(["step", "stage"])["duration_s"].sum().unstack("stage")


def bottleneck_stage(frame: pd.DataFrame) -> int | None:
    """The stage with the largest median over steps of its compute summed over replicas."""
    per = stage_compute(frame)
    return None if per.empty else int(per.median(axis=0).idxmax())


def per_step_table(table: pd.DataFrame, steps: pd.Series) -> pd.DataFrame:
    """One row per step: step_time_s, window_s (mean over replicas), busy_s, idle_s,
    bubble_fraction; from a :func:`rank_step_table` and
    :func:`~bubblecast.sim.steptime.observed_step_times`."""
    win = table.drop_duplicates(["step", "replica"]).groupby("step")["window_s"].mean()
    g = table.groupby("step")
    out = pd.DataFrame({"window_s": win, "busy_s": g["busy_s"].sum(), "idle_s": g["idle_s"].sum()})
    out["bubble_fraction"] = out["idle_s"] / g["window_s"].sum()
    out = steps.to_frame().join(out, how="left")
    return out.reset_index()


def per_step(events: Events, run_id: str | None = None) -> pd.DataFrame:
    """:func:`per_step_table` of one run of ``events``."""
    _, ev = select_run(events, run_id)
    return per_step_table(rank_step_table(ev.frame), observed_step_times(ev.frame))


def stage_step_idle(table: pd.DataFrame) -> pd.DataFrame:
    """Idle seconds per stage (rows) and step (columns), summed over replicas."""
    return table.pivot_table(index="stage", columns="step", values="idle_s", aggfunc="sum")


def per_kind(values: np.ndarray, kind: np.ndarray, how: str) -> np.ndarray:
    """Each row's ``how`` (mean or median) of ``values`` over the rows of its kind."""
    if not len(values):
        return values.copy()
    if how == "mean":
        n = np.bincount(kind)
        table = np.bincount(kind, weights=values) / np.maximum(n, 1)
    else:
        table = pd.Series(values).groupby(kind).median().reindex(range(kind.max() + 1))
        table = table.to_numpy(np.float64)
    return table[kind]


def structural_durations(model: Any) -> np.ndarray:
    """Every op at its type's median over the run (pure transfer times for exchanges)."""
    base = np.where(model.is_comm, model.pure, model.observed)
    return per_kind(base, model.kind, "median")


def _per_stage(table: pd.DataFrame, stages: int) -> list[dict[str, Any]]:
    g = table.groupby("stage")[["busy_s", "idle_s"]].sum()
    out = []
    for s in range(stages):
        busy = float(g["busy_s"].get(s, 0.0))
        idle = float(g["idle_s"].get(s, 0.0))
        total = busy + idle
        out.append({"stage": s, "busy_s": busy, "idle_s": idle,
                    "bubble_fraction": idle / total if total > 0 else 0.0})
    return out


def _per_rank(table: pd.DataFrame) -> list[dict[str, Any]]:
    g = table.groupby("rank").agg(stage=("stage", "first"), replica=("replica", "first"),
                                  busy_s=("busy_s", "sum"), idle_s=("idle_s", "sum"))
    total = g["busy_s"] + g["idle_s"]
    g["bubble_fraction"] = np.where(total > 0, g["idle_s"] / total.where(total > 0, 1.0), 0.0)
    return [{"rank": int(r), "stage": int(row.stage), "replica": int(row.replica),
             "busy_s": float(row.busy_s), "idle_s": float(row.idle_s),
             "bubble_fraction": float(row.bubble_fraction)} for r, row in g.iterrows()]


def inspect_summary(events: Events, run_id: str | None = None) -> dict[str, Any]:
    """The ``inspect --json`` object for one run (the only run, or ``run_id``).

    SPEC §3 keys first. Structural bubbles come from replaying the run's observed op order
    (:mod:`bubblecast.sim.replay`) with every op at its type's median; slow ranks from
    :mod:`bubblecast.sim.slow_ranks`. Extras: ``schedule``, ``microbatches``,
    ``slow_rank_details``, ``replay_comm_s`` (the estimated dependency lag), ``per_rank``
    (busy, idle and bubble fraction per rank over the run) and, when the replay fails,
    ``structural_error`` (the structural and dynamic fractions are then null).
    """
    run_id, ev = select_run(events, run_id)
    meta = ev.runs[run_id]
    if meta.extra.get("granularity") == "step":  # a coarse log: what it supports, else null
        from bubblecast.telemetry.importers.logs_summary import step_summary

        return step_summary(ev, run_id)
    frame = ev.frame
    table = rank_step_table(frame)
    observed = bubble_fraction(table)
    steps = observed_step_times(frame)
    structural, note, comm = None, None, None
    try:
        model = ReplayModel(ev, run_id)
        rep = model.run(structural_durations(model))
        structural = bubble_fraction(rank_step_table(frame, rep.start, rep.end - rep.start))
        comm = model.comm
    except BubblecastError as exc:
        note = str(exc)
    slow = detect_slow_ranks(frame)
    out: dict[str, Any] = {
        "run_id": run_id,
        "steps": int(steps.size),
        "stages": meta.stages,
        "replicas": meta.replicas,
        "bubble_fraction": observed,
        "steady_bubble_fraction": steady_bubble_fraction(table),
        "structural_bubble_fraction": structural,
        "dynamic_bubble_fraction": None if structural is None else observed - structural,
        "step_time_s": {"median": float(steps.median()), "p90": float(steps.quantile(0.9))},
        "bottleneck_stage": bottleneck_stage(frame),
        "slow_ranks": [int(r["rank"]) for r in slow],
        "per_stage": _per_stage(table, meta.stages),
        "schedule": meta.schedule,
        "microbatches": meta.microbatches,
        "slow_rank_details": slow,
        "replay_comm_s": comm,
        "per_rank": _per_rank(table),
        "timing": str(meta.extra.get("timing", "host")),
        "granularity": "op",
    }
    fixes = input_fixes(meta.extra)
    if fixes:  # a run imported from an external format: what its importer normalised
        out["input_fixes"] = fixes
    if note:
        out["structural_error"] = note
    return out
