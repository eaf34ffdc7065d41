"""MLflow: a trained model is logged, registered, aliased and loads back identically."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bubblecast.cli import main
from bubblecast.dataset import read_features
from bubblecast.forecast.modeldir import load_model
from bubblecast.forecast.tracking import DEFAULT_TRACKING_URI, resolve_tracking_uri
from bubblecast.forecast.training import train_model


def test_tracking_uri_precedence(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert resolve_tracking_uri(None) == DEFAULT_TRACKING_URI == "sqlite:///mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///env.db")
    assert resolve_tracking_uri(None) == "sqlite:///env.db"
    assert resolve_tracking_uri("sqlite:///cli.db") == "sqlite:///cli.db"


@pytest.mark.filterwarnings("ignore::UserWarning")  # MLflow's type-hint advice on pyfunc load
def test_registered_model_loads_by_alias_with_identical_predictions(features_file, tmp_path,
                                                                    monkeypatch, capsys):
    import mlflow

    monkeypatch.chdir(tmp_path)  # artifacts of the SQLite store land under ./mlruns
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = train_model(features_file, "lgbm", tmp_path / "model",
                         params={"n_estimators": 40, "early_stopping_rounds": 10},
                         tracking_uri=uri, register="bc-test", alias="champion")
    assert result["registered"] == {"name": "bc-test", "version": 1,
                                    "uri": "models:/bc-test@champion"}
    frame, meta = read_features(features_file)
    local = load_model(tmp_path / "model").predict(frame)
    by_alias = load_model("models:/bc-test@champion", tracking_uri=uri).predict(frame)
    np.testing.assert_array_equal(by_alias.to_numpy(), local.to_numpy())

    mlflow.set_tracking_uri(uri)
    run = mlflow.get_run(result["mlflow_run_id"])
    assert run.data.params["dataset_fingerprint"] == meta.fingerprint
    assert run.data.params["kind"] == "lgbm"
    assert "holdout.lgbm.h5.coverage_80" in run.data.metrics
    artifacts = {a.path for a in mlflow.MlflowClient().list_artifacts(run.info.run_id)}
    assert {"model.json", "forecast_vs_actual.png"} <= artifacts

    # The pyfunc face gives the same numbers, one row per input row, from the frame as read
    # (categorical keys, targets and all: what is not in its signature is ignored).
    pyfunc = mlflow.pyfunc.load_model("models:/bc-test@champion")
    out = pyfunc.predict(frame.head(20))
    assert list(out.columns) == [f"{q}_h{h}" for h in (1, 5) for q in ("p10", "p50", "p90")]
    for i, h in enumerate((1, 5)):
        np.testing.assert_array_equal(out[f"p50_h{h}"].to_numpy(), local["p50"].to_numpy()[
            i * len(frame):i * len(frame) + 20])

    code = main(["evaluate", str(features_file), "--model", "models:/bc-test@champion",
                 "--tracking-uri", uri, "--json"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert "lgbm" in summary["models"]
    runs = mlflow.search_runs(experiment_names=["bubblecast"])
    assert set(runs["tags.bubblecast.command"]) == {"train", "evaluate"}


def test_unknown_alias_is_a_one_line_error(tmp_path, features_file, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'other.db'}"
    code = main(["evaluate", str(features_file), "--model", "models:/nothing@champion",
                 "--tracking-uri", uri, "--no-track"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "models:/nothing@champion: cannot load" in err


@pytest.fixture(autouse=True)
def _no_global_store(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
