"""The frame-free serving path: a LightGBM model is served through ``predict_matrix`` after its
load-time check, forecasts equal the ``predict_signal`` paths, and a model whose matrix path
disagrees falls back to the reference path."""

from __future__ import annotations

import numpy as np
import pytest

from bubblecast.dataset.online_frame import FastFeatures
from bubblecast.dataset.window import Window
from bubblecast.forecast.served import FeatureModel
from tests.serve.test_adapters import features_of, run_window


@pytest.fixture(scope="module")
def lgbm():
    from bubblecast.forecast.lgbm import LGBMForecaster

    frame = features_of([run_window(seed, tokens=seed % 2 == 1) for seed in range(6)])
    return LGBMForecaster(n_estimators=15, min_child_samples=20, seed=0).fit(frame)


def test_lgbm_is_served_by_the_matrix_path(lgbm):
    model = FeatureModel(lgbm)
    assert model.fast is not None and model.fast.mode == "matrix"
    assert model.predict_path == "matrix" and model.feature_path == "numpy"


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_matrix_path_equals_the_signal_paths(lgbm, seed):
    w = run_window(seed, steps=90, tokens=seed == 12)
    if w.tokens is not None:
        w = Window(compute=w.compute, cost=w.cost, microbatches=w.microbatches,
                   tokens=w.tokens, next_tokens=np.array([900.0, 1100.0, 1000.0]))
    hz = [10, 1, 5]
    fast = FastFeatures(lgbm, FeatureModel(lgbm, fast=False).config, mode="matrix")
    light = FastFeatures(lgbm, fast.cfg, mode="light")
    exact = FeatureModel(lgbm, fast=False)
    got = fast.predict(w, hz)
    np.testing.assert_array_equal(got, light.predict(w, hz))
    np.testing.assert_allclose(got, exact.predict_window(w, hz), rtol=1e-6)


def test_a_disagreeing_matrix_path_falls_back(lgbm, monkeypatch):
    real = type(lgbm).predict_matrix

    def off_by_a_bit(self, X, horizons):
        return real(self, X, horizons) * 1.01

    monkeypatch.setattr(type(lgbm), "predict_matrix", off_by_a_bit)
    model = FeatureModel(lgbm)
    assert model.fast is not None and model.fast.mode == "light"
    assert model.predict_path == "signal"


def test_unknown_mode_is_refused(lgbm):
    with pytest.raises(ValueError, match="mode"):
        FastFeatures(lgbm, None, mode="turbo")


def _probe_matrix(rng, n: int, width: int) -> np.ndarray:
    X = np.exp(rng.normal(0.0, 1.0, (n, width)))
    X[rng.random(X.shape) < 0.1] = np.nan  # missing inputs take the trees' default branch
    # the tail of matrix_columns: anchor (level), f_tokens_ratio, then the regime columns
    # (rolling std, level) that pick each row's conformal group
    X[:, -4] = X[:, -1] = 0.5 + rng.random(n)
    X[:, -3] = np.where(rng.random(n) < 0.5, np.nan, 1.0)
    X[:, -2] = np.exp(rng.normal(-4.0, 1.5, n))  # every volatility regime
    return X


def _without_row_scorer(model, monkeypatch):
    """``model`` scoring through ``Booster.predict`` only (the reference path)."""
    monkeypatch.setattr(model, "_row_scorer", lambda: None)
    return model


@pytest.mark.parametrize("n", [1, 4, 17, 64, 65])
def test_single_row_lightgbm_path_is_bit_identical_to_booster_predict(lgbm, n, monkeypatch):
    """predict_matrix through the single-row C calls gives every bit it gives through
    Booster.predict, for any horizon order; 65 rows go to Booster.predict."""
    assert lgbm._row_scorer() is not None
    rng = np.random.default_rng(n)
    nf, nh = len(lgbm.features_), len(lgbm.horizon_features_)
    cases = []
    for hz in ([1, 5, 10], [10, 1], [5]):
        X = _probe_matrix(rng, n, nf + nh * len(hz) + 4)
        cases.append((X, hz, lgbm.predict_matrix(X, hz)))
    _without_row_scorer(lgbm, monkeypatch)
    for X, hz, got in cases:
        want = lgbm.predict_matrix(X, hz)
        assert got.shape == want.shape == (n, len(hz), 3)
        np.testing.assert_array_equal(got, want)


def test_real_windows_are_forecast_through_the_single_row_path(lgbm, monkeypatch):
    """FeatureModel serves LightGBM through the single-row scorer, bit-equal to
    Booster.predict on the origin rows of real windows (deeper tree paths than probes)."""
    from bubblecast.forecast.lgbm_rows import RowScorer

    model = FeatureModel(lgbm)
    calls = []
    real = RowScorer.raw
    monkeypatch.setattr(RowScorer, "raw", lambda self, x, key: calls.append(key) or
                        real(self, x, key))
    windows = [run_window(seed + 20, steps=80 + seed) for seed in range(6)]
    got = [model.predict_window(w, [1, 5, 10]) for w in windows]
    assert len(calls) == 3 * len(windows)  # every horizon of every window
    _without_row_scorer(lgbm, monkeypatch)
    for w, g in zip(windows, got, strict=True):
        np.testing.assert_array_equal(g, model.predict_window(w, [1, 5, 10]))


def test_a_disagreeing_single_row_path_is_not_used(lgbm, monkeypatch):
    from bubblecast.forecast.lgbm_rows import RowScorer

    real = RowScorer.raw
    monkeypatch.setattr(RowScorer, "raw", lambda self, x, key: real(self, x, key) * (1 + 1e-12))
    monkeypatch.delitem(lgbm.__dict__, "_rows", raising=False)
    assert lgbm._row_scorer() is None
    model = FeatureModel(lgbm)  # still served through predict_matrix, on Booster.predict
    assert model.predict_path == "matrix"
    w = run_window(30, steps=80)
    assert np.isfinite(model.predict_window(w, [1, 5, 10])).all()


def test_no_row_scorer_without_the_c_entry_point_or_mid_fit(lgbm, monkeypatch):
    import bubblecast.forecast.lgbm_rows as rows

    def missing():
        raise ImportError("no _LIB")

    monkeypatch.setattr(rows, "_c_api", missing)
    monkeypatch.delitem(lgbm.__dict__, "_rows", raising=False)
    assert lgbm._row_scorer() is None
    monkeypatch.delitem(lgbm.__dict__, "_rows")
    partial = dict(lgbm.boosters_)
    partial.pop(next(iter(partial)))
    monkeypatch.setattr(lgbm, "boosters_", partial)
    assert lgbm._row_scorer() is None and "_rows" not in lgbm.__dict__
