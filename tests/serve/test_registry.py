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


def _copy(src, dst, name):
    (dst / name).write_bytes((src / name).read_bytes())


@pytest.mark.parametrize("first", ["model.json", "spread.json"])
def test_a_half_copied_directory_is_refused_and_the_old_model_keeps_serving(tmp_path, first):
    """Files of two versions (either copied first), a truncated model.json, a listed file
    missing: each reload is refused with the reason; the old model keeps serving."""
    d = write_model_dir(tmp_path / "m", scale=1.0, spread=0.1)
    new = write_model_dir(tmp_path / "new", scale=2.0, spread=0.3, name="v2")
    pred = Predictor.from_source(str(d), loader=load_fake)
    req = forecast_request()
    before = pred.forecast(req)
    w = SourceWatcher(pred.source.fingerprint, pred.reload, interval_s=60, settle=True,
                      initial=pred.source.fingerprint())
    _copy(new, d, first)
    with pytest.raises(BubblecastError, match="does not match model.json"):
        pred.reload()
    assert pred.forecast(req) == before
    assert not w.poll()  # moved: waits for the directory to hold still
    with pytest.raises(BubblecastError, match="files of two versions"):
        w.poll()
    assert pred.forecast(req) == before
    other = "spread.json" if first == "model.json" else "model.json"
    _copy(new, d, other)
    assert not w.poll() and w.poll()  # held still and consistent: loaded
    after = pred.forecast(req)
    assert pred.info.name == "v2" and after.ranks[0].p90[0] == pytest.approx(
        1.3 * after.ranks[0].p50[0])


def test_truncated_or_incomplete_directories_are_refused(tmp_path):
    from bubblecast.serve.registry import directory_state

    d = write_model_dir(tmp_path / "m", scale=1.0, spread=0.1)
    good = directory_state(d)
    raw = (d / "model.json").read_bytes()
    (d / "model.json").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(BubblecastError, match="not complete JSON"):
        directory_state(d)
    (d / "model.json").write_bytes(raw)
    (d / "spread.json").unlink()
    with pytest.raises(BubblecastError, match="spread.json, listed in model.json, is missing"):
        directory_state(d)
    write_model_dir(d, scale=1.0, spread=0.1)
    assert directory_state(d) == good


def test_the_fingerprint_covers_every_file(tmp_path):
    d = write_model_dir(tmp_path / "m", scale=1.0, spread=0.1)
    src = ModelSource(str(d), loader=load_fake)
    first = src.fingerprint()
    (d / "spread.json").write_bytes(b'{"spread": 0.25}')
    assert src.fingerprint() != first
    assert src.settles


def test_the_watcher_logs_why_it_keeps_the_served_model(tmp_path, caplog):
    import time

    d = write_model_dir(tmp_path / "m", scale=1.0, spread=0.1)
    pred = Predictor.from_source(str(d), loader=load_fake)
    w = SourceWatcher(pred.source.fingerprint, pred.reload, interval_s=0.01, settle=True,
                      initial=pred.source.fingerprint())
    (d / "spread.json").write_bytes(b'{"spread": 0.5}')  # not what model.json says
    with caplog.at_level("WARNING", logger="bubblecast.serve"):
        w.start()
        deadline = time.monotonic() + 30
        while "does not match" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.02)
        w.stop()
    assert "the served model keeps serving" in caplog.text and "spread.json" in caplog.text
    assert pred.info.name == "fake"
