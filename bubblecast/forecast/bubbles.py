"""Predicted bubble fraction: replay the schedule with forecast stage times.

For each (run, replica, target step) whose every stage has a forecast, each stage's forecast
compute seconds (p50 of ``y`` times the work it will hold) are spread over its ops in the
run's F/B/W time shares and timed on the run's schedule by :mod:`bubblecast.sim.steptime`.
The same is done with the stage times that actually happened, so the comparison isolates the
forecast's error from the op-share approximation.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd


def _bubble_fraction(info: dict[str, Any], totals: np.ndarray) -> np.ndarray:
    """Bubble fraction per row of ``totals`` ``(batch, stages)`` (compute seconds per stage),
    timed by :mod:`bubblecast.sim.steptime` with the run's F/B/W op shares as weights."""
    from bubblecast.sim.steptime import stage_op_durations, step_times, timing_shape

    shape = timing_shape(info["schedule"], int(info["stages"]), int(info["microbatches"]),
                         int(info["chunks"]), float(info.get("comm_s", 0.0)))
    share = info["op_share"]
    weights = (share.get("F", 0.0), share.get("B", 0.0), share.get("W", 0.0))
    return step_times(shape, stage_op_durations(shape, totals, weights))[1]


def bubble_table(frame: pd.DataFrame, preds: dict[int, np.ndarray],
                 run_info: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """Rows (run_id, replica, step, horizon, predicted, actual): bubble fraction at step+h."""
    out = []
    runs = frame["run_id"].astype(str).to_numpy()
    for run_id in pd.unique(runs):
        info = run_info.get(run_id)
        if not info or info.get("schedule") not in ("gpipe", "1f1b", "interleaved", "zb-h1",
                                                     "zb-h2") or not info.get("op_share"):
            continue
        rows = np.flatnonzero(runs == run_id)
        sub = frame.iloc[rows]
        stages = int(info["stages"])
        for h, q in preds.items():
            work = sub[f"work_h{h}"].to_numpy(dtype=np.float64)
            part = pd.DataFrame({"replica": sub["replica"].to_numpy(),
                                 "step": sub["step"].to_numpy(), "stage": sub["stage"].to_numpy(),
                                 "pred": q[rows, 1] * work, "actual": sub[f"s_h{h}"].to_numpy()})
            wide = part.pivot_table(index=["replica", "step"], columns="stage",
                                    values=["pred", "actual"], aggfunc="first")
            if wide.empty or wide["pred"].shape[1] != stages:
                continue
            wide = wide.dropna()
            if wide.empty:
                continue
            pred = _bubble_fraction(info, wide["pred"].to_numpy())
            actual = _bubble_fraction(info, wide["actual"].to_numpy())
            idx = wide.index.to_frame(index=False)
            out.append(pd.DataFrame({"run_id": run_id, "replica": idx["replica"],
                                     "step": idx["step"] + h, "horizon": h,
                                     "predicted": pred, "actual": actual}))
    if not out:
        return pd.DataFrame(columns=["run_id", "replica", "step", "horizon", "predicted",
                                     "actual"])
    return pd.concat(out, ignore_index=True)


def bubble_metrics(table: pd.DataFrame) -> pd.DataFrame:
    """Per horizon: MAE of the predicted bubble fraction, and the mean predicted and actual."""
    if table.empty:
        return pd.DataFrame(columns=["horizon", "n", "mae", "predicted", "actual"])
    err = (table["predicted"] - table["actual"]).abs()
    return (table.assign(err=err).groupby("horizon")
            .agg(n=("err", "size"), mae=("err", "mean"), predicted=("predicted", "mean"),
                 actual=("actual", "mean")).reset_index())
