"""The cost model's fits, bounds and error reports, on plain arrays and cost-model rows.

:func:`fit_nonneg` fits non-negative per-layer costs in relative error (the linear learner and
the LightGBM surrogate); :func:`fit_booster` the LightGBM learner (deterministic, one thread).
Bounds are split-conformal: quantiles of observed / predicted on calibration rows stored at
:data:`LEVELS` (:func:`conformal_ratios`, :func:`ratio_at`). :func:`error_summary` is the report
every cost-model score uses; :func:`crossfit_summary` the same with out-of-sample coverage.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from bubblecast.errors import BubblecastError

#: Quantile levels at which the conformal ratio distribution is stored.
LEVELS: np.ndarray = np.round(np.arange(1, 100) / 100.0, 2)


def fit_nonneg(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Coefficients ``c >= 0`` minimising the squared *relative* error ``sum((x c - y) / y)^2``
    over the rows with a finite ``y > 0`` and finite ``x`` (columns scaled, then reduced to
    their ``R`` factor: the same solution as on all rows, at the cost of a few columns)."""
    from scipy.optimize import nnls

    ok = np.isfinite(y) & (y > 0) & np.isfinite(x).all(axis=1)
    if not ok.any():
        return np.zeros(x.shape[1])
    a = x[ok] / y[ok, None]
    scale = np.sqrt(np.mean(a * a, axis=0))
    scale[scale <= 0] = 1.0
    q, r = np.linalg.qr(a / scale)
    coef, _ = nnls(r, q.T @ np.ones(len(a)))
    return coef / scale


def fit_booster(x: np.ndarray, target: np.ndarray, names: list[str], params: dict[str, Any],
                rounds: int) -> Any:
    """A LightGBM regression booster on ``x`` (columns ``names``; ``kind`` categorical) with
    ``params`` (seed, learning rate, leaves, ...) made deterministic and single-threaded."""
    import lightgbm as lgb

    full = {"objective": "regression", **params, "deterministic": True, "force_col_wise": True,
            "num_threads": 1, "verbosity": -1}
    data = lgb.Dataset(x, target, feature_name=names,
                       categorical_feature=[n for n in names if n == "kind"])
    return lgb.train(full, data, num_boost_round=rounds)


def conformal_ratios(observed: np.ndarray, predicted: np.ndarray) -> np.ndarray:
    """Split-conformal quantiles of ``observed / predicted`` at :data:`LEVELS` (rows with both
    positive and finite): with ``n`` rows sorted, level ``a >= 0.5`` takes the
    ``ceil((n + 1) a)``-th and ``a < 0.5`` the ``floor((n + 1) a)``-th (clipped to ``1..n``),
    so a band between two levels covers at least their difference on exchangeable rows."""
    ok = np.isfinite(observed) & np.isfinite(predicted) & (observed > 0) & (predicted > 0)
    if not ok.any():
        raise BubblecastError("cost model: no rows with a positive duration to calibrate on")
    r = np.sort(observed[ok] / predicted[ok])
    n = len(r)
    k = np.where(LEVELS >= 0.5, np.ceil((n + 1) * LEVELS), np.floor((n + 1) * LEVELS))
    return r[np.clip(k.astype(np.int64), 1, n) - 1]


def ratio_at(ratios: np.ndarray, quantile: float) -> float:
    """The stored ratio quantile at ``quantile`` (linear between :data:`LEVELS`, the end
    values beyond them)."""
    if not 0.0 < quantile < 1.0:
        raise BubblecastError(f"quantiles: each must be in (0, 1), got {quantile}")
    return float(np.interp(quantile, LEVELS, ratios))


def error_summary(observed: np.ndarray, predicted: np.ndarray, lower: np.ndarray,
                  upper: np.ndarray) -> dict[str, float | int]:
    """``mae_s``, ``p50_rel_error`` and ``p90_rel_error`` (``|pred - obs| / obs``, rows with a
    positive duration), ``coverage_p10_p90`` (share of rows inside ``[lower, upper]``) and
    ``rows``, over the rows with a finite prediction."""
    ok = np.isfinite(predicted) & np.isfinite(observed)
    if not ok.any():
        raise BubblecastError("cost model: no rows it can price to score")
    y, p = observed[ok], predicted[ok]
    pos = y > 0
    rel = np.abs(p[pos] - y[pos]) / y[pos]
    inside = (y >= lower[ok]) & (y <= upper[ok])
    return {"mae_s": float(np.mean(np.abs(p - y))),
            "p50_rel_error": float(np.quantile(rel, 0.5)) if len(rel) else float("nan"),
            "p90_rel_error": float(np.quantile(rel, 0.9)) if len(rel) else float("nan"),
            "coverage_p10_p90": float(np.mean(inside)), "rows": int(ok.sum())}


def crossfit_summary(rows: pd.DataFrame, point: np.ndarray, learner: str,
                     bounds: tuple[float, float]) -> dict[str, Any]:
    """:func:`error_summary` of ``point`` on ``rows`` with cross-fitted ``bounds``: each run's
    rows are bounded by conformal ratios calibrated on the other runs (a single run: each half
    of its steps by the other half's), so the coverage is out of sample."""
    y = rows["duration_s"].to_numpy()
    runs = rows["run_id"].to_numpy()
    group = runs if len(set(runs)) > 1 else \
        (rows["step"].to_numpy() > np.median(rows["step"].to_numpy())).astype(str)
    lo, hi = np.full(len(rows), np.nan), np.full(len(rows), np.nan)
    for g in np.unique(group):
        m = group == g
        other = ~m if (~m).any() else m
        ratios = conformal_ratios(y[other], point[other])
        lo[m], hi[m] = (point[m] * ratio_at(ratios, q) for q in bounds)
    return {**error_summary(y, point, lo, hi), "learner": learner,
            "runs": int(len(set(runs)))}
