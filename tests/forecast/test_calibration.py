"""Calibration that holds on new runs: real LightGBM and GRU models on held-out seeds, and
adaptive conformal inference (ACI) online.

Tolerances of the held-out tests. README's 0.78-0.82 band is the p10-p90 coverage at the scale
of ``benchmarks/bench_forecast.py`` (80 training runs of 400 steps, 32 of them calibrating,
40 held-out runs). The fixture here is far smaller: 8 scenarios x 3 runs of 160 steps, one
replica of 4 stages, for training (suite seed 1: 16 runs train, 8 calibrate, the validation
runs included) and for the held-out suite (seed 2: 24 runs, about 9,600 / 9,200 / 8,700 rows
at h = 1 / 5 / 10). If rows were independent, the binomial standard error of a coverage of
0.8 would be sqrt(0.8 x 0.2 / 9,600) = 0.004 on the held-out rows and
sqrt(0.16 / 3,232) = 0.007 for the conformal shifts fitted on the calibration rows: about
0.008 together. Neighbouring steps share their errors, so the runs, not the rows, set the
spread: measured over 5 training suite seeds (1, 3, 4, 5, 6) x 8 held-out seeds (2, 7-13),
every horizon (``benchmarks/calibration_spread.py``), the coverage has a standard deviation
of 0.019 for LightGBM (0.019 between training suites, which runs train and calibrate; 0.008
between held-out suites) and 0.040 for the GRU (0.031 and 0.023), means 0.788 and 0.782.
So this fixture cannot hold either model to 0.78-0.82 (at its own seeds LightGBM gives
0.771 / 0.780 / 0.787 and the GRU 0.764 / 0.788 / 0.782); the tests allow 2.5 measured
standard deviations: 0.05 for LightGBM, 0.10 for the GRU. The 0.78-0.82 claim itself is
measured at its own scale by ``benchmarks/bench_forecast.py``, which records the band beside
its results; no test backs it at that precision.
"""

from __future__ import annotations

import numpy as np
import pytest

from bubblecast.dataset import DatasetConfig, build_dataset
from bubblecast.forecast.conformal import AdaptiveConformal
from bubblecast.forecast.suite import TRAINING, SuiteConfig, suite_events

#: 2.5 measured standard deviations of this fixture's held-out coverage (module doc).
TOL_LGBM = 0.05
TOL_GRU = 0.10
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
        assert abs(c - 0.8) <= TOL_LGBM, (h, cov)


def test_gru_held_out_coverage(frames):
    pytest.importorskip("torch")
    from bubblecast.forecast.seq import SeqForecaster

    train, held = frames
    model = SeqForecaster(epochs=6, hidden=16, seed=0).fit(train)
    cov = _coverage(model, held)
    assert set(cov) == {1, 5, 10}
    for h, c in cov.items():
        assert abs(c - 0.8) <= TOL_GRU, (h, cov)


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
