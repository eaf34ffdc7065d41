"""``train``/``evaluate`` on a features dataset partitioned by run with one corrupt part:
fail naming the run and its file (exit 2, nothing written), or with ``--skip-bad-runs``
succeed listing it; ``seq`` on such a dataset fits from its parts. In process, no Dask."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bubblecast.cli import main
from bubblecast.telemetry.fleet import run_dir_name, sidecar_dir

SIM = ["simulate", "--schedule", "1f1b", "--stages", "2", "--microbatches", "4", "--steps",
       "40", "--scenario", "mixed", "--seed", "3"]
DATA = ["--windows", "5,20", "--horizons", "1,5", "--lags", "8"]


@pytest.fixture(scope="module")
def features(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A features dataset partitioned by run (5 runs), built in process."""
    root = tmp_path_factory.mktemp("skipfeat")
    assert main([*SIM, "--runs", "5", "--out", f"{root / 'fleet'}/"]) == 0
    assert main(["dataset", str(root / "fleet"), *DATA, "--out", f"{root / 'feat'}/",
                 "--json"]) == 0
    return root / "feat"


@pytest.fixture
def corrupt(features: Path, tmp_path: Path) -> Path:
    """A copy of ``features`` whose run sim-2 part is truncated."""
    copy = tmp_path / "feat"
    shutil.copytree(features, copy)
    shutil.copytree(sidecar_dir(features), sidecar_dir(copy))  # the dataset's metadata
    part = copy / run_dir_name("sim-2") / "part-00000.parquet"
    part.write_bytes(part.read_bytes()[:200] + b"\0" * 64)
    return copy


def _json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_train_fails_naming_the_run_or_skips_it(corrupt: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "m"
    args = ["train", str(corrupt), "--model", "ewma", "--no-track", "--out", str(model),
            "--json"]
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "run 'sim-2'" in err and "part-00000.parquet" in err
    assert not model.exists() and not list(tmp_path.glob(".m*"))
    assert main([*args, "--skip-bad-runs"]) == 0
    cap = capsys.readouterr()
    result = _json(cap.out)
    assert [s["run_id"] for s in result["skipped_runs"]] == ["sim-2"]
    assert result["skipped_runs"][0]["path"].endswith("part-00000.parquet")
    assert "skipped sim-2" in cap.err
    assert (model / "model.json").is_file()
    held = json.loads((model / "model.json").read_text())["dataset"]["holdout_runs"]
    assert "sim-2" not in held


def test_evaluate_fails_naming_the_run_or_skips_it(features: Path, corrupt: Path,
                                                  tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "m"
    assert main(["train", str(features), "--model", "ewma", "--no-track", "--out",
                 str(model)]) == 0
    plots = tmp_path / "plots"
    args = ["evaluate", str(corrupt), "--model", str(model), "--no-track", "--json",
            "--plot", str(plots)]
    capsys.readouterr()
    assert main(args) == 2
    cap = capsys.readouterr()
    assert "run 'sim-2'" in cap.err and "part-00000.parquet" in cap.err
    assert cap.out == "" and not plots.exists()
    assert main([*args, "--skip-bad-runs"]) == 0
    cap = capsys.readouterr()
    summary = _json(cap.out)
    assert [s["run_id"] for s in summary["skipped_runs"]] == ["sim-2"]
    assert "ewma" in summary["models"] and "skipped sim-2" in cap.err


def test_nothing_bad_same_output_and_skipped_runs_only_when_asked(
        features: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "m"
    assert main(["train", str(features), "--model", "ewma", "--no-track", "--out",
                 str(model), "--json"]) == 0
    plain = _json(capsys.readouterr().out)
    assert "skipped_runs" not in plain
    shutil.rmtree(model)
    assert main(["train", str(features), "--model", "ewma", "--no-track", "--out",
                 str(model), "--json", "--skip-bad-runs"]) == 0
    assert _json(capsys.readouterr().out) == {**plain, "skipped_runs": []}
    args = ["evaluate", str(features), "--model", str(model), "--no-track", "--json"]
    assert main(args) == 0
    plain = _json(capsys.readouterr().out)
    assert "skipped_runs" not in plain
    assert main([*args, "--skip-bad-runs"]) == 0
    assert _json(capsys.readouterr().out) == {**plain, "skipped_runs": []}


@pytest.mark.parametrize("command", ["train", "evaluate"])
def test_skip_bad_runs_with_cluster_is_refused(features: Path, tmp_path: Path, command: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    extra = {"train": ["--model", "ewma", "--out", str(tmp_path / "m")],
             "evaluate": ["--model", str(tmp_path), "--json"]}[command]
    assert main([command, str(features), *extra, "--no-track", "--skip-bad-runs",
                 "--cluster", "local:1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--skip-bad-runs" in err and "--cluster" in err and "\n" not in err
    assert not (tmp_path / "m").exists()


def test_seq_on_parts_fits_as_on_the_frame(features: Path, corrupt: Path,
                                           tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from bubblecast.dataset.store import read_features, write_features
    from bubblecast.forecast.seq import SeqForecaster
    from bubblecast.forecast.training import train_model

    pytest.importorskip("torch")
    frame, meta = read_features(features)
    one = write_features(frame, meta, tmp_path / "one.parquet")
    calls: list[list[str]] = []
    original = SeqForecaster.fit_partitioned

    def spy(self: SeqForecaster, path: object, runs: list[str] | None = None) -> object:
        calls.append(list(runs or []))
        return original(self, path, runs)

    monkeypatch.setattr(SeqForecaster, "fit_partitioned", spy)
    params = {"hidden": 8, "epochs": 2, "max_train_rows": 150, "seed": 1}
    on_file = train_model(one, "seq", tmp_path / "a", params=params, track=False)
    assert calls == []

    def whole(*_a: object, **_k: object) -> None:
        raise AssertionError("the partitioned dataset was read whole")

    monkeypatch.setattr("bubblecast.forecast.training.read_features_skipping", whole)
    on_parts = train_model(features, "seq", tmp_path / "b", params=params, track=False)
    assert len(calls) == 1 and len(calls[0]) == on_parts["runs"] == on_file["runs"]
    assert on_parts["metrics"] == on_file["metrics"] and on_parts["metrics"]
    assert {k: v for k, v in on_parts.items() if k not in ("out", "fingerprint")} == \
        {k: v for k, v in on_file.items() if k not in ("out", "fingerprint")}
    from bubblecast.forecast.modeldir import read_model_json

    held = [read_model_json(tmp_path / m)["dataset"] for m in ("a", "b")]
    assert held[0]["holdout_runs"] == held[1]["holdout_runs"] and held[0]["holdout_runs"]
    assert (held[0]["rows"], held[0]["runs"]) == (held[1]["rows"], held[1]["runs"])
    skipped = train_model(corrupt, "seq", tmp_path / "c", params=params, track=False,
                          skip_bad=True)
    assert "sim-2" not in calls[1] and [s["run_id"] for s in skipped["skipped_runs"]] == [
        "sim-2"]
