"""The public Python API: lazy exports from ``bubblecast`` and the facades."""

from __future__ import annotations

import json
import subprocess
import sys

import bubblecast

HEAVY = ("numpy", "pandas", "pyarrow", "torch", "mlflow", "lightgbm", "matplotlib", "sklearn")


def test_import_bubblecast_loads_no_heavy_library():
    code = ("import json, sys, bubblecast; "
            f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert json.loads(out.stdout) == []


def test_every_public_name_resolves_and_is_listed_by_dir():
    for name in bubblecast.__all__:
        assert getattr(bubblecast, name) is not None, name
    assert set(bubblecast.__all__) <= set(dir(bubblecast))
    assert "importlib" not in dir(bubblecast)


def test_unknown_name_raises_attribute_error():
    import pytest

    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        bubblecast.nope  # noqa: B018


def test_all_lists_exactly_the_exports():
    assert set(bubblecast.__all__) == set(bubblecast._EXPORTS) | {"BubblecastError",
                                                                  "__version__"}


# -- BubbleAnalysis ----------------------------------------------------------------------------

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from bubblecast.cli import main  # noqa: E402

DATA_SIM = sorted((Path(__file__).resolve().parents[1] / "data" / "sim").glob("*.parquet"))


def _cli_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _plain(obj: dict) -> dict:
    """A dict as its JSON text reads back (tuples as lists); NaN would fail the equality."""
    return json.loads(json.dumps(obj))


@pytest.mark.parametrize("path", DATA_SIM, ids=lambda p: p.stem)
def test_analysis_summary_is_the_inspect_json(path, capsys):
    from bubblecast import BubbleAnalysis

    run = bubblecast.read_events(path).run_ids[0]
    analysis = BubbleAnalysis(path, run_id=run)
    assert _plain(analysis.summary()) == _cli_json(capsys, "inspect", str(path), "--run", run)
    stages = analysis.per_stage()
    assert list(stages["stage"]) == list(range(analysis.summary()["stages"]))
    assert stages["busy_s"].sum() == pytest.approx(analysis.per_rank()["busy_s"].sum())
    assert {"rank", "stage", "replica", "bubble_fraction"} <= set(analysis.per_rank().columns)


def test_analysis_whatif_is_the_whatif_json(capsys):
    from bubblecast import BubbleAnalysis

    path = DATA_SIM[0]
    run = bubblecast.read_events(path).run_ids[0]
    expected = _cli_json(capsys, "whatif", str(path), "--run", run)
    assert _plain(BubbleAnalysis(path, run_id=run).whatif()) == expected
    assert set(expected["scenarios"]) == {"ideal", "fix_bottleneck", "no_slow_ranks",
                                          "balanced", "balanced_work"}


def test_analysis_of_events_replays_plots_and_writes_perfetto(tmp_path):
    from bubblecast import BubbleAnalysis, SimConfig, simulate_events

    events = simulate_events(SimConfig(stages=3, microbatches=4, steps=4, scenario="jitter"))
    analysis = BubbleAnalysis(events)
    assert analysis.events is events
    summary = analysis.summary()
    assert summary["steps"] == 4 and summary["stages"] == 3
    rep = analysis.replay()
    assert rep.replayed_step_s.shape == (4,) and len(rep.start) == len(events)
    assert (rep.end >= rep.start).all()
    assert len(analysis.per_step()) == 4
    png = analysis.plot(tmp_path / "a.png", steps=[1])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    trace = json.loads(analysis.to_perfetto(tmp_path / "t.json", steps=[0]).read_text())
    ops = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["args"]["step"] for e in ops} == {0}
    assert len(ops) == int((events.frame["step"] == 0).sum())


def test_analysis_refuses_a_missing_file_in_one_line(tmp_path):
    from bubblecast import BubbleAnalysis, BubblecastError

    with pytest.raises(BubblecastError, match="no such file"):
        BubbleAnalysis(tmp_path / "missing.parquet").summary()


# -- BubbleForecast ----------------------------------------------------------------------------

DATASET_ARGS = ("--horizons", "1,5", "--windows", "5,20", "--lags", "8")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """Five short simulated runs in one events file, and a forecaster fitted on them."""
    from bubblecast import BubbleForecast, SimConfig, simulate_events, write_events
    from bubblecast.forecast.lgbm import LGBMForecaster

    events = simulate_events(SimConfig(stages=3, microbatches=4, steps=80, runs=5,
                                       scenario="mixed", seed=1, run_id="fleet"))
    path = write_events(events, tmp_path_factory.mktemp("fleet") / "fleet.parquet")
    lgbm = LGBMForecaster(n_estimators=20, num_leaves=7, min_child_samples=5)
    forecast = BubbleForecast(models=[lgbm, "ewma"], horizons=(1, 5), windows=(5, 20), lags=8)
    assert forecast.fit(path) is forecast
    assert not hasattr(lgbm, "horizons_")  # the given estimator was cloned, not fitted
    return events, path, forecast


def _sorted(frame):
    return frame.sort_values(["model", "stage", "horizon"]).reset_index(drop=True)


def test_forecast_follows_estimator_rules():
    from bubblecast import BubblecastError, BubbleForecast

    forecast = BubbleForecast(models=["last"], horizons=(1, 5))
    assert forecast.get_params()["models"] == ["last"]
    assert not [k for k in vars(forecast) if k.endswith("_")]
    with pytest.raises(BubblecastError, match="not fitted"):
        forecast.predict(None)
    with pytest.raises(BubblecastError, match="unknown model 'nope'"):
        BubbleForecast(models=["nope"]).fit([])
    with pytest.raises(BubblecastError, match="lgbm has no parameter 'trees'"):
        BubbleForecast(models=[("lgbm", {"trees": 3})]).fit([])
    chosen = BubbleForecast(models=[("lgbm", {"n_estimators": 7})], seed=3)._unfitted()[0]
    assert (chosen.n_estimators, chosen.seed) == (7, 3)


def test_forecast_predict_matches_the_features_frame_at_the_same_origin(fleet):
    import numpy as np

    events, _, forecast = fleet
    assert list(forecast.models_) == ["lgbm", "ewma"] and forecast.horizons_ == [1, 5]
    run = events.run("fleet-2")
    pred = forecast.predict(run)
    assert len(pred) == 2 * 3 * 2 and np.isfinite(pred[["p10", "p50", "p90"]]).all().all()
    assert (pred["p10"] <= pred["p50"]).all() and (pred["p50"] <= pred["p90"]).all()
    frame, _ = forecast.features(run)
    last = frame.loc[frame["step"] == frame["step"].max()].sort_values("stage")
    expected = forecast.models_["lgbm"].predict_signal(last, [1, 5])
    got = pred[pred["model"] == "lgbm"]
    for h in (1, 5):
        q = got[got["horizon"] == h].sort_values("stage")[["p10", "p50", "p90"]].to_numpy()
        np.testing.assert_allclose(q, np.sort(expected[h], axis=1), rtol=1e-9)


def test_forecast_save_load_round_trip(fleet, tmp_path):
    import pandas as pd

    from bubblecast import BubbleForecast

    events, _, forecast = fleet
    run = events.run("fleet-0")
    forecast.save(tmp_path / "both")
    assert sorted(p.name for p in (tmp_path / "both").iterdir()) == ["ewma", "lgbm"]
    back = BubbleForecast.load(tmp_path / "both")
    assert back.horizons_ == [1, 5] and back.dataset_config_ == forecast.dataset_config_
    pd.testing.assert_frame_equal(_sorted(back.predict(run)), _sorted(forecast.predict(run)))
    one = BubbleForecast.load(tmp_path / "both" / "lgbm")
    assert list(one.models_) == ["lgbm"]
    pred = one.predict(run)
    pd.testing.assert_frame_equal(pred, forecast.predict(run).query("model == 'lgbm'")
                                  .reset_index(drop=True))


def test_forecast_saved_model_is_what_serve_loads(fleet, tmp_path):
    import numpy as np

    from bubblecast.forecast.facade import window_from_events
    from bubblecast.forecast.served import load_served

    events, _, forecast = fleet
    forecast.save(tmp_path / "both")
    served, info = load_served(str(tmp_path / "both" / "lgbm"))
    window = window_from_events(events, "fleet-1")
    q = np.sort(served.predict_window(window, [1, 5]), axis=2)  # (stages, horizons, 3)
    pred = forecast.predict(window).query("model == 'lgbm'")
    np.testing.assert_allclose(pred["p50"].to_numpy(), q[:, :, 1].ravel(), rtol=1e-9)


def test_forecast_evaluate_is_the_evaluate_json(fleet, tmp_path, capsys):
    events, path, forecast = fleet
    features = tmp_path / "features.parquet"
    built = _cli_json(capsys, "dataset", str(path), "--out", str(features), *DATASET_ARGS)
    assert built["fingerprint"] == forecast.dataset_["fingerprint"]
    single = type(forecast)(models=[forecast.models_["lgbm"]]).set_params(
        horizons=(1, 5), windows=(5, 20), lags=8).fit(path)
    single.save(tmp_path / "model")
    expected = _cli_json(capsys, "evaluate", str(features), "--model", str(tmp_path / "model"),
                         "--no-track")
    assert _plain(single.evaluate(events)) == expected
    assert "lgbm" in expected["models"]


def test_policy_api_is_exported():
    from bubblecast.policy import api

    assert bubblecast.Policy is api.Policy
    assert bubblecast.evaluate_policies is api.evaluate_policies
    assert bubblecast.Policy.predictive(horizon=32).get_params()["horizon"] == 32


@pytest.mark.slow  # MLflow store, train and registry: ~40 s (models:/ loading itself is also
@pytest.mark.filterwarnings("ignore::UserWarning")  # covered by tests/forecast/test_tracking.py)
def test_forecast_loads_a_registered_model_by_alias(fleet, tmp_path, monkeypatch, capsys):
    import pandas as pd

    from bubblecast import BubbleForecast

    events, path, _ = fleet
    monkeypatch.chdir(tmp_path)  # artifacts of the SQLite store land under ./mlruns
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    features = tmp_path / "features.parquet"
    _cli_json(capsys, "dataset", str(path), "--out", str(features), *DATASET_ARGS)
    trained = _cli_json(capsys, "train", str(features), "--model", "ewma", "--out",
                        str(tmp_path / "model"), "--register", "bc-api", "--alias", "champion",
                        "--tracking-uri", store)
    assert trained["registered"]["uri"] == "models:/bc-api@champion"
    by_alias = BubbleForecast.load("models:/bc-api@champion", tracking_uri=store)
    local = BubbleForecast.load(tmp_path / "model")
    assert list(by_alias.models_) == ["ewma"] and by_alias.horizons_ == [1, 5]
    run = events.run("fleet-3")
    pd.testing.assert_frame_equal(by_alias.predict(run), local.predict(run))
