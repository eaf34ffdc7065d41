"""The demo's MLflow store and live closed loop, on the tiny preset (slow: tens of seconds)."""

from __future__ import annotations

import json
import shutil

import pytest

from bubblecast.demo import preset, run_demo
from bubblecast.demo.mlstore import EXPERIMENT, MODEL_NAME, sqlite_uri

pytestmark = pytest.mark.slow


def test_models_are_logged_and_registered_in_the_output_store(tmp_path, monkeypatch):
    import mlflow

    from bubblecast.forecast.modeldir import load_model

    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out = tmp_path / "demo"
    config = preset("tiny", track=True, megatron=None)
    for k in range(2):  # a second fresh run replaces the store, it does not pile up
        result = run_demo(config, out)
        assert result.mlflow_ui == f"mlflow ui --backend-store-uri {sqlite_uri(out / 'mlflow.db')}"
        # query a copy: MLflow caches one engine per URI, and the file under it was replaced
        copy = tmp_path / f"copy-{k}.db"
        shutil.copyfile(out / "mlflow.db", copy)
        uri = sqlite_uri(copy)
        client = mlflow.MlflowClient(tracking_uri=uri)
        exp = client.get_experiment_by_name(EXPERIMENT)
        runs = client.search_runs([exp.experiment_id])
        commands = sorted(r.data.tags.get("bubblecast.command") for r in runs)
        assert commands == ["evaluate", "train", "train"]
        roots = [p.name for p in (out / "mlruns").iterdir()]
        assert roots == [result.records["train"]["result"]["artifact_root"]]
    assert list(work.iterdir()) == []  # nothing written to the working directory
    champion = result.records["train"]["result"]["champion"]
    model = load_model(f"models:/{MODEL_NAME}@champion", tracking_uri=uri)
    assert model.kind == champion
    assert "models:/bubblecast-forecaster@champion" in (out / "report.md").read_text()


@pytest.mark.dist
def test_live_stage_runs_the_closed_loop_per_policy(tmp_path):
    from bubblecast.telemetry.io import read_events

    config = preset("tiny", live=True, live_steps=40, megatron=None)
    result = run_demo(config, tmp_path / "demo")
    live = result.records["live"]["result"]
    assert live["closed_loop"] is True
    assert list(live["policies"]) == list(config.live_policies)
    for name, run in live["policies"].items():
        events = read_events(tmp_path / "demo" / run["events"])
        assert events.frame["step"].nunique() == config.live_steps
        assert run["mean_step_s"] > 0 and run["slowed_step_s"] > 0
        actions = json.loads((tmp_path / "demo" / "live" / f"{name}-actions.json").read_text())
        assert actions["policy"] == name
    assert live["policies"]["static"]["actions_taken"] == 0
    assert "## 7. Live closed loop on CPU" in (tmp_path / "demo" / "report.md").read_text()
