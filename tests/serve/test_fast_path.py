"""The frame-free serving path: a LightGBM model is served through ``predict_matrix`` after its
load-time check, forecasts equal the ``predict_signal`` paths, and a model whose matrix path
disagrees falls back to the reference path."""

from __future__ import annotations

import numpy as np
import pytest

from bubblecast.serve.adapters import FeatureModel
from bubblecast.serve.features import FastFeatures
from bubblecast.serve.model import Window
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
    X[:, -2] = 0.5 + rng.random(n)  # the anchor (level)
    X[:, -1] = np.where(rng.random(n) < 0.5, np.nan, 1.0)  # both conformal groups
    return X


@pytest.mark.parametrize("n", [1, 4, 17, 64, 65])
def test_single_row_lightgbm_path_is_bit_identical_to_predict_matrix(lgbm, n):
    """The serving shortcut for LightGBM (single-row C calls, all horizons at once) gives
    every bit predict_matrix gives, for any horizon order; 65 rows go to predict_matrix."""
    from bubblecast.serve.trees import RowPredictor

    rp = RowPredictor.wrap(lgbm)
    assert rp is not None
    rng = np.random.default_rng(n)
    nf, nh = len(lgbm.features_), len(lgbm.horizon_features_)
    for hz in ([1, 5, 10], [10, 1], [5]):
        X = _probe_matrix(rng, n, nf + nh * len(hz) + 2)
        want = lgbm.predict_matrix(X, hz)
        got = rp.predict_matrix(X, hz)
        assert got.shape == want.shape == (n, len(hz), 3)
        np.testing.assert_array_equal(got, want)


def test_real_windows_are_forecast_through_the_single_row_path(lgbm):
    """FeatureModel serves LightGBM through RowPredictor, bit-equal to predict_matrix on the
    origin rows of real windows (deeper tree paths than random probes)."""
    from bubblecast.serve.trees import RowPredictor

    model = FeatureModel(lgbm)
    assert isinstance(getattr(model.fast._predict_matrix, "__self__", None), RowPredictor)
    plain = FastFeatures(lgbm, model.config, mode="matrix")
    plain._predict_matrix = lgbm.predict_matrix
    for seed in range(6):
        w = run_window(seed + 20, steps=80 + seed)
        np.testing.assert_array_equal(model.predict_window(w, [1, 5, 10]),
                                      plain.predict(w, [1, 5, 10]))


def test_a_disagreeing_single_row_path_is_not_used(lgbm, monkeypatch):
    from bubblecast.serve.trees import RowPredictor

    real = RowPredictor.predict_matrix
    monkeypatch.setattr(RowPredictor, "predict_matrix",
                        lambda self, X, hz: real(self, X, hz) * (1 + 1e-12))
    assert RowPredictor.wrap(lgbm) is None
    model = FeatureModel(lgbm)  # still served through predict_matrix
    assert model.predict_path == "matrix"
    assert model.fast._predict_matrix == lgbm.predict_matrix


def test_non_lightgbm_forecasters_are_not_wrapped():
    from bubblecast.serve.trees import RowPredictor

    assert RowPredictor.wrap(object()) is None
