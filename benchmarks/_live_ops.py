"""What a live trainer's recorded ops say, for the live balancing benchmark (and the GPU check).

Per step: the compute window and the engine's step composed from the ops' own durations
(:func:`compute_windows`); the ops' pace per second the cost model prices, also split by
whether another rank computed beside them (:func:`op_pace`); and, between two
runs of the same work, the spread of the same ops' seconds (:func:`op_spread`), the floor under
any cost model's error.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def compute_windows(events: Any, stages: int) -> dict[str, list[float]]:
    """Per step, from a trainer's recorded ops: ``window_s``, the compute window (first F/B
    start to last F/B end over every rank), and ``engine_s``, the engine's 1F1B step composed
    from those same ops' durations (each replica with its own micro-batches, the slowest
    replica; no transfers). Beside the wall step they split a live gain: the ops' own costs
    (engine), the pipeline's execution of them (window), the rest of the step (wall)."""
    from bubblecast.sim.steptime import op_durations, step_times, timing_shape

    f = events.frame
    f = f[f["op"].astype(str).isin(["F", "B"]) & (f["microbatch"] >= 0)]
    window, engine = [], []
    for _, g in f.groupby("step", sort=True):
        end = g["start_s"] + g["duration_s"]
        window.append(float(end.max() - g["start_s"].min()))
        slowest = 0.0
        for _, r in g.groupby("replica"):
            mbs = sorted(r["microbatch"].unique())
            slot = {m: j for j, m in enumerate(mbs)}
            fb = np.zeros((2, 1, stages, len(mbs)))
            for op, stage, mb, d in zip(r["op"].astype(str), r["stage"], r["microbatch"],
                                        r["duration_s"], strict=True):
                fb[0 if op == "F" else 1, 0, int(stage), slot[mb]] += d
            shape = timing_shape("1f1b", stages, len(mbs), 1)
            dur = op_durations(shape, fb[0], fb[1], np.zeros_like(fb[0]))
            slowest = max(slowest, float(step_times(shape, dur)[0][0]))
        engine.append(slowest)
    return {"window_s": window, "engine_s": engine}


def op_pace(events: Any, model: Any, solo: float = 0.1) -> dict[str, list[float]]:
    """Per step, the pace of a trainer's compute ops (every rank's F/B/W): ``pace``, their
    seconds over what the cost model ``model`` prices them at speed 1, and the same two sums
    for the ops no other rank computed beside (*solo*: another rank's compute covers at most
    ``solo`` of the op's span) and for the rest: ``solo_s``/``solo_base``,
    ``overlap_s``/``overlap_base``.

    Packing moves documents between micro-batches but not the step's work, so trainers of one
    launch should keep one pace; a plan whose ops run at a slower pace loses that share of its
    predicted gain to something the cost model does not see. On a host whose ranks share
    cores and memory, ops beside another rank's run slower, and a plan that shrinks the
    pipeline's fill and drain moves work out of the solo part."""
    rows = model.rows(events, "a trainer's events")
    rows = rows.assign(base=model.predict(rows) / rows["speed_recent"].to_numpy(),
                       start=events.frame["start_s"].to_numpy()[rows["row"].to_numpy()])
    out: dict[str, list[float]] = {"pace": [], "solo_s": [], "solo_base": [], "overlap_s": [],
                                   "overlap_base": []}
    for _, g in rows.groupby("step", sort=True):
        start, dur = g["start"].to_numpy(), g["duration_s"].to_numpy()
        end, rank, base = start + dur, g["rank"].to_numpy(), g["base"].to_numpy()
        inter = np.clip(np.minimum(end[:, None], end[None, :])
                        - np.maximum(start[:, None], start[None, :]), 0.0, None)
        inter[rank[:, None] == rank[None, :]] = 0.0  # a rank's own ops never overlap
        alone = inter.sum(axis=1) <= solo * np.maximum(dur, 1e-12)
        out["pace"].append(float(dur.sum() / base.sum()))
        for key, part in (("solo", alone), ("overlap", ~alone)):
            out[f"{key}_s"].append(float(dur[part].sum()))
            out[f"{key}_base"].append(float(base[part].sum()))
    return out


def op_spread(a_events: Any, b_events: Any) -> dict[str, float]:
    """Over the compute ops both runs ran (same step, rank, micro-batch and kind: the same
    work), the spread ``|a - b| / (a + b)`` of their seconds: its median and its 80th
    percentile, the floor under any cost model's p90 error (why: ``bench_live_balance``'s
    module doc)."""
    keys = ["step", "rank", "stage", "microbatch", "op"]  # stage: virtual stages of a rank
    frames = []
    for events in (a_events, b_events):
        f = events.frame
        f = f[f["op"].astype(str).isin(["F", "B", "W"]) & (f["microbatch"] >= 0)]
        frames.append(f.assign(op=f["op"].astype(str))[keys + ["duration_s"]])
    both = frames[0].merge(frames[1], on=keys, suffixes=("_a", "_b"))
    a, b = both["duration_s_a"].to_numpy(), both["duration_s_b"].to_numpy()
    spread = np.abs(a - b) / np.maximum(a + b, 1e-12)
    return {"pairs": int(len(both)), "spread_p50": float(np.quantile(spread, 0.5)),
            "p90_floor": float(np.quantile(spread, 0.8))}
