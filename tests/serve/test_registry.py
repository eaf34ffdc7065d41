"""Model sources: directories and the MLflow registry, fingerprints, alias-move reloads."""

from __future__ import annotations

import pytest

from bubblecast.errors import BubblecastError
from bubblecast.serve.predictor import Predictor
from bubblecast.serve.registry import ModelSource, SourceWatcher, parse_uri
from tests.serve.fakes import ScaledLast, forecast_request, load_fake, write_model_dir


def test_parse_uri():
    assert parse_uri("models:/fc@champion") == ("fc", "champion", None)
    assert parse_uri("models:/fc/3") == ("fc", None, "3")
    assert parse_uri("/some/dir") is None
    with pytest.raises(BubblecastError, match="models:/NAME@ALIAS"):
        parse_uri("models:/fc@a@b")


def test_a_missing_directory_is_a_one_line_error(tmp_path):
    with pytest.raises(BubblecastError, match="not a model directory"):
        ModelSource(str(tmp_path / "nope"))


def test_directory_watcher_reloads_when_model_json_changes(tmp_path):
    d = write_model_dir(tmp_path / "m", scale=1.0)
    pred = Predictor.from_source(str(d), loader=load_fake)
    src = pred.source
    calls = []

    def reload():
        calls.append(pred.reload().version)

    w = SourceWatcher(src.fingerprint, reload, interval_s=60, initial=src.fingerprint())
    assert not w.poll() and calls == []
    write_model_dir(d, scale=2.0, name="fake-v2")
    assert w.poll() and len(calls) == 1
    assert pred.info.name == "fake-v2" and not w.poll()


def test_watcher_keeps_serving_when_the_new_model_is_broken(tmp_path):
    d = write_model_dir(tmp_path / "m", scale=1.0)
    pred = Predictor.from_source(str(d), loader=load_fake)
    w = SourceWatcher(pred.source.fingerprint, pred.reload, interval_s=60,
                      initial=pred.source.fingerprint())
    (d / "model.json").write_text("{not json")
    with pytest.raises(ValueError):
        w.poll()
    assert pred.forecast(forecast_request()).model.name == "fake"  # the old model serves
    write_model_dir(d, scale=3.0, name="fixed")
    assert w.poll() and pred.info.name == "fixed"  # retried at the next poll


def test_registry_alias_resolves_loads_and_reloads_when_it_moves(tmp_path):
    pytest.importorskip("mlflow")
    from mlflow import MlflowClient

    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=tracking)
    v1 = write_model_dir(tmp_path / "v1", scale=1.0)
    v2 = write_model_dir(tmp_path / "v2", scale=2.0)
    exp = client.create_experiment("serve-test")
    run = client.create_run(exp)
    client.log_metric(run.info.run_id, "mae_h1", 0.125)
    client.create_registered_model("bc")
    client.create_model_version("bc", source=str(v1), run_id=run.info.run_id)
    client.create_model_version("bc", source=str(v2), run_id=run.info.run_id)
    client.set_registered_model_alias("bc", "champion", "1")

    def loader(uri: str):  # models:/bc/N -> the version's source directory
        name, _, version = uri[len("models:/"):].partition("/")
        return load_fake(client.get_model_version(name, version).source)

    pred = Predictor.from_source("models:/bc@champion", loader=loader, tracking_uri=tracking)
    info = pred.info
    assert (info.name, info.version, info.alias) == ("bc", "1", "champion")
    assert info.metrics["scale"] == 1.0  # the model's own metrics
    w = SourceWatcher(pred.source.fingerprint, pred.reload, interval_s=60,
                      initial=pred.source.fingerprint())
    assert not w.poll()
    client.set_registered_model_alias("bc", "champion", "2")
    assert w.poll()
    req = forecast_request()
    out = pred.forecast(req)
    assert out.model.version == "2"
    assert out.ranks[0].p50[0] == pytest.approx(2 * req["ranks"][0]["compute_s"][-1])
    pinned = ModelSource("models:/bc/1", loader=loader, tracking_uri=tracking)
    assert pinned.fingerprint() == "1"
    bare = ModelSource("models:/bc/1", loader=lambda uri: ScaledLast(), tracking_uri=tracking)
    assert bare.load()[1].metrics == {"mae_h1": 0.125}  # from the run that logged it
    with pytest.raises(BubblecastError, match="cannot resolve alias"):
        ModelSource("models:/bc@nobody", loader=loader, tracking_uri=tracking).load()
