"""The demo's config, output folder, strict JSON and live-figure helpers (no stage runs)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from bubblecast.app.demo import DemoConfig, _prepare, preset
from bubblecast.app.demo_report import dumps, ideal_speedup, render, slowed_steps
from bubblecast.errors import BubblecastError
from bubblecast.telemetry.jsonclean import plain


def test_dumps_is_strict_json():
    import numpy as np

    value = {"a": float("nan"), "b": np.float64(1.5), "c": [np.int32(2), float("inf")]}
    assert json.loads(dumps(value)) == {"a": None, "b": 1.5, "c": [2, None]} == plain(value)


@pytest.mark.parametrize("change", [
    {"scenarios": ("nope",)}, {"runs": 0}, {"seed": -1}, {"policies": ("static", "bogus")},
    {"live_policies": ("oracle",)}, {"steps": 20}, {"lags": 500},
    {"runs": 1, "scenarios": ("throttle",)}, {"live_steps": 0},
])
def test_bad_config_is_refused_with_one_line(change):
    with pytest.raises(BubblecastError) as info:
        DemoConfig(**change)
    assert "\n" not in str(info.value)


def test_presets_are_valid_and_overridable():
    assert preset("default") == DemoConfig()
    quick = preset("quick", seed=5, live=False)
    assert (quick.seed, quick.live, quick.runs) == (5, False, 3)
    assert preset("tiny").to_json()["scenarios"] == ["throttle", "failslow", "periodic"]
    with pytest.raises(BubblecastError, match="unknown demo preset"):
        preset("huge")


def test_slowed_window_and_ideal_speedup_follow_the_injection():
    quick = preset("quick")  # rank 1 twice as slow from step 60 (30 + ramp 30) to 140
    assert slowed_steps(quick) == (60, 140)
    # 12 layers, static 6|6 paces at 2 x 6 = 12; the best split 8|4 at max(8, 2 x 4) = 8
    assert ideal_speedup(quick) == pytest.approx(1.5)
    assert slowed_steps(replace(quick, live_inject="rank=0,factor=1.5,start=5")) == (5, 150)


def test_an_output_folder_holding_something_else_is_refused(tmp_path):
    _prepare(tmp_path / "new")  # absent: created
    assert (tmp_path / "new").is_dir()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(BubblecastError, match="not empty"):
        _prepare(tmp_path / "mine")
    (tmp_path / "file").write_text("x")
    with pytest.raises(BubblecastError, match="not a folder"):
        _prepare(tmp_path / "file")
    (tmp_path / "old").mkdir()  # an earlier demo: its files go, the user's stay
    for name in ("report.md", "demo.json", "notes.txt"):
        (tmp_path / "old" / name).write_text("x")
    (tmp_path / "old" / "simulate").mkdir()
    _prepare(tmp_path / "old")
    assert [p.name for p in (tmp_path / "old").iterdir()] == ["notes.txt"]


def test_report_marks_skipped_stages_and_lists_figures():
    stages = {name: {"skipped": f"no {name}"} for name in (
        "simulate", "dataset", "train", "forecast_eval", "policy_eval", "megatron", "live")}
    stages["megatron"] = {"skipped": "no trace", "figures": {"megatron/inspect.png": "f()"}}
    doc = {"config": {"seed": 1}, "seconds": 2.0, "stage_seconds": dict.fromkeys(stages, 0.5),
           "stages": stages, "mlflow_ui": None, "serve": "bubblecast serve --model m"}
    text = render(doc, "bubblecast demo --quick")
    assert "## 6. Real Megatron-LM trace\n\nSkipped: no trace." in text
    assert "| `megatron/inspect.png` | `f()` |" in text
    assert "`bubblecast demo --quick` (seed 1)" in text and "MLflow UI" not in text
