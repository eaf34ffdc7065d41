"""Slow-rank detection: compute anomalously slow against peers or against the rank's history.

Per (step, rank) the compute time T (sum of F, B and W durations; these never include waiting)
is compared on a log scale two ways:

- *peers*: against the median of the other ranks at the same stage in the same step (other
  replicas; with two replicas, the other one);
- *history*: against the rank's own low quartile over the run, after removing each step's
  global factor (the median over ranks of their deviation from their own typical level, so a
  step where every rank works harder, e.g. longer sequences, flags nobody).

A step is anomalous for a rank when a deviation exceeds both ``log(1 + min_slowdown)`` and
``z`` robust standard deviations (1.4826 MAD, pooled over all ranks so that one bad rank
cannot hide itself). A rank is reported when it is anomalous for ``min_steps`` logged steps in
a row (every step, when the run has fewer). A rank slow for the whole run with no peer at its
stage (one replica) cannot be told from a heavy stage and is not reported.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from bubblecast.telemetry.schema import COMPUTE_OPS


@dataclass
class SlowRankConfig:
    """Thresholds of :func:`detect_slow_ranks` (see the module docstring)."""

    min_slowdown: float = 0.1
    z: float = 4.0
    min_steps: int = 3
    history_quantile: float = 0.25

    def __post_init__(self) -> None:
        if not self.min_slowdown > 0:
            raise ValueError(f"SlowRankConfig.min_slowdown must be > 0, got {self.min_slowdown}")
        if not self.z >= 0:
            raise ValueError(f"SlowRankConfig.z must be >= 0, got {self.z}")
        if self.min_steps < 1:
            raise ValueError(f"SlowRankConfig.min_steps must be >= 1, got {self.min_steps}")
        if not 0.0 <= self.history_quantile <= 0.5:
            raise ValueError("SlowRankConfig.history_quantile must be in [0, 0.5]")


def rank_compute(frame: pd.DataFrame) -> pd.DataFrame:
    """Compute seconds per step (rows, sorted) and rank (columns)."""
    comp = frame.loc[frame["op"].isin(COMPUTE_OPS), ["step", "rank", "duration_s"]]
    return comp.groupby(["step", "rank"])["duration_s"].sum().unstack("rank").sort_index()


def _robust_scale(x: np.ndarray) -> float:
    x = x[np.isfinite(x)]
    if not x.size:
        return 0.0
    return float(1.4826 * np.median(np.abs(x - np.median(x))))


def _peer_deviation(logt: np.ndarray, stage: np.ndarray) -> np.ndarray:
    """log T minus the median of the same stage's other ranks, per step; NaN without peers."""
    dev = np.full_like(logt, np.nan)
    for s in np.unique(stage):
        cols = np.flatnonzero(stage == s)
        if cols.size < 2:
            continue
        block = logt[:, cols]
        if cols.size == 2:
            ref = block[:, ::-1]
        else:
            ref = np.repeat(np.nanmedian(block, axis=1, keepdims=True), cols.size, axis=1)
        dev[:, cols] = block - ref
    return dev


def _history_deviation(logt: np.ndarray, quantile: float) -> np.ndarray:
    """log T minus the rank's own low quantile, after removing each step's global factor."""
    if np.isnan(logt).all(axis=0).any():  # a rank without compute in every step: ignore it
        logt = np.where(np.isnan(logt).all(axis=0, keepdims=True), 0.0, logt)
    own = np.nanmedian(logt, axis=0, keepdims=True)
    factor = np.nanmedian(logt - own, axis=1, keepdims=True)
    adjusted = logt - factor
    return adjusted - np.nanquantile(adjusted, quantile, axis=0, keepdims=True)


def _longest_run(flags: np.ndarray) -> np.ndarray:
    """Longest run of consecutive True per column."""
    best = np.zeros(flags.shape[1], dtype=np.int64)
    cur = np.zeros(flags.shape[1], dtype=np.int64)
    for row in flags:
        cur = np.where(row, cur + 1, 0)
        best = np.maximum(best, cur)
    return best


def detect_slow_ranks(frame: pd.DataFrame, config: SlowRankConfig | None = None
                      ) -> list[dict[str, Any]]:
    """Slow ranks of one run: ``[{"rank", "stage", "replica", "slowdown", "steps",
    "first_step", "last_step", "against"}]``, slowest first; empty when none."""
    cfg = config or SlowRankConfig()
    with warnings.catch_warnings():  # all-NaN slices (a stage missing from a step) are fine
        warnings.simplefilter("ignore", RuntimeWarning)
        return _detect(frame, cfg)


def _detect(frame: pd.DataFrame, cfg: SlowRankConfig) -> list[dict[str, Any]]:
    table = rank_compute(frame)
    if table.empty:
        return []
    ranks = table.columns.to_numpy(np.int64)
    roles = frame.drop_duplicates("rank").set_index("rank").loc[ranks, ["stage", "replica"]]
    with np.errstate(divide="ignore"):
        logt = np.log(table.to_numpy(np.float64))
    logt[~np.isfinite(logt)] = np.nan
    floor = np.log1p(cfg.min_slowdown)
    flags, devs = [], []
    for name, dev in (("peers", _peer_deviation(logt, roles["stage"].to_numpy())),
                      ("history", _history_deviation(logt, cfg.history_quantile))):
        scale = _robust_scale(dev.ravel())
        anomalous = (dev > floor) & (dev > cfg.z * scale)
        flags.append(np.nan_to_num(anomalous, nan=0).astype(bool))
        devs.append((name, dev))
    anomalous = flags[0] | flags[1]
    need = min(cfg.min_steps, len(table))
    hit = np.flatnonzero(_longest_run(anomalous) >= need)
    steps = table.index.to_numpy()
    out = []
    for col in hit:
        rows = anomalous[:, col]
        against = [name for (name, _), f in zip(devs, flags, strict=True) if f[:, col].any()]
        dev = np.fmax.reduce([np.where(f[:, col], d[:, col], np.nan)
                              for (_, d), f in zip(devs, flags, strict=True)])
        out.append({
            "rank": int(ranks[col]), "stage": int(roles["stage"].iloc[col]),
            "replica": int(roles["replica"].iloc[col]),
            "slowdown": float(np.exp(np.nanmedian(dev[rows]))), "steps": int(rows.sum()),
            "first_step": int(steps[rows][0]), "last_step": int(steps[rows][-1]),
            "against": "+".join(against),
        })
    return sorted(out, key=lambda r: -r["slowdown"])
