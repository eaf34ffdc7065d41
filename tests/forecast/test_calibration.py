"""Calibration that holds on new runs: regime (Mondrian) conformal shifts, real LightGBM and GRU
models on held-out seeds, and adaptive conformal inference (ACI) online.

The claim: p10-p90 coverage in [0.78, 0.82] on runs of new seeds. A held-out coverage is a
noisy reading of the model's true coverage, and neighbouring steps share their errors, so the
runs, not the rows, set its standard error: with per-run coverages of standard deviation
``sd`` over ``n_test`` held-out runs, and shifts fitted on ``n_cal`` calibration runs drawn
alike, ``se = sd x sqrt(1 / n_test + 1 / n_cal)``. Each test computes ``sd`` from its own
held-out runs, states ``se`` in its failure message and asserts the reading within the band
widened by two standard errors, ``[0.78 - 2 se, 0.82 + 2 se]``; it also bounds ``se`` itself
(:data:`MAX_SE`), so that a calibration whose runs scatter widely cannot pass by inflating it.

The fixture (``make test`` size): 8 scenarios x 3 runs of 160 steps, one replica of 4 stages,
suite seed 1 for training and seed 2 held out (24 runs, about 9,600 / 9,200 / 8,700 rows at
h = 1 / 5 / 10). The GRU fits on 13 runs, early-stops on 4 and calibrates on the other 7;
LightGBM (``lgbm.py``) early-stops on 4 and calibrates on those 4 and 4 more. Measured there
(``sd`` of per-run coverage 0.09-0.12): the GRU reads 0.823 / 0.835 / 0.812 with se 0.050 /
0.039 / 0.043, LightGBM 0.772 / 0.785 / 0.781 with se 0.040 / 0.037 / 0.041, so the asserted
intervals are about [0.70, 0.90]. The band's own +-0.02 needs se <= 0.01, i.e. about 100
calibration runs and 100 held-out runs with per-run sd 0.1: the calibration runs, not the
held-out rows, bound what one trained model's reading can show. No test trains at that size;
``benchmarks/calibration_spread.py`` reports the readings over training and held-out seeds,
each with its se, per horizon and scenario.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest

from bubblecast.dataset import DatasetConfig, build_dataset
from bubblecast.forecast.conformal import (
    AdaptiveConformal,
    apply_grouped,
    calibration_groups,
    conformal_shifts,
    regime_ids,
    regime_shifts,
    regime_window,
    row_groups,
)
from bubblecast.forecast.suite import TRAINING, SuiteConfig, suite_events

BAND = (0.78, 0.82)
#: Largest standard error a held-out reading may have for the test to mean anything.
MAX_SE = 0.06
CONFIG = DatasetConfig()  # horizons 1, 5, 10 as the shipped model


def _frame(seed: int, runs: int = 3, steps: int = 160, scenarios=TRAINING) -> pd.DataFrame:
    return build_dataset(suite_events(SuiteConfig(scenarios=scenarios, runs=runs, steps=steps,
                                                  replicas=1, seed=seed)), CONFIG)[0]


@pytest.fixture(scope="module")
def frames():
    return _frame(1), _frame(2)


def held_out_coverage(model, frame: pd.DataFrame) -> dict[int, tuple[float, float, int]]:
    """Per horizon: ``(coverage, sd of the per-run coverages, runs)`` on ``frame``."""
    pred = model.predict_signal(frame, model.horizons_)
    out = {}
    for h in model.horizons_:
        y = frame[f"y_h{h}"].to_numpy(float)
        ok = np.isfinite(y)
        inside = pd.Series((y >= pred[h][:, 0]) & (y <= pred[h][:, 2]))[ok]
        per_run = inside.groupby(frame["run_id"].astype(str).to_numpy()[ok]).mean()
        out[h] = (float(inside.mean()), float(per_run.std(ddof=1)), len(per_run))
    return out


def assert_in_band(cov: dict[int, tuple[float, float, int]], n_cal: int) -> None:
    """Each horizon's reading within the band widened by 2 se (module doc)."""
    assert set(cov) == {1, 5, 10}
    for h, (c, sd, n_test) in cov.items():
        se = sd * np.sqrt(1 / n_test + 1 / n_cal)
        what = f"h{h}: coverage {c:.3f}, se {se:.3f} ({n_test} held-out, {n_cal} cal runs)"
        assert se <= MAX_SE, what
        assert BAND[0] - 2 * se <= c <= BAND[1] + 2 * se, what


def _heteroscedastic(n: int, seed: int) -> tuple[np.ndarray, ...]:
    """Rows of three volatility regimes (sd 0.2, 1, 5) whose raw intervals are all the same
    width: ``(q, y, regime values)``."""
    rng = np.random.default_rng(seed)
    sd = rng.choice([0.2, 1.0, 5.0], size=n)
    y = rng.normal(0.0, sd)
    q = np.tile([-1.0, 0.0, 1.0], (n, 1))
    values = np.log(sd * rng.uniform(0.8, 1.25, size=n))  # an observed, noisy volatility
    return q, y, values


def test_regime_shifts_cover_each_volatility_regime_not_only_the_average():
    n = 30_000
    q, y, values = _heteroscedastic(2 * n, seed=0)
    fit, new = slice(0, n), slice(n, None)
    shifts = regime_shifts(q[fit, 0], q[fit, 2], y[fit], values[fit], bins=3)
    assert len(shifts["edges"]) == 2
    out = apply_grouped(q[new], shifts, regime_ids(shifts, values[new]), "interval")
    inside = (y[new] >= out[:, 0]) & (y[new] <= out[:, 2])
    pooled = apply_grouped(q[new], {"all": conformal_shifts(q[fit, 0], q[fit, 2], y[fit])},
                           np.zeros(n, dtype=np.int64), "interval")
    pooled_in = (y[new] >= pooled[:, 0]) & (y[new] <= pooled[:, 2])
    # 10,000 rows a regime: binomial se sqrt(0.16 / 10,000) = 0.004 (plus the fit's, alike)
    for level in (0.2, 1.0, 5.0):
        sel = np.isclose(np.exp(values[new]) / level, 1.0, atol=0.3)
        assert abs(inside[sel].mean() - 0.8) < 0.02, level
    # a single pooled shift over-covers the quiet rows and under-covers the volatile ones
    quiet, loud = values[new] < np.log(0.5), values[new] > np.log(3.0)
    assert pooled_in[quiet].mean() > 0.95 and pooled_in[loud].mean() < 0.6


def test_regime_groups_unknown_values_and_the_older_token_scheme():
    q, y, values = _heteroscedastic(3000, seed=1)
    values[:500] = np.nan  # e.g. the first steps of a series, before a 20-step window
    shifts = regime_shifts(q[:, 0], q[:, 2], y, values, bins=5, window=20)
    ids = regime_ids(shifts, values)
    assert set(ids[:500]) == {len(shifts["edges"]) + 1}  # their own group
    assert str(len(shifts["edges"]) + 1) in shifts  # 500 rows: enough for its own shifts
    few = regime_shifts(q[:300, 0], q[:300, 2], y[:300], values[:300], bins=5)
    assert few["edges"] == ()  # too few rows for bins: one group (and "all")
    frame = pd.DataFrame({"f_u_std_w20": [0.01, np.nan], "level": [1.0, 1.0],
                          "f_tokens_ratio": [np.nan, 1.2]})
    assert list(row_groups(shifts, frame)) == [int(np.digitize(np.log(0.01), shifts["edges"])),
                                               len(shifts["edges"]) + 1]
    older = {"all": (0.0, 0.0), "0": (0.1, 0.1), "1": (0.2, 0.2)}  # no "edges": token groups
    assert list(row_groups(older, frame)) == list(calibration_groups(frame)) == [0, 1]
    # the volatility column: the window nearest 20 the features have, else none (NaN group)
    assert regime_window(["f_u_std_w5", "f_u_std_w24", "f_u_std_w60", "x"]) == 24
    assert regime_window(["f_u_std_w10", "f_u_std_w30"]) == 30
    assert regime_window(["f_u_mean_w20"]) is None
    unwindowed = regime_shifts(q[:, 0], q[:, 2], y, values, bins=5)
    assert set(row_groups(unwindowed, frame)) == {len(unwindowed["edges"]) + 1}


def test_gru_held_out_coverage(frames):
    pytest.importorskip("torch")
    from bubblecast.forecast.seq import SeqForecaster

    train, held = frames
    model = SeqForecaster(epochs=6, hidden=16, seed=0).fit(train)
    assert all("edges" in s for s in model.shifts_.values())  # regime scheme
    assert_in_band(held_out_coverage(model, held), n_cal=7)


def test_lightgbm_held_out_coverage(frames):
    """LightGBM as ``lgbm.py`` fits it (regime groups on its own calibration runs)."""
    from bubblecast.forecast.lgbm import LGBMForecaster

    train, held = frames
    model = LGBMForecaster(n_estimators=60, seed=0).fit(train)
    assert all("edges" in s for s in model.shifts_.values())  # regime scheme
    assert_in_band(held_out_coverage(model, held), n_cal=7)  # 30% of 24 runs


def _aci_online(aci: AdaptiveConformal, level: np.ndarray, raw: np.ndarray) -> list[float]:
    """Per origin, the share of ranks inside ``aci``'s adjusted one-step interval."""
    inside = []
    for t in range(len(level) - 1):
        aci.observe(level[: t + 1], t)
        q = aci.adjust(raw, [1], t)[0]  # (P, 3)
        inside.append(float(np.mean((level[t + 1] >= q[:, 0]) & (level[t + 1] <= q[:, 2]))))
    return inside


def test_aci_brings_a_miscalibrated_forecast_to_80_percent_online():
    rng = np.random.default_rng(0)
    T, P = 4000, 4
    level = np.exp(rng.normal(0, 0.02, size=(T, P)))  # the truth: log-normal, sd 0.02
    raw = np.stack([np.full((1, P), np.exp(-0.005)), np.ones((1, P)),
                    np.full((1, P), np.exp(0.005))], axis=2)  # p10-p90 far too narrow
    for aci in (AdaptiveConformal(coverage=0.8), AdaptiveConformal(gamma=0.02, gamma_start=0.3)):
        inside = _aci_online(aci, level, raw)
        late = np.mean(inside[T // 2:])
        assert np.mean(inside[:3]) < 0.5  # raw intervals cover far less
        # After the burn-in, coverage is 0.8 up to the noise of 2000 x 4 indicators (ACI's
        # own oscillation included): 0.8 +- 0.02.
        assert abs(late - 0.8) < 0.02
        assert abs(aci.coverage_by_horizon()[1] - np.mean(inside)) < 0.01
    with pytest.raises(ValueError):
        AdaptiveConformal(coverage=1.5)
    with pytest.raises(ValueError):
        AdaptiveConformal(gamma=0.1, gamma_start=0.05)


def test_aci_decaying_step_reaches_the_target_sooner_than_the_constant_one():
    rng = np.random.default_rng(1)
    T, P = 300, 4  # a short run: the first 300 steps are all a constant step 0.02 gets
    level = np.exp(rng.normal(0, 0.02, size=(T, P)))
    raw = np.stack([np.full((1, P), np.exp(-0.005)), np.ones((1, P)),
                    np.full((1, P), np.exp(0.005))], axis=2)
    decaying = np.mean(_aci_online(AdaptiveConformal(gamma_start=0.3), level, raw))
    constant = np.mean(_aci_online(AdaptiveConformal(), level, raw))  # the default: 0.02
    assert constant < 0.7  # still far below 0.8 over the run
    assert abs(decaying - 0.8) < 0.05  # 300 x 4 indicators and the burn-in
    aci = AdaptiveConformal(gamma=0.02, gamma_start=0.3, decay=60.0)
    assert aci.step(0) == pytest.approx(0.3)
    assert aci.step(60) == pytest.approx(0.02 + 0.28 / np.e)
    assert aci.step(10_000) == pytest.approx(0.02)
    assert AdaptiveConformal(gamma=0.05).step(0) == 0.05  # constant by default


def test_aci_ignores_earlier_origins_and_narrows_too_wide_intervals():
    aci = AdaptiveConformal(coverage=0.8, gamma=0.05)
    wide = np.stack([np.full((1, 2), 0.5), np.ones((1, 2)), np.full((1, 2), 2.0)], axis=2)
    hist = np.ones((300, 2))
    for t in range(200):
        aci.observe(hist[: t + 1], t)
        aci.adjust(wide, [1], t)
    assert aci.log_scale[1] < -0.5  # every value inside: the intervals narrow
    before = aci.pending()
    aci.adjust(wide, [1], 50)  # a backtest at an earlier origin records nothing
    assert aci.pending() == before and aci.last_origin == 199


def test_aci_scores_horizons_longer_than_its_memory():
    aci = AdaptiveConformal(coverage=0.8, gamma=0.1, keep=8)
    narrow = np.stack([np.full((1, 2), 0.99), np.ones((1, 2)), np.full((1, 2), 1.01)], axis=2)
    hist = np.full((100, 2), 2.0)  # every value outside: each scored interval is a miss
    for t in range(40):
        aci.observe(hist[: t + 1], t)
        aci.adjust(narrow, [20], t)
    assert aci.scored[20] == 40 - 20  # origins 0..19 reached their targets
    assert aci.log_scale[20] == pytest.approx(20 * 0.1 * (1.0 - 0.2))  # 20 misses


def test_aci_state_stays_the_same_size_over_a_long_run():
    # the service keeps one per run for as long as the run sends requests
    aci = AdaptiveConformal(coverage=0.8, gamma=0.05, keep=16)
    q = np.stack([np.full((2, 3), 0.9), np.ones((2, 3)), np.full((2, 3), 1.1)], axis=2)
    hist = np.random.default_rng(0).lognormal(0.0, 0.1, (5000, 3))
    sizes = []
    for t in range(5000):
        aci.observe(hist[: t + 1], t)
        aci.adjust(q, [1, 10], t)
        if t in (1000, 4999):
            sizes.append((aci.pending(), len(aci.scored), len(aci.miss_sum),
                          len(aci.log_scale)))
    assert sizes[0] == sizes[1] == (1 + 10, 2, 2, 2)  # unscored: origin t at h1, t-9..t at h10
    assert aci.scored == {1: 4999, 10: 4990}
    assert 0.7 < aci.coverage_by_horizon()[10] < 0.9


def _served_online(speed: np.ndarray, aci: AdaptiveConformal | None = None,
                   horizons: tuple[int, ...] = (1,)) -> Any:
    """A ``ModelSpeeds`` over a table whose p10-p90 is three times too narrow for ``speed``
    (log-sd 0.03), asked at every origin of the run (with ``aci`` in place of the served one
    when given)."""
    from types import SimpleNamespace

    from bubblecast.policy.forecasting import TrendForecaster
    from bubblecast.policy.speeds import ModelSpeeds

    T, P = speed.shape
    table = np.ones((T, 1, P, 3))
    table[..., 0], table[..., 2] = np.exp(-0.01), np.exp(0.01)
    fc = ModelSpeeds(table=table, table_horizons=[1], fallback=TrendForecaster())
    if aci is not None:
        fc.aci = aci
    for t in range(T - 1):
        fc.forecast(SimpleNamespace(t=t, history=speed[: t + 1]), np.array(horizons))
    return fc


def test_model_speeds_recalibrate_online_with_aci():
    rng = np.random.default_rng(3)
    speed = np.exp(rng.normal(0, 0.03, size=(3000, 2)))
    fc = _served_online(speed, horizons=(1, 4))
    assert fc.aci is not None
    assert abs(fc.aci.coverage_by_horizon()[1] - 0.8) < 0.03  # burn-in included
    assert fc.aci.log_scale[1] > 0.5  # it widened the intervals


def test_model_speeds_serve_intervals_calibrated_within_a_short_run():
    # The served step (SERVED_ACI, decaying) brings intervals three times too narrow to 80%
    # over a 300-step run; the constant step 0.02 served before it did not.
    from bubblecast.policy.speeds import SERVED_ACI

    rng = np.random.default_rng(4)
    speed = np.exp(rng.normal(0, 0.03, size=(300, 4)))
    served = _served_online(speed)
    constant = _served_online(speed, AdaptiveConformal(gamma=0.02))
    assert served.aci.gamma_start == SERVED_ACI["gamma_start"]
    assert abs(served.aci.coverage_by_horizon()[1] - 0.8) < 0.05  # 299 x 4 and the burn-in
    assert constant.aci.coverage_by_horizon()[1] < 0.7
