"""Forecast metrics: MAE, RMSE, MAPE, pinball loss, 80% interval coverage, and skill."""

from __future__ import annotations

import numpy as np

from bubblecast.forecast.base import QUANTILES


def pinball(y: np.ndarray, q: np.ndarray, tau: float) -> float:
    """Mean pinball (quantile) loss of forecasts ``q`` of quantile ``tau``."""
    d = y - q
    return float(np.mean(np.maximum(tau * d, (tau - 1.0) * d)))


def point_metrics(y: np.ndarray, q: np.ndarray) -> dict[str, float]:
    """Metrics of ``(n, 3)`` p10/p50/p90 forecasts ``q`` against targets ``y`` (finite rows).

    ``mape`` is a fraction (0.05 = 5%); ``pinball`` averages the three quantiles' losses;
    ``coverage_80`` is the share of targets inside [p10, p90].
    """
    y = np.asarray(y, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    ok = np.isfinite(y) & np.isfinite(q).all(axis=1)
    y, q = y[ok], q[ok]
    n = len(y)
    if n == 0:
        return {"n": 0, "mae": float("nan"), "rmse": float("nan"), "mape": float("nan"),
                "pinball": float("nan"), "coverage_80": float("nan")}
    err = q[:, 1] - y
    with np.errstate(divide="ignore", invalid="ignore"):
        ape = np.abs(err) / np.abs(y)
    return {
        "n": n,
        "mae": float(np.mean(np.abs(err))),
        "rmse": float(np.sqrt(np.mean(err**2))),
        "mape": float(np.mean(ape[np.isfinite(ape)])) if np.isfinite(ape).any() else float("nan"),
        "pinball": float(np.mean([pinball(y, q[:, j], t) for j, t in enumerate(QUANTILES)])),
        "coverage_80": float(np.mean((y >= q[:, 0]) & (y <= q[:, 2]))),
    }


def skill(mae: float, baseline_mae: float) -> float:
    """1 - MAE / MAE(baseline): 0 is no better than the baseline, 1 is perfect."""
    if not np.isfinite(mae) or not np.isfinite(baseline_mae) or baseline_mae <= 0:
        return float("nan")
    return float(1.0 - mae / baseline_mae)
