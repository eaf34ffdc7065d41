"""Per-rank speed forecasts for the predictive policy: quantiles p10/p50/p90 per horizon.

A policy asks ``forecaster.forecast(state, horizons)`` for a ``(len(horizons), P, 3)`` array
of per-rank speed (compute seconds per unit of layer cost, the partition-invariant signal).

:class:`TrendForecaster` is the built-in forecaster used when no trained model is given:
each rank's recent series, median-smoothed, is cut into linear segments (binary segmentation,
BIC); the last segment's line is extrapolated (damped, only when significant and long enough),
a level shift in the last few steps restarts from the newest value, and quantiles come from
the residuals' median absolute deviation, widening with the horizon.
A trained :mod:`bubblecast.forecast` model is adapted by :mod:`bubblecast.policy.speeds`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from bubblecast.errors import BubblecastError

Z90 = 1.2815515655446004  # standard normal 0.9 quantile


class SpeedForecaster(Protocol):
    """What the predictive policy needs from a forecaster."""

    name: str

    def forecast(self, state: Any, horizons: np.ndarray) -> np.ndarray: ...


def _line_stats(y: np.ndarray) -> np.ndarray:
    """Cumulative sums for O(1) least-squares line fits of any prefix or suffix of ``y``:
    ``(n + 1, P, 6)``, the running sums of 1, x, y, x^2, xy and y^2 (row 0 all zeros)."""
    n, p = y.shape
    x = np.broadcast_to(np.arange(n, dtype=np.float64)[:, None], (n, p))
    terms = np.stack([np.ones_like(y), x, y, x * x, x * y, y * y], axis=2)
    return np.concatenate([np.zeros((1, p, 6)), np.cumsum(terms, axis=0)])


def _fit(stats: np.ndarray, lo: np.ndarray | int, hi: np.ndarray | int
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Least-squares line on rows ``[lo, hi)`` (per column, broadcast over leading rows of
    ``lo``/``hi``): (slope, value at row hi-1, SSE, slope s.e.)."""
    lo, hi = np.atleast_2d(lo), np.atleast_2d(hi)
    cols = np.arange(stats.shape[1])
    d = stats[hi, cols] - stats[lo, cols]  # (K, P, 6)
    s, sx, sy, sxx, sxy, syy = (d[..., i] for i in range(6))
    s = np.maximum(s, 1.0)  # empty ranges only occur in masked-out candidates
    sxx_c = np.maximum(sxx - sx * sx / s, 1e-12)
    sxy_c = sxy - sx * sy / s
    slope = sxy_c / sxx_c
    sse = np.maximum(syy - sy * sy / s - sxy_c * sxy_c / sxx_c, 0.0)
    mean_x = sx / s
    end = sy / s + slope * (np.asarray(hi, dtype=np.float64) - 1 - mean_x)
    se = np.sqrt(sse / np.maximum(s - 2, 1) / sxx_c)
    return slope, end, sse, se


def _column_nanmedian(a: np.ndarray) -> np.ndarray:
    """``np.nanmedian(a, axis=0)`` for a 2-D ``a`` whose every column has a value (NaN sorts
    last), without the masked arrays ``nanmedian`` builds for small inputs."""
    ordered = np.sort(a, axis=0)
    n = np.count_nonzero(~np.isnan(a), axis=0)
    cols = np.arange(a.shape[1])
    return (ordered[(n - 1) // 2, cols] + ordered[n // 2, cols]) / 2.0


@dataclass
class TrendForecaster:
    """Robust piecewise-linear trend extrapolation of each rank's speed (the built-in baseline).

    Per rank, over the last ``trend_window`` steps smoothed by a running median of ``smooth``
    steps (which removes isolated spikes): one least-squares line, or two lines split at the
    best breakpoint when that explains the series clearly better (BIC). The forecast
    continues the last segment: its end value plus its slope, kept only when significant
    (``t_min`` standard errors) and damped by ``damping`` per step. A level shift in the last
    ``reset`` raw steps (all beyond ``band_z`` robust deviations, same side) restarts from
    them with no trend. Quantiles come from the residuals' median absolute deviation, widened
    with the horizon and the slope's uncertainty.
    """

    trend_window: int = 64
    smooth: int = 5
    min_segment: int = 6
    min_trend: int = 16
    damping: float = 0.98
    t_min: float = 3.0
    reset: int = 3
    band_z: float = 5.0
    max_breaks: int = 4
    level_window: int = 32
    penalty: float = 10.0
    name: str = "trend"

    def __post_init__(self) -> None:
        if self.trend_window < 2 * self.min_segment or self.min_segment < 3:
            raise BubblecastError("TrendForecaster: need 3 <= min_segment <= trend_window / 2")
        if self.smooth < 1 or self.smooth % 2 == 0:
            raise BubblecastError("TrendForecaster.smooth: must be an odd number >= 1")
        if not 0.0 < self.damping <= 1.0:
            raise BubblecastError(f"TrendForecaster.damping: must be in (0, 1], got {self.damping}")
        if self.reset < 1:
            raise BubblecastError("TrendForecaster.reset: must be >= 1")

    def forecast(self, state: Any, horizons: np.ndarray) -> np.ndarray:
        return self.forecast_history(np.asarray(state.history, dtype=np.float64), horizons)

    def _clean(self, raw: np.ndarray) -> np.ndarray:
        """``raw`` with isolated spikes clipped to the running median (``smooth`` steps) plus or
        minus 3 noise deviations (estimated from first differences, which level shifts and
        trends barely affect): keeps the noise independent for the segment fits."""
        if self.smooth <= 1 or raw.shape[0] < self.smooth:
            return raw
        from numpy.lib.stride_tricks import sliding_window_view

        half = self.smooth // 2
        padded = np.pad(raw, ((half, half), (0, 0)), mode="edge")
        med = np.median(sliding_window_view(padded, self.smooth, axis=0), axis=2)
        diff = np.diff(raw, axis=0)
        sig = 1.4826 * np.median(np.abs(diff - np.median(diff, axis=0)), axis=0) / np.sqrt(2)
        sig = np.maximum(sig, 1e-9 * np.abs(med).mean(axis=0))
        return np.clip(raw, med - 3 * sig, med + 3 * sig)

    def _last_segment(self, y: np.ndarray) -> tuple[np.ndarray, ...]:
        """Per column: start row of the last linear segment (binary segmentation from the
        right, each split kept when BIC prefers two lines) and its line (slope, end value,
        slope s.e.)."""
        n, p = y.shape
        m = self.min_segment
        stats = _line_stats(y)
        cols = np.arange(p)
        start = np.zeros(p, dtype=np.int64)
        end = np.full(p, n, dtype=np.int64)
        floor = 1e-12 * np.maximum(np.abs(y).mean(axis=0), 1e-12) ** 2 * n
        cuts = np.arange(m, n - m + 1)
        for _ in range(self.max_breaks):
            active = n - start >= 2 * m
            if not active.any():
                break
            a = np.broadcast_to(start[None, :], (len(cuts), p))
            c = np.broadcast_to(cuts[:, None], (len(cuts), p))
            ok = c >= a + m
            pre = _fit(stats, a, np.where(ok, c, a + m))
            post = _fit(stats, np.where(ok, c, a + m), np.full_like(c, n))
            total = np.where(ok, pre[2] + post[2], np.inf)
            best = np.argmin(total, axis=0)
            one = _fit(stats, start[None, :], end[None, :])
            k = (n - start).astype(np.float64)
            bic1 = k * np.log((one[2][0] + floor) / k) + 2 * np.log(k)
            bic2 = k * np.log((total[best, cols] + floor) / k) + 5 * np.log(k)
            split = active & (bic2 < bic1 - self.penalty)
            if not split.any():
                break
            start = np.where(split, cuts[best], start)
        slope, level, _, se = (v[0] for v in _fit(stats, start[None, :], end[None, :]))
        return start, slope, level, se

    def forecast_history(self, history: np.ndarray, horizons: np.ndarray) -> np.ndarray:
        """Quantiles ``(H, P, 3)`` from a ``(t, P)`` history (oldest first)."""
        hz = np.asarray(horizons, dtype=np.float64)[:, None]
        raw = np.atleast_2d(np.asarray(history, dtype=np.float64))[-self.trend_window:]
        if raw.shape[0] == 0:
            raise BubblecastError("forecast: no history to forecast from")
        total, p = raw.shape
        y = self._clean(raw)
        n = total
        slope, se, shown = np.zeros(p), np.zeros(p), np.zeros(p)
        first = np.zeros(p, dtype=np.int64)  # first raw row of the last segment
        level = np.median(raw[-(2 * self.reset + 1):], axis=0)
        if n >= 2 * self.min_segment:
            start, line_slope, end, line_se = self._last_segment(y)
            first = start
            seg_len = n - start
            trend = (seg_len >= self.min_trend) & (np.abs(line_slope) > self.t_min * line_se)
            slope = np.where(trend, line_slope, 0.0)
            se = np.where(trend, line_se, 0.0)
            shown = np.abs(slope) * (seg_len - 1)  # never extrapolate more than was seen
            level_trend = end
            recent = np.clip(total - first, 1, self.level_window)
            level_flat = np.array([np.median(raw[-recent[j]:, j]) for j in range(p)])
            level = np.where(trend, level_trend, level_flat)
        rows = np.arange(total)[:, None]
        fitted = level[None, :] + slope[None, :] * (rows - total + 1)
        resid = np.where(rows >= first[None, :], np.abs(raw - fitted), np.nan)
        sigma = 1.4826 * _column_nanmedian(resid)
        sigma = np.maximum(sigma, 1e-3 * np.abs(level))
        jump, jump_level, jump_sigma = self._jump(raw)
        level = np.where(jump, jump_level, level)
        sigma = np.where(jump, jump_sigma * np.abs(jump_level), sigma)  # noise is relative
        slope = np.where(jump, 0.0, slope)
        se = np.where(jump, 0.0, se)
        d = self.damping
        travel = hz if d >= 1.0 else (1.0 - d**hz) / (1.0 - d)
        change = np.clip(slope[None, :] * travel, -shown[None, :], shown[None, :])
        p50 = np.maximum(level[None, :] + change, 1e-3 * np.maximum(np.abs(level), 1e-12))
        width = Z90 * (sigma[None, :] * np.sqrt(1.0 + hz / self.trend_window) + se * travel)
        return np.stack([np.maximum(p50 - width, 0.0), p50, p50 + width], axis=2)

    def _jump(self, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Ranks whose last ``reset`` steps all left the band of the steps before them (same
        side), the latest value to restart from and the relative noise before the shift."""
        k = self.reset
        before = raw[-(k + 16):-k]
        if len(before) < 4:
            return np.zeros(raw.shape[1], dtype=bool), raw[-1], np.zeros(raw.shape[1])
        ref = np.median(before, axis=0)
        sig = np.maximum(1.4826 * np.median(np.abs(before - ref), axis=0), 1e-3 * np.abs(ref))
        tail = raw[-k:]
        jump = (np.all(tail > ref + self.band_z * sig, axis=0)
                | np.all(tail < ref - self.band_z * sig, axis=0))
        return jump, raw[-1], sig / np.maximum(np.abs(ref), 1e-12)


def model_failed(exc: BubblecastError, config: Any, builtin: str) -> str:
    """What offline evaluation does when the trained model cannot forecast a run: with
    ``config.fallback`` (``"trend"``) the built-in forecaster (described by ``builtin``) takes
    over and the returned note says so; without, ``exc`` is raised again, naming the flag
    that would allow it. Never a silent fall-back."""
    if getattr(config, "fallback", None) is None:
        raise BubblecastError(f"{exc} (--fallback trend evaluates it with the built-in "
                              "forecaster instead)") from None
    return f"model not usable on this run ({exc}); fell back to the {builtin} (--fallback trend)"


class WithDeviceMetrics:
    """A trained forecast model whose features frames get the device-metric covariates of the
    runs it forecasts (offline evaluation: the dataset builder's frame of a run is built
    from its events alone; the covariates come from its ``device_metrics`` rows, by the
    dataset's own code, :func:`bubblecast.dataset.covariates.metric_features`).

    Every attribute is the model's; only :meth:`predict` differs. ``config``: the
    DatasetConfig the model was trained with (:func:`bubblecast.policy.speeds.
    model_dataset_config`); ``missing``: why the run lacks an input the model reads (then
    :meth:`predict` raises it as a BubblecastError).
    """

    def __init__(self, model: Any, events_frame: Any, metrics: Any, config: Any,
                 missing: str | None = None) -> None:
        self.model = model
        self.events_frame = events_frame
        self.metrics = metrics
        self.config = config
        self.missing = missing

    def __getattr__(self, name: str) -> Any:
        if name in ("model", "events_frame", "metrics", "config", "missing"):  # not yet set
            raise AttributeError(name)
        return getattr(self.model, name)

    def predict(self, frame: Any, horizons: Any = None) -> Any:
        from bubblecast.dataset.covariates import metric_features

        if self.missing is not None:
            raise BubblecastError(self.missing)
        if self.metrics is None or len(self.metrics) == 0:
            return self.model.predict(frame, horizons)
        return self.model.predict(metric_features(frame, self.events_frame, self.metrics,
                                                  self.config), horizons)
