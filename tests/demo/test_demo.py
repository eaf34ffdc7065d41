"""``bubblecast demo`` end to end on the tiny preset: report, reproducibility, interruption.

The tiny preset keeps every stage but the live loop and MLflow (covered by the slow tests in
``test_demo_slow.py``) and runs in seconds.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest

from bubblecast.cli import main
from bubblecast.demo import STAGES, figures, preset, run_demo
from bubblecast.demo.stages import STAGE_FILE
from tests.helpers import all_finite

NAMES = [name for name, _, _ in STAGES]


@pytest.fixture(scope="module")
def first(tmp_path_factory) -> tuple[Path, dict]:
    """One tiny demo through the command line; its output folder and ``--json`` object."""
    out = tmp_path_factory.mktemp("demo") / "a"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(["demo", "--out", str(out), "--preset", "tiny", "--seed", "3", "--json"])
    assert code == 0
    return out, json.loads(stdout.getvalue())




def test_report_shows_every_stage_with_figures_from_the_run(first):
    out, doc = first
    report = (out / "report.md").read_text()
    for k, title in enumerate(["Simulated scenario suite", "Dataset", "Forecasters: training",
                               "Forecasters: held-out suite", "Policies", "Real Megatron-LM",
                               "Live closed loop"], start=1):
        assert f"## {k}. {title}" in report
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report)
    assert len(images) >= 5
    for rel in images:  # every figure exists, was written by this run, and is a PNG
        png = out / rel
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert png.stat().st_mtime >= (out / "simulate" / STAGE_FILE).stat().st_mtime - 1
    assert doc["report"] == str(out / "report.md")
    assert json.loads((out / "demo.json").read_text())["stages"].keys() >= set(NAMES)
    for name in NAMES:
        assert (out / name / STAGE_FILE).is_file()
    assert not [p for p in out.iterdir() if p.name.startswith(".")]
    stages = doc["stages"]
    assert stages["live"]["skipped"]
    table = stages["forecast_eval"]["table"]
    assert {r["model"] for r in table} == {"lgbm", "seq"}
    assert {r["horizon"] for r in table} == set(preset("tiny").horizons)
    assert all(0.0 <= r["coverage_80"] <= 1.0 and r["n"] > 0 for r in table)
    pol = stages["policy_eval"]["policies"]
    assert list(pol) == list(preset("tiny").policies)
    assert pol["static"]["speedup_vs_static"] == 1.0
    assert pol["oracle"]["step_s"] <= pol["static"]["step_s"]
    assert all_finite(figures(stages)["forecast_eval"]["table"])
    if stages["megatron"].get("skipped") is None:
        assert stages["megatron"]["inspect"]["bottleneck_stage"] == 3
        assert "## 6. Real Megatron-LM trace" in report and "Skipped" not in report.split(
            "## 6.")[1].split("## 7.")[0]


def test_interrupted_run_leaves_nothing_half_written_and_resumes_to_the_same_figures(
        first, tmp_path, monkeypatch):
    out = tmp_path / "b"
    config = preset("tiny", seed=3)
    import bubblecast.demo.run as run_module

    def broken(config, ws, ctx, progress):  # writes part of its output, then is killed
        (ctx.dir / "policy_eval.json").write_text('{"partial": ')
        raise KeyboardInterrupt

    patched = tuple((n, t, broken if n == "policy_eval" else f) for n, t, f in STAGES)
    monkeypatch.setattr(run_module, "STAGES", patched)
    with pytest.raises(KeyboardInterrupt):
        run_demo(config, out)
    left = sorted(p.name for p in out.iterdir())
    assert left == ["dataset", "forecast_eval", "simulate", "train"]  # no temp, no report
    monkeypatch.setattr(run_module, "STAGES", STAGES)

    resumed = run_demo(config, out, resume=True)
    assert resumed.reused == ["simulate", "dataset", "train", "forecast_eval"]
    again = run_demo(config, out, resume=True)
    assert again.reused == NAMES
    # same seed, computed independently in another folder: the same figures, exactly
    reference = figures(first[1]["stages"])
    assert figures(resumed.to_json()["stages"]) == reference
    assert figures(json.loads((out / "demo.json").read_text())["stages"]) == reference


@pytest.mark.slow
def test_another_seed_gives_other_figures(first, tmp_path):
    stages = run_demo(preset("tiny", seed=4, megatron=None), tmp_path / "c").to_json()["stages"]
    assert figures(stages)["forecast_eval"] != figures(first[1]["stages"])["forecast_eval"]
    assert stages["megatron"]["skipped"]


def test_bad_demo_options_exit_2(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path / "x"), "--seed", "-1"]) == 2
    assert main(["demo", "--out", str(tmp_path / "x"), "--preset", "huge"]) == 2
    err = capsys.readouterr().err
    assert err.count("bubblecast: error:") == 2
    assert not (tmp_path / "x").exists()
