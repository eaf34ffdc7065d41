"""Baselines: point forecasts from the past only, parameter choice, intervals, round trip."""

from __future__ import annotations

import numpy as np
import pytest

from bubblecast.errors import BubblecastError
from bubblecast.forecast.baselines import EWMA, LastValue, RollingMedian, SeasonalNaive
from bubblecast.forecast.modeldir import load_model, save_model


def test_last_value_is_the_origin_value(train_frame):
    model = LastValue().fit(train_frame)
    pred = model.predict(train_frame, [1])
    np.testing.assert_allclose(pred["p50"], train_frame["y"])
    assert (pred["p10"] <= pred["p50"]).all() and (pred["p50"] <= pred["p90"]).all()
    np.testing.assert_allclose(pred["p50_s"], pred["p50"] * train_frame["work_h1"])


def test_ewma_and_median_pick_their_parameter_by_training_mae(train_frame):
    ewma = EWMA().fit(train_frame)
    y = train_frame["y_h5"].to_numpy()
    maes = {c: np.nanmean(np.abs(train_frame[c].to_numpy() - y))
            for c in train_frame.columns if c.startswith("f_u_ewm")}
    assert ewma.column_[5] == min(maes, key=maes.get)
    assert EWMA(alpha=0.5).fit(train_frame).column_[5] == "f_u_ewm0.5"
    assert RollingMedian(window=4).fit(train_frame).column_[1] == "f_u_q50_w4"


def test_seasonal_naive_uses_the_detected_period_else_the_last_value(train_frame):
    model = SeasonalNaive().fit(train_frame)
    p = model.predict_signal(train_frame, [5])[5][:, 1]
    seasonal = train_frame["x5_u_seasonal"].to_numpy()
    has = np.isfinite(seasonal)
    assert has.any() and (~has).any()
    np.testing.assert_allclose(p[has], seasonal[has])
    np.testing.assert_allclose(p[~has], train_frame["y"].to_numpy()[~has])


def test_intervals_cover_about_80_percent_in_sample(train_frame):
    model = RollingMedian().fit(train_frame)
    q = model.predict_signal(train_frame, [1])[1]
    y = train_frame["y_h1"].to_numpy()
    ok = np.isfinite(y)
    assert 0.75 < np.mean((y[ok] >= q[ok, 0]) & (y[ok] <= q[ok, 2])) < 0.85


def test_round_trip_through_a_model_directory(train_frame, tmp_path):
    model = EWMA().fit(train_frame)
    save_model(model, tmp_path / "m")
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["model.json"]
    back = load_model(tmp_path / "m")
    assert back.column_ == model.column_
    np.testing.assert_array_equal(back.predict(train_frame).to_numpy(),
                                  model.predict(train_frame).to_numpy())


def test_unknown_horizon_and_unfitted_model_are_refused(train_frame):
    with pytest.raises(BubblecastError, match="not fitted"):
        LastValue().predict(train_frame)
    with pytest.raises(BubblecastError, match=r"horizons \[1, 5\], not \[3\]"):
        LastValue().fit(train_frame).predict(train_frame, [3])


def test_rolling_backtest_scores_each_fold_after_its_cutoff(train_frame):
    from bubblecast.forecast.backtest import rolling_backtest

    table = rolling_backtest(train_frame, EWMA, n_folds=2, test_runs=["run0", "run1"])
    assert sorted(table["fold"].unique()) == [0, 1]
    sub = table[(table["model"] == "ewma-2") & (table["scenario"] == "all")]
    assert len(sub) == 2 * 2  # two folds x two horizons
    assert (sub["n"] > 0).all() and sub["mae"].notna().all()
