"""``LGBMForecaster.predict_matrix`` (the service's frame-free path) gives exactly the numbers
of ``predict_signal`` / ``predict`` on the same rows."""

from __future__ import annotations

import numpy as np
import pytest

from bubblecast.errors import BubblecastError
from bubblecast.forecast.lgbm import LGBMForecaster


@pytest.fixture(scope="module")
def fitted(train_frame):
    return LGBMForecaster(n_estimators=30, num_leaves=15, seed=3).fit(train_frame)


def _rows(frame, seed: int, n: int = 40):
    rows = np.random.default_rng(seed).choice(len(frame), n, replace=False)
    return frame.iloc[np.sort(rows)].reset_index(drop=True)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matrix_equals_signal_and_predict(fitted, test_frame, seed):
    rows = _rows(test_frame, seed)
    hz = list(fitted.horizons_)[::-1]  # any order of horizons
    cols = fitted.matrix_columns(hz)
    X = rows[cols].to_numpy(dtype=np.float64)
    fast = fitted.predict_matrix(X, hz)
    ref = fitted.predict_signal(rows, hz)
    assert fast.shape == (len(rows), len(hz), 3)
    for i, h in enumerate(hz):
        np.testing.assert_array_equal(fast[:, i], ref[h])
    long = fitted.predict(rows, hz)
    for i, h in enumerate(hz):
        part = long[long["horizon"] == h]
        np.testing.assert_array_equal(part[["p10", "p50", "p90"]].to_numpy(), fast[:, i])


def test_matrix_handles_nan_and_both_conformal_groups(fitted, test_frame):
    rows = _rows(test_frame, 5).copy()
    rng = np.random.default_rng(9)
    rows.loc[rng.random(len(rows)) < 0.5, "f_tokens_ratio"] = np.nan
    rows.loc[rows.index[::2], "f_tokens_ratio"] = 1.1  # group 1 rows
    feat = fitted.features_[3]
    rows.loc[rows.index[1::3], feat] = np.nan
    hz = list(fitted.horizons_)
    fast = fitted.predict_matrix(rows[fitted.matrix_columns(hz)].to_numpy(np.float64), hz)
    ref = fitted.predict_signal(rows, hz)
    for i, h in enumerate(hz):
        np.testing.assert_array_equal(fast[:, i], ref[h])


def test_matrix_refuses_wrong_shape_and_unknown_horizon(fitted, test_frame):
    hz = list(fitted.horizons_)
    X = test_frame[fitted.matrix_columns(hz)].to_numpy(np.float64)[:3]
    with pytest.raises(BubblecastError, match="shape"):
        fitted.predict_matrix(X[:, :-1], hz)
    with pytest.raises(BubblecastError, match="horizons"):
        fitted.predict_matrix(X, [999])
