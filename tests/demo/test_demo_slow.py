"""The demo's MLflow store and live closed loop, on the tiny preset (slow: tens of seconds)."""

from __future__ import annotations

import json

import pytest

from bubblecast.app.demo import EXPERIMENT, MODEL_NAME, preset, run_demo

pytestmark = pytest.mark.slow


def test_models_are_logged_and_registered_in_the_output_store(tmp_path, monkeypatch):
    import mlflow

    from bubblecast.forecast.modeldir import load_model

    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out = tmp_path / "demo"
    doc = run_demo(preset("tiny", track=True, megatron=None), out)
    uri = f"sqlite:///{(out / 'mlflow.db').as_posix()}"
    assert doc["mlflow_ui"] == f"mlflow ui --backend-store-uri {uri}"
    client = mlflow.MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name(EXPERIMENT).experiment_id])
    assert sorted(r.data.tags.get("bubblecast.command") for r in runs) == [
        "evaluate", "train", "train"]
    assert [p.name for p in (out / "mlruns").iterdir()]  # artifacts beside the store
    assert list(work.iterdir()) == []  # nothing written to the working directory
    champion = doc["stages"]["train"]["champion"]
    model = load_model(f"models:/{MODEL_NAME}@champion", tracking_uri=uri)
    assert model.kind == champion
    report = (out / "report.md").read_text()
    assert "models:/bubblecast-forecaster@champion" in report and uri in report


@pytest.mark.dist
def test_live_stage_runs_the_closed_loop_per_policy(tmp_path):
    from bubblecast.telemetry.io import read_events

    config = preset("tiny", live=True, live_steps=40, megatron=None)
    doc = run_demo(config, tmp_path / "demo")
    live = doc["stages"]["live"]
    assert live["closed_loop"] is True
    assert list(live["policies"]) == list(config.live_policies)
    for name, run in live["policies"].items():
        events = read_events(tmp_path / "demo" / run["events"])
        assert events.frame["step"].nunique() == config.live_steps
        assert run["mean_step_s"] > 0 and run["slowed_step_s"] > 0
        actions = json.loads((tmp_path / "demo" / "live" / f"{name}-actions.json").read_text())
        assert actions["policy"] == name
    assert live["policies"]["static"]["actions_taken"] == 0
    report = (tmp_path / "demo" / "report.md").read_text()
    assert "## 7. Live closed loop on CPU" in report and "live/live.png" in report
    balanced = doc["stages"]["balanced"]
    assert balanced["steps"] == config.balanced_steps
    planned = balanced["policies"]["balance"]
    assert planned["decisions"] == config.balanced_steps and planned["fallbacks"] == 0
    assert balanced["policies"]["static"]["decisions"] == 0
    assert balanced["loss_max_rel_diff"] < 1e-4  # the same documents, another packing
    assert set(balanced["predicted_speedup"]) == {"static", "tokens", "balance", "oracle"}
    assert (tmp_path / "demo" / "balanced" / "cost" / "model.json").is_file()
    assert "## 8. Balanced work live on CPU" in report
