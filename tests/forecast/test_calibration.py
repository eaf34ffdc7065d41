"""Calibration that holds on new runs: real LightGBM and GRU models on held-out seeds, and
adaptive conformal inference (ACI) online.

Tolerances. A held-out coverage is a mean of indicators that are strongly correlated within a
run (neighbouring steps share their errors), so its sampling error is set by runs more than
rows: with ``R`` held-out runs and the run-to-run spread of coverage ``s`` (about 0.05 here
for runs of 200 steps), the mean over runs has a standard error ``s / sqrt(R)``, and the
conformal shifts fitted on ``C`` calibration runs add about ``s / sqrt(C)``. With R = 16 and
C = 6 that is 0.05 x sqrt(1/16 + 1/6) = 0.024; the tests allow 2.5 standard errors (0.06).
"""

from __future__ import annotations

import numpy as np
import pytest

from bubblecast.dataset import DatasetConfig, build_dataset
from bubblecast.forecast.conformal import AdaptiveConformal
from bubblecast.forecast.suite import TRAINING, SuiteConfig, suite_events

TOL = 0.06
CONFIG = DatasetConfig()  # horizons 1, 5, 10 as the shipped model


@pytest.fixture(scope="module")
def frames():
    train = build_dataset(suite_events(SuiteConfig(scenarios=TRAINING, runs=3, steps=160,
                                                   replicas=1, seed=1)), CONFIG)[0]
    held = build_dataset(suite_events(SuiteConfig(scenarios=TRAINING, runs=3, steps=160,
                                                  replicas=1, seed=2)), CONFIG)[0]
    return train, held


def _coverage(model, frame) -> dict[int, float]:
    pred = model.predict_signal(frame, model.horizons_)
    out = {}
    for h in model.horizons_:
        y = frame[f"y_h{h}"].to_numpy(float)
        ok = np.isfinite(y)
        q = pred[h][ok]
        out[h] = float(np.mean((y[ok] >= q[:, 0]) & (y[ok] <= q[:, 2])))
    return out


def test_lightgbm_held_out_coverage(frames):
    from bubblecast.forecast.lgbm import LGBMForecaster

    train, held = frames
    model = LGBMForecaster(n_estimators=60, seed=0).fit(train)
    cov = _coverage(model, held)
    assert set(cov) == {1, 5, 10}
    for h, c in cov.items():
        assert abs(c - 0.8) <= TOL, (h, cov)


def test_gru_held_out_coverage(frames):
    pytest.importorskip("torch")
    from bubblecast.forecast.seq import SeqForecaster

    train, held = frames
    model = SeqForecaster(epochs=6, hidden=16, seed=0).fit(train)
    cov = _coverage(model, held)
    for h, c in cov.items():
        assert abs(c - 0.8) <= TOL, (h, cov)


def test_aci_brings_a_miscalibrated_forecast_to_80_percent_online():
    rng = np.random.default_rng(0)
    T, P = 4000, 4
    level = np.exp(rng.normal(0, 0.02, size=(T, P)))  # the truth: log-normal, sd 0.02
    raw = np.stack([np.full((1, P), np.exp(-0.005)), np.ones((1, P)),
                    np.full((1, P), np.exp(0.005))], axis=2)  # p10-p90 far too narrow
    aci = AdaptiveConformal(coverage=0.8, gamma=0.02)
    inside = []
    for t in range(T - 1):
        aci.observe(level[: t + 1], t)
        q = aci.adjust(raw, [1], t)[0]  # (P, 3)
        inside.append(np.mean((level[t + 1] >= q[:, 0]) & (level[t + 1] <= q[:, 2])))
    late = np.mean(inside[T // 2:])
    assert np.mean(inside[:50]) < 0.5  # raw intervals cover far less
    # After the burn-in, coverage is 0.8 up to the noise of 2000 x 4 indicators (ACI's own
    # oscillation included): 0.8 +- 0.02.
    assert abs(late - 0.8) < 0.02
    assert abs(aci.coverage_by_horizon()[1] - np.mean(inside[:-1])) < 0.01
    with pytest.raises(ValueError):
        AdaptiveConformal(coverage=1.5)


def test_aci_ignores_earlier_origins_and_narrows_too_wide_intervals():
    aci = AdaptiveConformal(coverage=0.8, gamma=0.05)
    wide = np.stack([np.full((1, 2), 0.5), np.ones((1, 2)), np.full((1, 2), 2.0)], axis=2)
    hist = np.ones((300, 2))
    for t in range(200):
        aci.observe(hist[: t + 1], t)
        aci.adjust(wide, [1], t)
    assert aci.log_scale[1] < -0.5  # every value inside: the intervals narrow
    before = dict(aci.issued)
    aci.adjust(wide, [1], 50)  # a backtest at an earlier origin records nothing
    assert aci.issued == before


def test_model_speeds_recalibrate_online_with_aci():
    from types import SimpleNamespace

    from bubblecast.policy.forecasting import TrendForecaster
    from bubblecast.policy.speeds import ModelSpeeds

    rng = np.random.default_rng(3)
    T, P = 3000, 2
    speed = np.exp(rng.normal(0, 0.03, size=(T, P)))
    table = np.ones((T, 1, P, 3))
    table[..., 0], table[..., 2] = np.exp(-0.01), np.exp(0.01)  # p10-p90 three times too narrow
    fc = ModelSpeeds(table=table, table_horizons=[1], fallback=TrendForecaster())
    for t in range(T - 1):
        fc.forecast(SimpleNamespace(t=t, history=speed[: t + 1]), np.array([1, 4]))
    assert fc.aci is not None
    assert abs(fc.aci.coverage_by_horizon()[1] - 0.8) < 0.03  # burn-in included
    assert fc.aci.log_scale[1] > 0.5  # it widened the intervals
