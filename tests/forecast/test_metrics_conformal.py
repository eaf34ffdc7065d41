"""Metrics against hand computations; conformal shifts reach the target coverage."""

from __future__ import annotations

import numpy as np

from bubblecast.forecast.conformal import apply_shifts, conformal_shifts
from bubblecast.forecast.error_metrics import pinball, point_metrics, skill


def test_point_metrics_match_hand_computation():
    y = np.array([1.0, 2.0, 4.0, np.nan])
    q = np.array([[0.5, 1.0, 1.5], [1.0, 3.0, 3.5], [2.0, 3.0, 3.5], [0.0, 1.0, 2.0]])
    m = point_metrics(y, q)
    assert m["n"] == 3
    assert np.isclose(m["mae"], (0 + 1 + 1) / 3)
    assert np.isclose(m["rmse"], np.sqrt(2 / 3))
    assert np.isclose(m["mape"], (0 + 0.5 + 0.25) / 3)
    assert np.isclose(m["coverage_80"], 2 / 3)  # 4.0 is above p90 = 3.5
    # pinball at 0.1 for the p10 column: d = y - q = 0.5, 1.0, 2.0 -> 0.1 * d
    assert np.isclose(pinball(y[:3], q[:3, 0], 0.1), 0.1 * (0.5 + 1.0 + 2.0) / 3)
    # at 0.9 for p90: d = -0.5, -1.5, 0.5 -> 0.1*0.5, 0.1*1.5, 0.9*0.5
    assert np.isclose(pinball(y[:3], q[:3, 2], 0.9), (0.05 + 0.15 + 0.45) / 3)


def test_skill_is_relative_mae_reduction():
    assert np.isclose(skill(0.7, 1.0), 0.3)
    assert skill(1.0, 1.0) == 0.0
    assert np.isnan(skill(1.0, 0.0))


def test_conformal_shifts_give_the_target_coverage_on_new_data():
    rng = np.random.default_rng(0)
    n = 20000
    scale = rng.uniform(0.5, 2.0, size=2 * n)
    y = rng.normal(0, scale)
    # Quantile forecasts far too narrow and biased: raw coverage is poor.
    lo, hi = np.full(2 * n, -0.3) + 0.2, np.full(2 * n, 0.3) + 0.2
    raw = np.mean((y[n:] >= lo[n:]) & (y[n:] <= hi[n:]))
    assert raw < 0.5
    shifts = conformal_shifts(lo[:n], hi[:n], y[:n], coverage=0.8)
    q = apply_shifts(np.column_stack([lo, np.zeros(2 * n), hi])[n:], shifts)
    inside = (y[n:] >= q[:, 0]) & (y[n:] <= q[:, 2])
    assert 0.79 < inside.mean() < 0.81
    assert 0.09 < np.mean(y[n:] < q[:, 0]) < 0.11  # each tail gets about 10%


def test_conformal_narrows_intervals_that_are_too_wide():
    rng = np.random.default_rng(1)
    y = rng.normal(size=5000)
    s_lo, s_hi = conformal_shifts(np.full(5000, -10.0), np.full(5000, 10.0), y)
    assert s_lo < -8 and s_hi < -8


def test_interval_mode_keeps_the_calibrated_bounds_when_the_median_is_biased():
    from bubblecast.forecast.conformal import apply_grouped, grouped_shifts

    rng = np.random.default_rng(2)
    n = 20000
    y = rng.normal(0, 1, size=2 * n)
    # Median forecast biased up by 1.5 sd, p10-p90 far too wide around it.
    q = np.column_stack([np.full(2 * n, -3.0), np.full(2 * n, 1.5), np.full(2 * n, 4.0)])
    groups = np.zeros(2 * n, dtype=np.int64)
    shifts = grouped_shifts(q[:n, 0], q[:n, 2], y[:n], groups[:n], 0.8)
    new = apply_grouped(q[n:], shifts, groups[n:], "interval")
    old = apply_grouped(q[n:], shifts, groups[n:], "shift")
    inside = np.mean((y[n:] >= new[:, 0]) & (y[n:] <= new[:, 2]))
    assert 0.79 < inside < 0.81
    assert np.all((new[:, 0] <= new[:, 1]) & (new[:, 1] <= new[:, 2]))
    # The old mode clips p90 at the biased median: the narrowing is undone, over-covering.
    assert np.mean((y[n:] >= old[:, 0]) & (y[n:] <= old[:, 2])) > 0.83
