"""Built-in speed forecaster: trends extrapolate, level shifts restart, noise stays flat."""

from __future__ import annotations

import numpy as np

from bubblecast.policy.forecasting import TrendForecaster

HZ = np.array([1, 8, 32])


def forecast(history: np.ndarray) -> np.ndarray:
    return TrendForecaster().forecast_history(history, HZ)


def test_flat_noise_gives_a_flat_forecast_around_the_level():
    rng = np.random.default_rng(1)
    hist = 1.0 + 0.01 * rng.standard_normal((200, 3))
    q = forecast(hist)
    assert q.shape == (3, 3, 3)
    assert np.all(np.abs(q[:, :, 1] - 1.0) < 0.01)
    assert np.all(q[:, :, 0] <= q[:, :, 1]) and np.all(q[:, :, 1] <= q[:, :, 2])
    assert np.all(q[:, :, 2] - q[:, :, 0] > 0.005)  # noise gives a real interval


def test_a_drift_is_extrapolated():
    rng = np.random.default_rng(2)
    t = np.arange(120)
    hist = np.column_stack([1.0 + 0.002 * t, np.ones(120)]) + 0.002 * rng.standard_normal((120, 2))
    q = forecast(hist)
    last = 1.0 + 0.002 * 119
    assert q[0, 0, 1] > last - 0.005
    assert q[2, 0, 1] > q[1, 0, 1] > q[0, 0, 1]  # still rising ahead
    assert abs(q[2, 1, 1] - 1.0) < 0.01  # the flat rank stays flat


def test_a_level_shift_restarts_without_a_spurious_trend():
    rng = np.random.default_rng(3)
    hist = 1.0 + 0.003 * rng.standard_normal((100, 1))
    for k in (3, 10, 30):  # steps since a 2x slowdown began
        h = hist.copy()
        h[-k:] *= 2.0
        q = forecast(h)
        assert np.all(np.abs(q[:, 0, 1] - 2.0) < 0.05), (k, q[:, 0, 1])
    # A pulse that ended: back at 1, no extrapolated fall below it.
    h = hist.copy()
    h[-25:-12] *= 2.5
    q = forecast(h)
    assert np.all(np.abs(q[:, 0, 1] - 1.0) < 0.02), q[:, 0, 1]


def test_isolated_spikes_are_ignored():
    hist = np.ones((120, 1))
    hist[::20] = 2.0  # periodic one-step spikes (GC, checkpoints)
    q = forecast(hist)
    assert np.all(np.abs(q[:, 0, 1] - 1.0) < 1e-6)


def test_short_history_still_forecasts():
    q = forecast(np.array([[1.0, 2.0]]))
    assert np.allclose(q[:, :, 1], [[1.0, 2.0]] * 3)


def test_a_trained_model_is_looked_up_by_step_in_the_policy_unit():
    from bubblecast.dataset import DatasetConfig, build_dataset
    from bubblecast.forecast.modeldir import make_model
    from bubblecast.policy.run_data import load_run
    from bubblecast.policy.speeds import model_forecaster
    from bubblecast.sim.simulator import SimConfig, simulate_events

    def runs(scenario, steps, seed, replicas=1, n=1):
        return simulate_events(SimConfig(schedule="1f1b", stages=4, microbatches=4,
                                         model="uniform:12", steps=steps, scenario=scenario,
                                         seed=seed, runs=n, replicas=replicas))

    train = runs("throttle", 120, 99, n=2)
    frame, _ = build_dataset(train, DatasetConfig(windows=(5, 20), lags=8, max_period=10))
    model = make_model("last").fit(frame)  # forecasts the value at the origin
    ev = runs("failslow", 80, 3, replicas=2)
    run = load_run(ev, ev.run_ids[0])
    fc = model_forecaster(model, ev, run.run_id, run.steps, run.unit)
    assert fc.table.shape == (80, 3, 4, 3)
    ready = ~np.isnan(fc.table).any(axis=(1, 2, 3))
    assert ready[-1] and not ready[0]  # early origins lack features: the fallback serves them
    t = int(np.flatnonzero(ready)[0])
    state = type("S", (), {"t": t, "history": run.history[: t + 1]})()
    q = fc.forecast(state, np.array([1, 3, 20]))
    np.testing.assert_allclose(q[:, :, 1], np.tile(run.history[t], (3, 1)), rtol=1e-6)
    early = fc.forecast(type("S", (), {"t": 2, "history": run.history[:3]})(), np.array([1]))
    assert early.shape == (1, 4, 3)
