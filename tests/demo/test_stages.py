"""Stage folders commit atomically; leftovers of an interrupted run are cleaned; config checks."""

from __future__ import annotations

import json

import pytest

from bubblecast.demo.config import DemoConfig, preset
from bubblecast.demo.stages import STAGE_FILE, Workspace, dumps
from bubblecast.errors import BubblecastError


def test_stage_commits_only_when_its_body_returns(tmp_path):
    ws = Workspace(tmp_path / "out")
    with ws.stage("a", "fp1") as ctx:
        (ctx.dir / "data.txt").write_text("one")
        ctx.result["n"] = 1
    assert (ws.path("a", "data.txt")).read_text() == "one"
    assert ws.finished("a", "fp1")["result"] == {"n": 1}
    assert ws.finished("a", "other") is None

    with pytest.raises(KeyboardInterrupt), ws.stage("a", "fp2") as ctx:
        (ctx.dir / "data.txt").write_text("half")
        raise KeyboardInterrupt
    # the previous complete folder is untouched and nothing half-written is left
    assert ws.path("a", "data.txt").read_text() == "one"
    assert ws.record("a")["fingerprint"] == "fp1"
    assert [p.name for p in ws.out.iterdir()] == ["a"]


def test_stage_replaces_previous_folder_and_promotes_files(tmp_path):
    ws = Workspace(tmp_path / "out")
    with ws.stage("a", "fp1") as ctx:
        (ctx.dir / "old.txt").write_text("old")
    with ws.stage("a", "fp2") as ctx:
        (ctx.dir / "new.txt").write_text("new")
        (ctx.dir / "store.db").write_text("db")
        ctx.promote(ctx.dir / "store.db", ws.out / "store.db")
    assert sorted(p.name for p in ws.path("a").iterdir()) == ["new.txt", STAGE_FILE]
    assert (ws.out / "store.db").read_text() == "db"
    assert sorted(p.name for p in ws.out.iterdir()) == ["a", "store.db"]


def test_clean_removes_what_a_killed_run_left(tmp_path):
    ws = Workspace(tmp_path)
    (tmp_path / ".tmp-train-4242").mkdir()
    (tmp_path / ".tmp-train-4242" / "lgbm").mkdir()
    (tmp_path / ".old-dataset-17").mkdir()
    (tmp_path / ".report.md.abc.tmp").write_text("partial")
    (tmp_path / "simulate").mkdir()
    removed = ws.clean()
    assert sorted(removed) == [".old-dataset-17", ".report.md.abc.tmp", ".tmp-train-4242"]
    assert [p.name for p in tmp_path.iterdir()] == ["simulate"]


def test_unreadable_record_counts_as_unfinished(tmp_path):
    ws = Workspace(tmp_path)
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / STAGE_FILE).write_text("{not json")
    assert ws.record("a") is None and ws.finished("a", "x") is None


def test_dumps_is_strict_json():
    import numpy as np

    text = dumps({"a": float("nan"), "b": np.float64(1.5), "c": [np.int32(2), float("inf")]})
    assert json.loads(text) == {"a": None, "b": 1.5, "c": [2, None]}


@pytest.mark.parametrize("change", [
    {"scenarios": ("nope",)}, {"runs": 0}, {"seed": -1}, {"holdout": 1.0},
    {"policies": ("static", "bogus")}, {"live_policies": ("oracle",)},
    {"steps": 20}, {"lags": 500}, {"live_model": "x"}, {"runs": 1, "scenarios": ("throttle",)},
])
def test_bad_config_is_refused_with_one_line(change):
    with pytest.raises(BubblecastError) as info:
        DemoConfig(**change)
    assert "\n" not in str(info.value)


def test_fingerprints_follow_fields_and_upstream():
    a = preset("tiny")
    fp = a.fingerprint("dataset", {"simulate": "x"})
    assert fp == preset("tiny").fingerprint("dataset", {"simulate": "x"})
    assert fp != a.fingerprint("dataset", {"simulate": "y"})
    assert fp != a.with_(lags=4).fingerprint("dataset", {"simulate": "x"})
    # a field the stage does not read leaves it alone
    assert fp == a.with_(seq_epochs=3).fingerprint("dataset", {"simulate": "x"})


def test_an_output_folder_holding_something_else_is_refused(tmp_path):
    markers = ("demo.json", "simulate/stage.json")
    Workspace(tmp_path / "new").check(markers)  # absent: fine
    (tmp_path / "empty").mkdir()
    Workspace(tmp_path / "empty").check(markers)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(BubblecastError, match="not empty"):
        Workspace(tmp_path / "mine").check(markers)
    (tmp_path / "file").write_text("x")
    with pytest.raises(BubblecastError, match="not a folder"):
        Workspace(tmp_path / "file").check(markers)
    (tmp_path / "killed").mkdir()
    (tmp_path / "killed" / ".tmp-simulate-77").mkdir()
    Workspace(tmp_path / "killed").check(markers)  # a first run killed in its first stage
    (tmp_path / "mine" / "simulate").mkdir()
    (tmp_path / "mine" / "simulate" / STAGE_FILE).write_text("{}")
    Workspace(tmp_path / "mine").check(markers)  # an earlier (even interrupted) demo: fine


def test_progress_displays_report_each_stage(tmp_path):
    import io

    from rich.console import Console
    from rich.progress import Progress as Bars

    from bubblecast.demo.progress import RichProgress, progress_display

    stream = io.StringIO()
    with progress_display("lines", stream) as p:
        p.stage(1, 2, "Simulate")
        p.note("train runs")
        p.advance(3, 10)
        p.finish("Simulate", 1.25, False)
        p.stage(2, 2, "Train")
        p.finish("Train", 0.0, True, "kept")
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("[1/2] Simulate") and lines[0].endswith("1.2 s")
    assert lines[1].startswith("[2/2] Train") and "reused" in lines[1] and "(kept)" in lines[1]

    console = Console(file=io.StringIO(), force_terminal=True, width=100)
    with Bars(console=console) as bars:
        rich = RichProgress(bars, console)
        rich.stage(1, 1, "Simulate")
        rich.note("runs")
        rich.advance(5, 10)
        rich.finish("Simulate", 2.0, False)
    assert "Simulate" in console.file.getvalue()
