"""`train EVENTS... --model cost`, `evaluate EVENTS --model DIR` and ``BubbleForecast`` with a
cost model: outputs, one-line errors with nothing written, MLflow registry round trip."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bubblecast.cli import main
from bubblecast.errors import BubblecastError
from bubblecast.forecast.cost_modeldir import load_cost_model
from bubblecast.telemetry import from_frame, write_events
from tests.forecast.test_cost_model import simulate

SCORE_KEYS = {"mae_s", "p50_rel_error", "p90_rel_error", "coverage_p10_p90", "rows", "learner",
              "runs"}


def _one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and captured.out == ""
    lines = [x for x in captured.err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("bubblecast: error:"), captured.err
    return lines[0]


@pytest.fixture(scope="module")
def event_files(tmp_path_factory):
    """Two events files of packed-document runs (3 + 2 runs) and a third of 2 new runs."""
    root = tmp_path_factory.mktemp("cost-ev")
    return (write_events(simulate(3, 21, "a", steps=24), root / "a.parquet"),
            write_events(simulate(2, 22, "b", steps=24), root / "b.parquet"),
            write_events(simulate(2, 23, "new", steps=24), root / "new.parquet"))


@pytest.fixture(scope="module")
def cost_dir(event_files, tmp_path_factory):
    out = tmp_path_factory.mktemp("cost-model") / "cost"
    assert main(["train", str(event_files[0]), str(event_files[1]), "--model", "cost",
                 "--out", str(out), "--no-track", "--json", "--seed", "3"]) == 0
    return out


def test_train_writes_the_directory_and_json(event_files, tmp_path, capsys):
    out = tmp_path / "cost"
    code = main(["train", str(event_files[0]), str(event_files[1]), "--model", "cost",
                 "--out", str(out), "--no-track", "--json", "--seed", "3"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result) == {"model", "learner", "out", "heldout", "rows", "runs"}
    assert result["model"] == "cost" and result["out"] == str(out)
    assert set(result["heldout"]) == SCORE_KEYS and result["heldout"]["runs"] == 1
    # 5 runs, holdout 0.2: 4 fitted on, 1 held out; each run 24 steps x 8 ranks x 8 mb x 3 ops
    assert result["runs"] == 4 and result["rows"] == 4 * 24 * 8 * 8 * 3
    assert result["heldout"]["p90_rel_error"] < 0.05
    doc = json.loads((out / "model.json").read_text())
    assert doc["kind"] == "cost" and doc["learner"] == result["learner"]
    assert doc["metrics"]["heldout"] == result["heldout"]
    assert doc["training"]["sources"] == [str(event_files[0]), str(event_files[1])]
    assert load_cost_model(out).learner_ == result["learner"]


def test_train_prints_a_summary_without_json(event_files, tmp_path, capsys):
    assert main(["train", str(event_files[0]), "--model", "cost", "--out",
                 str(tmp_path / "c"), "--no-track"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("trained cost model (") and "held-out runs: p50 relative error" in text


def test_evaluate_reports_the_cost_models_error(cost_dir, event_files, capsys):
    assert main(["evaluate", str(event_files[2]), "--model", str(cost_dir), "--no-track",
                 "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result) == SCORE_KEYS | {"model"} and result["model"] == "cost"
    assert result["runs"] == 2 and result["rows"] == 2 * 24 * 8 * 8 * 3
    assert result["p90_rel_error"] < 0.05
    assert result == {"model": "cost", **load_cost_model(cost_dir).score(
        _read(event_files[2]))}


def _read(path):
    from bubblecast.telemetry import read_events

    return read_events(path)


@pytest.mark.parametrize("args, message", [
    (["--model", "cost", "--holdout", "0.2"], "needs at least 2 runs (1 to fit, 1 held out), "
                                             "got 1; give more runs or holdout 0"),
    (["--model", "cost", "--epochs", "3"], "--epochs: not with --model cost"),
    (["--model", "lgbm", "EXTRA"], "--model lgbm trains on one features file, got 2 paths"),
])
def test_train_bad_usage_exits_2_and_writes_nothing(tmp_path, capsys, args, message):
    one = write_events(simulate(2, 30, "one", steps=12).run("one-0"), tmp_path / "one.parquet")
    args = [str(one) if a == "EXTRA" else a for a in args]
    out = tmp_path / "cost"
    assert main(["train", str(one), *args, "--out", str(out), "--no-track"]) == 2
    assert message in _one_error_line(capsys)
    assert not out.exists()


def test_train_on_events_without_tokens_exits_2(tmp_path, capsys):
    events = simulate(2, 31, "nt", steps=12)
    plain = from_frame(events.frame.drop(columns=["tokens", "tokens_sq", "documents"]),
                       events.runs)
    path = write_events(plain, tmp_path / "plain.parquet")
    out = tmp_path / "cost"
    assert main(["train", str(path), "--model", "cost", "--out", str(out), "--no-track"]) == 2
    assert f"{path}: column 'tokens' is missing" in _one_error_line(capsys)
    assert not out.exists()


def test_evaluate_refuses_a_cost_model_beside_a_forecaster(cost_dir, event_files, capsys):
    assert main(["evaluate", str(event_files[2]), "--model", str(cost_dir), "--model",
                 str(cost_dir), "--no-track"]) == 2
    assert "a cost model is evaluated on events on its own, without a second --model" in \
        _one_error_line(capsys)


def test_a_forecaster_directory_is_not_a_cost_model(features_file, tmp_path, capsys):
    ewma = tmp_path / "ewma"
    assert main(["train", str(features_file), "--model", "ewma", "--out", str(ewma),
                 "--no-track"]) == 0
    capsys.readouterr()
    with pytest.raises(BubblecastError, match=r"a ewma forecaster, not a cost model"):
        load_cost_model(ewma)


def test_bubble_forecast_fits_evaluates_saves_and_loads_a_cost_model(event_files, tmp_path):
    from bubblecast import BubbleForecast

    new = _read(event_files[2])
    forecast = BubbleForecast(models=[("cost", {"learner": "linear"})], seed=2)
    forecast.fit([event_files[0], event_files[1]])
    assert list(forecast.models_) == ["cost"] and forecast.horizons_ == []
    result = forecast.evaluate(new)
    assert set(result) == SCORE_KEYS | {"model"} and result["runs"] == 2
    assert result == {"model": "cost", **forecast.models_["cost"].score(new)}
    forecast.save(tmp_path / "one")
    back = BubbleForecast.load(tmp_path / "one")
    np.testing.assert_array_equal(back.models_["cost"].predict(new),
                                  forecast.models_["cost"].predict(new))
    with pytest.raises(BubblecastError, match="no forecaster among the models"):
        back.predict(new)


def test_bubble_forecast_reports_cost_beside_forecasters(event_files, tmp_path):
    from bubblecast import BubbleForecast

    forecast = BubbleForecast(models=["ewma", "cost"], horizons=(1,), windows=(4, 8), lags=4)
    forecast.fit(event_files[0])
    assert list(forecast.models_) == ["ewma", "cost"] and forecast.horizons_ == [1]
    result = forecast.evaluate(event_files[2])
    assert {"models", "baseline", "cost"} <= set(result) and "ewma-2" in result["models"]
    assert set(result["cost"]) == SCORE_KEYS | {"model"}
    assert set(forecast.predict(_read(event_files[2]).run("new-0"))["model"]) == {"ewma"}
    forecast.save(tmp_path / "both")
    assert sorted(p.name for p in (tmp_path / "both").iterdir()) == ["cost", "ewma"]
    back = BubbleForecast.load(tmp_path / "both")
    assert sorted(back.models_) == ["cost", "ewma"] and back.horizons_ == [1]


@pytest.mark.filterwarnings("ignore::UserWarning")  # MLflow's advice on pyfunc type hints
def test_registered_cost_model_loads_by_alias(event_files, tmp_path, monkeypatch, capsys):
    import mlflow

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)  # artifacts of the SQLite store land under ./mlruns
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = tmp_path / "cost"
    assert main(["train", str(event_files[0]), str(event_files[1]), "--model", "cost",
                 "--out", str(out), "--tracking-uri", uri, "--register", "bc-cost",
                 "--alias", "champion", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["registered"] == {"name": "bc-cost", "version": 1,
                                    "uri": "models:/bc-cost@champion"}
    new = _read(event_files[2])
    by_alias = load_cost_model("models:/bc-cost@champion", tracking_uri=uri)
    np.testing.assert_array_equal(by_alias.predict(new), load_cost_model(out).predict(new))
    mlflow.set_tracking_uri(uri)
    # MLflow's own pyfunc face of the logged directory prices the same op rows
    rows = by_alias.rows(new).head(50)
    pyfunc = mlflow.pyfunc.load_model("models:/bc-cost@champion")
    got = pyfunc.predict(rows)
    assert list(got.columns) == ["p10", "p50", "p90"]
    np.testing.assert_allclose(got.to_numpy(), by_alias.predict(rows, quantiles=(0.1, 0.5, 0.9)))
    mlflow.set_tracking_uri(uri)
    run = mlflow.get_run(result["mlflow_run_id"])
    assert run.data.params["kind"] == "cost" and run.data.params["learner"] == result["learner"]
    assert run.data.metrics["holdout.cost.p90_rel_error"] == pytest.approx(
        result["heldout"]["p90_rel_error"])
    assert main(["evaluate", str(event_files[2]), "--model", "models:/bc-cost@champion",
                 "--tracking-uri", uri, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == "cost"
    runs = mlflow.search_runs(experiment_names=["bubblecast"])
    assert sorted(runs["tags.bubblecast.command"]) == ["evaluate", "train"]
