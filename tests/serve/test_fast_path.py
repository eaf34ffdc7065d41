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
