"""``bubblecast demo`` end to end on the tiny preset: report, JSON, reproducibility, interruption.

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

import bubblecast.app.demo as demo_module
from bubblecast.app.demo import STAGES, preset, run_demo
from bubblecast.app.demo_report import figures
from bubblecast.cli import main
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
    listed = report.split("## Figures")[1]
    for rel in images:  # every figure exists, was written by this run, is a PNG, is listed
        png = out / rel
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert png.stat().st_mtime >= (out / "simulate" / "train.parquet").stat().st_mtime - 1
        assert re.search(rf"\| `{re.escape(rel)}` \| \S", listed)
    assert doc["report"] == str(out / "report.md")
    assert json.loads((out / "demo.json").read_text())["stages"].keys() == set(NAMES)
    assert not [p for p in out.rglob("*") if p.name.startswith(".")]
    stages = doc["stages"]
    assert stages["live"]["skipped"] and stages["balanced"]["skipped"]
    assert {s: v["runs"] for s, v in stages["simulate"]["scenarios"].items()} == {
        s: 3 for s in preset("tiny").scenarios}  # 2 training runs + 1 held-out run each
    table = stages["forecast_eval"]["table"]
    assert {r["model"] for r in table} == {"lgbm", "seq"}
    assert {r["horizon"] for r in table} == set(preset("tiny").horizons)
    assert all(0.0 <= r["coverage_80"] <= 1.0 and r["n"] > 0 for r in table)
    pol = stages["policy_eval"]["policies"]
    assert list(pol) == list(preset("tiny").policies)
    assert pol["static"]["speedup_vs_static"] == 1.0
    assert pol["oracle"]["step_s"] <= pol["static"]["step_s"]
    assert all_finite(figures(stages)["forecast_eval"]["table"])
    # the real trace ships in data/: the Megatron stage always runs
    assert stages["megatron"].get("skipped") is None, stages["megatron"]
    assert stages["megatron"]["inspect"]["bottleneck_stage"] == 3
    section = report.split("## 6.")[1].split("## 7.")[0]
    assert "Real Megatron-LM trace" in section and "Skipped" not in section
    assert (out / "megatron" / "whatif.json").is_file()


def test_interrupted_run_leaves_no_report_and_a_rerun_repeats_the_figures(
        first, tmp_path, monkeypatch):
    out = tmp_path / "b"
    config = preset("tiny", seed=3, megatron=None)

    def broken(demo):  # writes part of its output, then is killed
        (demo.out / "policy_eval").mkdir()
        (demo.out / "policy_eval" / "policy_eval.json").write_text('{"partial": ')
        raise KeyboardInterrupt

    patched = tuple((n, t, broken if n == "policy_eval" else f) for n, t, f in STAGES)
    monkeypatch.setattr(demo_module, "STAGES", patched)
    with pytest.raises(KeyboardInterrupt):
        run_demo(config, out)
    assert not (out / "report.md").exists() and not (out / "demo.json").exists()
    monkeypatch.setattr(demo_module, "STAGES", STAGES)
    lines: list[str] = []
    doc = run_demo(config, out, say=lines.append)  # the folder of the interrupted run: reused
    n = len(STAGES)
    assert [line.split("]")[0] for line in lines] == [f"[{k}/{n}" for k in range(1, n + 1)]
    assert json.loads((out / "policy_eval" / "policy_eval.json").read_text())["policies"]
    # same seed, computed independently in another folder: the same figures, exactly
    assert figures(doc["stages"]) == figures(first[1]["stages"])
    assert figures(json.loads((out / "demo.json").read_text())["stages"]) == figures(
        first[1]["stages"])


@pytest.mark.slow
def test_another_seed_gives_other_figures(first, tmp_path):
    stages = run_demo(preset("tiny", seed=4, megatron=None), tmp_path / "c")["stages"]
    assert figures(stages)["forecast_eval"] != figures(first[1]["stages"])["forecast_eval"]
    assert stages["megatron"]["skipped"]


def test_bad_demo_options_exit_2(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path / "x"), "--seed", "-1"]) == 2
    assert main(["demo", "--out", str(tmp_path / "x"), "--preset", "huge"]) == 2
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    assert main(["demo", "--out", str(tmp_path / "mine"), "--preset", "tiny"]) == 2
    err = capsys.readouterr().err
    assert err.count("bubblecast: error:") == 3 and "not empty" in err
    assert not (tmp_path / "x").exists()
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]
