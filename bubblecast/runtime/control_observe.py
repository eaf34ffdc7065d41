"""What the live policies observe: robust per-rank speeds, a live-tuned trend forecaster, and
the hysteresis defaults of the closed loop. No torch (unit-testable on its own).

Live step times on a shared CPU machine are noisy (one descheduled op stretches a rank's step
by 50 % and more; ``benchmarks/results/live.json``), so a policy that reads the last step, or
a 10-step mean, reacts to noise: it thrashes, and a 5 % threshold sits below the noise.

- :func:`robust_speeds`: each rank's speed (compute seconds per unit of layer cost held, per
  micro-batch: already normalised by what the rank holds, so it does not jump when layers
  move) passed through a *causal* running median of ``smooth`` steps. An isolated spike never
  reaches the policy; a real change shows after ``smooth // 2 + 1`` steps; a ramp is delayed
  by ``smooth // 2`` steps and keeps its slope. Both the reactive and the predictive policy
  read this series, so the comparison is fair.
- :class:`RawHistoryForecaster` / :func:`live_forecaster`: the predictive policy's built-in
  forecaster is the policy module's :class:`TrendForecaster`, which does its own robust
  aggregation (running-median clipping, BIC segmentation, MAD quantiles) and whose trend
  significance test needs independent noise: it reads the *raw* per-step speeds (a
  median-smoothed series has correlated residuals and shows trends that are not there), set
  by the controller before each decision, and only those since the partition last changed
  (:func:`since_last_move`): with a fixed per-rank overhead, a rank's speed per unit of work
  shifts when its share changes, and a trend line across a move would extrapolate that shift.
- Relative speeds (``relative=True``, the live default): load bursts of this shared machine
  slow *both* ranks (unevenly), and a per-rank trend test then keeps one rank's burst-made
  trend or level shift and not the other's: a fake imbalance (live false alarms at steps 32
  and 52 in earlier runs; on seeded bursty stationary series the per-rank forecaster moved on
  46 of 48, the relative one on 3). The forecaster reads each rank's speed
  relative to the ranks' geometric mean (what the partition choice depends on; a common
  load swing cancels) and scales it back by the recent median common level.
- :data:`LIVE_POLICY_DEFAULTS`: the predictive policy's hysteresis in the live loop: no
  decision before ``min_history`` steps, a move must gain ``min_gain`` per step (above the
  noise of a window median), then the policy holds ``hold_decisions`` decision periods: it
  never oscillates at the decision rate.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: Predictive-policy knobs of the live loop (explicit ``policy_params`` win).
LIVE_POLICY_DEFAULTS: dict[str, Any] = {"min_gain": 0.05, "hold_decisions": 2,
                                        "min_history": 30}
#: Steps whose median common level scales the relative forecast back to speeds.
LEVEL_WINDOW = 10


def robust_speeds(speeds: np.ndarray, smooth: int) -> np.ndarray:
    """``(T, P)`` speeds -> their causal running median over ``smooth`` steps (row ``t`` is
    the median of rows ``t - smooth + 1 .. t``; the first rows use what exists)."""
    x = np.asarray(speeds, dtype=np.float64)
    if smooth <= 1 or x.shape[0] == 0:
        return x.copy()
    from numpy.lib.stride_tricks import sliding_window_view

    padded = np.concatenate([np.full((smooth - 1, x.shape[1]), np.nan), x], axis=0)
    windows = sliding_window_view(padded, smooth, axis=0)  # (T, P, smooth)
    return np.nanmedian(windows, axis=2)


def window_speed(history: np.ndarray, window: int) -> np.ndarray:
    """Median per rank over the last ``window`` rows (what a decision record reports)."""
    return np.median(np.asarray(history)[-window:], axis=0)


class RawHistoryForecaster:
    """A history forecaster (``forecast_history(history, horizons)``) that reads
    :attr:`history` (raw per-step speeds, set before each decision) instead of the state's
    smoothed one; the state's when none is set. ``relative``: forecast each rank's speed
    relative to the ranks' geometric mean, times the recent median common level (see the
    module docstring)."""

    def __init__(self, inner: Any, relative: bool = False) -> None:
        self.inner = inner
        self.relative = relative
        self.name = str(getattr(inner, "name", type(inner).__name__))
        self.history: np.ndarray | None = None

    def forecast(self, state: Any, horizons: np.ndarray) -> np.ndarray:
        if self.history is None or len(self.history) == 0:
            if not self.relative:
                return self.inner.forecast(state, horizons)
            history = np.asarray(state.history, dtype=np.float64)
        else:
            history = np.asarray(self.history, dtype=np.float64)
        if not self.relative or history.ndim != 2 or history.shape[1] < 2:
            return self.inner.forecast_history(history, horizons)
        logs = np.log(np.maximum(history, 1e-300))
        common = logs.mean(axis=1)
        q = self.inner.forecast_history(np.exp(logs - common[:, None]), horizons)
        return q * float(np.exp(np.median(common[-LEVEL_WINDOW:])))


def since_last_move(raw: np.ndarray, partitions: np.ndarray, least: int = 12) -> np.ndarray:
    """The rows of ``raw`` observed under the current partition (the last row's), or the last
    ``least`` rows when fewer (right after a move)."""
    if len(partitions) == 0:
        return raw
    same = np.all(partitions == partitions[-1], axis=1)
    changed = np.flatnonzero(~same)
    first = int(changed[-1]) + 1 if len(changed) else 0
    return raw[min(first, max(len(raw) - least, 0)):]


def live_forecaster() -> RawHistoryForecaster:
    """The built-in trend forecaster on the raw speed series, relative to the ranks' common
    level."""
    from bubblecast.policy.forecasting import TrendForecaster

    return RawHistoryForecaster(TrendForecaster(), relative=True)


def predictive_params(params: dict[str, Any], every: int) -> dict[str, Any]:
    """``PredictivePolicy`` keyword arguments of the live loop: the defaults above (``hold``
    in steps: ``hold_decisions`` x ``every``), then ``params``."""
    d = LIVE_POLICY_DEFAULTS
    out = {"min_gain": d["min_gain"], "hold": d["hold_decisions"] * every,
           "min_history": d["min_history"]}
    out.update(params)
    return out
