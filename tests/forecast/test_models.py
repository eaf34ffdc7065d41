"""LightGBM and the sequence model: fit, quantile order, determinism, no-pickle round trips."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bubblecast.errors import BubblecastError
from bubblecast.forecast.lgbm import LGBMForecaster
from bubblecast.forecast.modeldir import load_model, save_model
from bubblecast.forecast.seq import WEIGHTS_FILE, SeqForecaster
from tests.forecast.conftest import SMALL

FAST_LGBM = {"n_estimators": 60, "early_stopping_rounds": 10, "seed": 3}
FAST_SEQ = {"epochs": 3, "hidden": 8, "batch_size": 256, "seed": 3}


@pytest.fixture(scope="module")
def lgbm(train_frame):
    return LGBMForecaster(**FAST_LGBM).fit(train_frame)


@pytest.fixture(scope="module")
def seq(train_frame):
    return SeqForecaster(**FAST_SEQ).fit(train_frame)


@pytest.mark.parametrize("name", ["lgbm", "seq"])
def test_predictions_are_ordered_finite_quantiles_per_row_and_horizon(name, request,
                                                                      test_frame):
    model = request.getfixturevalue(name)
    pred = model.predict(test_frame)
    assert len(pred) == 2 * len(test_frame)
    assert sorted(pred["horizon"].unique()) == [1, 5]
    q = pred[["p10", "p50", "p90"]].to_numpy()
    assert np.isfinite(q).all() and (q > 0).all()
    assert (np.diff(q, axis=1) >= 0).all()
    h5 = pred[pred["horizon"] == 5]
    np.testing.assert_allclose(h5["p50_s"].to_numpy(),
                               h5["p50"].to_numpy() * test_frame["work_h5"].to_numpy())
    # Fitted attributes end in "_" and parameters are untouched by fit.
    assert model.get_params()["seed"] == 3
    assert hasattr(model, "shifts_") and hasattr(model, "horizons_")


@pytest.mark.parametrize("name", ["lgbm", "seq"])
def test_learnt_models_beat_the_last_value_on_structured_data(name, request, test_frame):
    model = request.getfixturevalue(name)
    y = test_frame["y_h1"].to_numpy()
    ok = np.isfinite(y)
    mae = np.mean(np.abs(model.predict_signal(test_frame, [1])[1][ok, 1] - y[ok]))
    last = np.mean(np.abs(test_frame["y"].to_numpy()[ok] - y[ok]))
    assert mae < last


def test_lgbm_is_deterministic_and_round_trips_without_pickle(lgbm, train_frame, test_frame,
                                                              tmp_path):
    again = LGBMForecaster(**FAST_LGBM).fit(train_frame)
    np.testing.assert_array_equal(again.predict(test_frame)["p50"], lgbm.predict(test_frame)["p50"])
    save_model(lgbm, tmp_path / "m", metrics={"h1": {"mae": 1.0}})
    files = sorted(p.name for p in (tmp_path / "m").iterdir())
    assert files == sorted(["model.json"] + [f"lgbm_h{h}_q{q}.txt" for h in (1, 5)
                                             for q in (10, 50, 90)])
    assert (tmp_path / "m" / "lgbm_h1_q50.txt").read_text().startswith("tree")
    doc = json.loads((tmp_path / "m" / "model.json").read_text())
    assert doc["kind"] == "lgbm" and doc["horizons"] == [1, 5]
    assert doc["metrics"] == {"h1": {"mae": 1.0}} and "x_u_seasonal" in doc["features"]
    back = load_model(tmp_path / "m")
    np.testing.assert_array_equal(back.predict(test_frame).to_numpy(),
                                  lgbm.predict(test_frame).to_numpy())
    # The dataset config travels with the model, so a server builds the same features.
    assert lgbm.dataset_config_ == SMALL and back.dataset_config_ == SMALL


def test_seq_is_deterministic_and_round_trips_with_weights_only(seq, train_frame, test_frame,
                                                                tmp_path):
    import torch

    again = SeqForecaster(**FAST_SEQ).fit(train_frame)
    np.testing.assert_array_equal(again.predict(test_frame)["p50"], seq.predict(test_frame)["p50"])
    save_model(seq, tmp_path / "s")
    weights = torch.load(tmp_path / "s" / WEIGHTS_FILE, weights_only=True)
    assert all(isinstance(v, torch.Tensor) for v in weights.values())
    back = load_model(tmp_path / "s")
    np.testing.assert_allclose(back.predict(test_frame)[["p10", "p50", "p90"]].to_numpy(),
                               seq.predict(test_frame)[["p10", "p50", "p90"]].to_numpy(),
                               rtol=1e-6)


def test_a_missing_feature_column_is_named(lgbm, test_frame):
    with pytest.raises(BubblecastError, match="missing column 'f_slope_w10'"):
        lgbm.predict(test_frame.drop(columns=["f_slope_w10"]))


def test_learnt_models_need_three_runs(train_frame):
    two = train_frame[train_frame["run_id"].isin(["run0", "run1"])]
    with pytest.raises(BubblecastError, match="at least 3 runs"):
        LGBMForecaster(**FAST_LGBM).fit(two)


def test_missing_and_corrupt_model_directories_give_one_line_errors(lgbm, tmp_path):
    with pytest.raises(BubblecastError, match="model directory does not exist"):
        load_model(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BubblecastError, match=r"no model\.json"):
        load_model(tmp_path / "empty")
    save_model(lgbm, tmp_path / "m")
    (tmp_path / "m" / "lgbm_h5_q90.txt").write_text("garbage")
    with pytest.raises(BubblecastError, match="corrupt model directory") as exc:
        load_model(tmp_path / "m")
    assert "\n" not in str(exc.value)
    (tmp_path / "m" / "lgbm_h5_q90.txt").unlink()
    with pytest.raises(BubblecastError, match="missing lgbm_h5_q90.txt"):
        load_model(tmp_path / "m")
    (tmp_path / "m" / "model.json").write_text("{not json")
    with pytest.raises(BubblecastError, match="corrupt model file"):
        load_model(tmp_path / "m")
