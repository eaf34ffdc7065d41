"""The service's numpy features at one origin equal the dataset's ``build_features`` row."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bubblecast.dataset.config import DatasetConfig
from bubblecast.dataset.online import origin_features
from bubblecast.dataset.window import Window
from bubblecast.forecast.served import FeatureModel, set_known_ahead, window_series


def exact_rows(window: Window, cfg: DatasetConfig, horizons: list[int]):
    from bubblecast.dataset.features import build_features

    series = window_series(window, max(cfg.horizons))
    set_known_ahead(series, window, horizons)
    frame = build_features(series, cfg)
    return frame.loc[frame["step"] == window.steps - 1].sort_values("stage")


@st.composite
def windows(draw):
    """Windows with noise, drifts, periodic spikes, lasting slowdowns, tokens, repartitions."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    p = draw(st.integers(1, 4))
    t = draw(st.integers(60, 110))
    y = 1.0 + 0.5 * rng.random(p) + 0.05 * rng.standard_normal((t, p))
    if draw(st.booleans()):  # periodic spikes on one stage
        every = draw(st.integers(3, 25))
        y[::every, rng.integers(p)] *= 1.5 + rng.random()
    if draw(st.booleans()):  # a lasting slowdown
        start = rng.integers(t)
        y[start:, rng.integers(p)] *= 2.0
    if draw(st.booleans()):  # a smooth periodic component
        y *= 1.0 + 0.3 * np.sin(np.arange(t) * 2 * np.pi / rng.integers(3, 30))[:, None]
    y = np.abs(y) + 1e-3
    tokens = next_tokens = layers = None
    if draw(st.booleans()):
        tokens = np.repeat(rng.integers(500, 2000, (t, 1)).astype(float), p, axis=1)
        if draw(st.booleans()):
            next_tokens = rng.integers(500, 2000, 3).astype(float)
    cost = np.full((t, p), 4.0)
    if draw(st.booleans()):
        layers = np.full((t, p), 4.0)
        at = rng.integers(1, t)
        layers[at:, 0] += 1
        cost = layers.copy()
    load = tokens if tokens is not None else 8.0
    return Window(compute=y * cost * load, cost=cost, microbatches=8, tokens=tokens,
                  layers=layers, next_tokens=next_tokens)


CFG = DatasetConfig()


def _as_request_layout(w: Window) -> Window:
    """The window as ``request_window`` builds it: Fortran-ordered compute (a transpose)."""
    return Window(compute=np.asfortranarray(w.compute), cost=w.cost,
                  microbatches=w.microbatches, tokens=w.tokens, layers=w.layers,
                  next_tokens=w.next_tokens)


@settings(max_examples=200, deadline=None)
@given(window=windows(), fortran=st.booleans(), hz=st.sampled_from([[1, 5, 10], [10, 1], [5]]))
def test_origin_matrix_is_bit_identical_to_the_first_numpy_version(window, fortran, hz):
    """The per-request CPU work kept every bit: names, float32 features and float64 level."""
    from bubblecast.dataset.online import origin_matrix
    from tests.serve.origin_reference import origin_matrix as reference

    if window.next_tokens is not None:  # one value per horizon, as the schema requires
        window = Window(compute=window.compute, cost=window.cost,
                        microbatches=window.microbatches, tokens=window.tokens,
                        layers=window.layers, next_tokens=window.next_tokens[:len(hz)])
    if fortran:
        window = _as_request_layout(window)
    names, matrix, level = origin_matrix(window, CFG, hz)
    ref_names, ref_matrix, ref_level = reference(window, CFG, hz)
    assert names == ref_names
    assert matrix.dtype == np.float32 and level.dtype == np.float64
    np.testing.assert_array_equal(matrix, ref_matrix)
    np.testing.assert_array_equal(level, ref_level)


@settings(max_examples=40, deadline=None)
@given(window=windows())
def test_origin_features_equal_build_features(window):
    hz = [1, 5, 10]
    exact = exact_rows(window, CFG, hz)
    fast = origin_features(window, CFG, hz)
    cols = [c for c in exact.columns if c.startswith(("f_", "x")) or c == "level"]
    missing = sorted(set(cols) - set(fast))
    assert not missing, f"features the service does not compute: {missing}"
    for c in cols:
        a = exact[c].to_numpy(dtype=np.float64)
        b = np.asarray(fast[c], dtype=np.float64)
        np.testing.assert_allclose(b, a, rtol=2e-6, atol=1e-9, equal_nan=True, err_msg=c)


@pytest.fixture(scope="module")
def lgbm():
    from bubblecast.forecast.lgbm import LGBMForecaster
    from tests.serve.test_adapters import features_of, run_window

    frame = features_of([run_window(seed) for seed in range(6)])
    return LGBMForecaster(n_estimators=15, min_child_samples=20, seed=0).fit(frame)


def test_fast_and_exact_paths_forecast_the_same(lgbm):
    from tests.serve.test_adapters import run_window

    fast = FeatureModel(lgbm, fast=True)
    exact = FeatureModel(lgbm, fast=False)
    assert fast.fast is not None and fast.fast.light and exact.fast is None
    for seed in range(5):
        w = run_window(seed=100 + seed, steps=60 + 7 * seed)
        np.testing.assert_allclose(fast.predict_window(w, [1, 5, 10]),
                                   exact.predict_window(w, [1, 5, 10]), rtol=1e-5)


def test_a_model_reading_unknown_columns_falls_back_to_the_exact_path(lgbm):
    import copy

    odd = copy.copy(lgbm)
    odd.features_ = list(lgbm.features_) + ["f_something_new"]
    assert FeatureModel(odd, fast=True).fast is None
