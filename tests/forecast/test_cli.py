"""`dataset`, `train` and `evaluate` on the command line: outputs and one-line errors."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from bubblecast.cli import main
from bubblecast.dataset.config import FEATURES_VERSION
from bubblecast.dataset.store import METADATA_KEY
from bubblecast.telemetry import write_events
from tests.dataset.synth import make_events


def _one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    lines = [x for x in captured.err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("bubblecast: error:"), captured.err
    return lines[0]


@pytest.fixture(scope="module")
def events_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("ev") / "events.parquet"
    return write_events(make_events(runs=6, steps=60, seed=5), path)


def test_dataset_writes_a_features_file(events_file, tmp_path, capsys):
    out = tmp_path / "f.parquet"
    code = main(["dataset", str(events_file), "--horizons", "1,3", "--windows", "4,8,16",
                 "--lags", "8", "--out", str(out), "--json"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["runs"] == 6 and summary["horizons"] == [1, 3]
    assert summary["rows"] == pq.read_metadata(out).num_rows == 6 * 4 * (60 - 16 + 1)


def test_dataset_refuses_runs_that_are_too_short(events_file, tmp_path, capsys):
    code = main(["dataset", str(events_file), "--horizons", "1,10", "--out",
                 str(tmp_path / "f.parquet")])
    assert code == 2
    assert "has 60 steps; the dataset needs at least 70" in _one_error_line(capsys)
    assert not (tmp_path / "f.parquet").exists()


def test_train_and_evaluate_a_model_directory(features_file, tmp_path, capsys):
    model_dir = tmp_path / "ewma"
    assert main(["train", str(features_file), "--model", "ewma", "--out", str(model_dir),
                 "--no-track", "--json"]) == 0
    trained = json.loads(capsys.readouterr().out)
    assert trained["kind"] == "ewma" and set(trained["metrics"]) == {"h1", "h5"}
    assert main(["evaluate", str(features_file), "--model", str(model_dir), "--model",
                 str(model_dir), "--no-track", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"models", "baseline"}
    assert set(out["models"]) == {"last", "ewma", "rolling_median", "seasonal_naive",
                                  "ewma-2", "ewma-3"}
    assert out["baseline"] in {"last", "ewma", "rolling_median", "seasonal_naive"}
    for per_h in out["models"].values():
        assert set(per_h) == {"h1", "h5"}
        for metrics in per_h.values():
            assert set(metrics) == {"mae", "coverage_80", "skill"}
    best = min(out["models"][b]["h1"]["mae"] for b in ("last", "ewma", "rolling_median",
                                                        "seasonal_naive"))
    for per_h in out["models"].values():
        assert per_h["h1"]["skill"] == pytest.approx(1 - per_h["h1"]["mae"] / best)


def test_unknown_model_name_exits_2(features_file, capsys):
    assert main(["train", str(features_file), "--model", "prophet", "--no-track",
                 "--out", "x"]) == 2
    assert "unknown model 'prophet'" in _one_error_line(capsys)


def test_missing_or_corrupt_model_directory_exits_2(features_file, tmp_path, capsys):
    assert main(["evaluate", str(features_file), "--model", str(tmp_path / "none"),
                 "--no-track"]) == 2
    assert "model directory does not exist" in _one_error_line(capsys)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "model.json").write_text('{"format": "bubblecast-forecaster"')
    assert main(["evaluate", str(features_file), "--model", str(bad), "--no-track"]) == 2
    assert "corrupt model file" in _one_error_line(capsys)


def test_features_file_from_another_version_exits_2(features_file, tmp_path, capsys):
    table = pq.read_table(features_file)
    meta = dict(table.schema.metadata)
    obj = json.loads(meta[METADATA_KEY])
    obj["features_version"] = FEATURES_VERSION - 1
    meta[METADATA_KEY] = json.dumps(obj).encode()
    old = tmp_path / "old.parquet"
    pq.write_table(table.replace_schema_metadata(meta), old)
    for argv in (["evaluate", str(old), "--no-track"],
                 ["train", str(old), "--model", "last", "--no-track", "--out", "x"]):
        assert main(argv) == 2
        assert f"features version {FEATURES_VERSION - 1}" in _one_error_line(capsys)
