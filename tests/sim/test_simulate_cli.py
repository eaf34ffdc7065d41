"""``bubblecast simulate``: SPEC §3 options, the events it writes, errors and determinism."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bubblecast.cli import main
from bubblecast.telemetry import read_events

PAPER = ["--f", "18.522", "--b", "18.086", "--w", "9.337", "--comm", "0.601"]
GNMT = Path(__file__).resolve().parents[2] / "data" / "pipedream-profiles" / "gnmt.graph.txt"


def run(tmp_path, *args, name="out.parquet"):
    out = tmp_path / name
    code = main(["simulate", *args, "--out", str(out)])
    return code, out


def bubble_fraction(frame) -> float:
    """SPEC §2 over a run: total idle / total (ranks x window), per (step, replica)."""
    comp = frame[frame["op"].isin(["F", "B", "W"])].copy()
    comp["end"] = comp["start_s"] + comp["duration_s"]
    g = comp.groupby(["step", "replica"])
    window = g["end"].max() - g["start_s"].min()
    ranks = g["rank"].nunique()
    busy = g["duration_s"].sum()
    return float(((window * ranks) - busy).sum() / (window * ranks).sum())


@pytest.mark.parametrize(("schedule", "extra", "want"), [
    ("1f1b", [], 0.2431), ("zb-h1", [], 0.1585),
])
def test_paper_settings_end_to_end(tmp_path, schedule, extra, want):
    code, out = run(tmp_path, "--schedule", schedule, "--stages", "8", "--microbatches", "24",
                    *PAPER, *extra, "--steps", "1")
    assert code == 0
    assert bubble_fraction(read_events(out).frame) == pytest.approx(want, abs=0.002)


def test_events_follow_the_spec(tmp_path, capsys):
    code, out = run(tmp_path, "--schedule", "interleaved", "--chunks", "2", "--stages", "4",
                    "--microbatches", "8", "--steps", "3", "--replicas", "2", "--json")
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    ev = read_events(out)
    assert summary == {"out": str(out), "runs": 1, "run_ids": ["sim-0"], "events": len(ev)}
    fr = ev.frame
    assert len(fr) == 3 * 2 * 4 * (2 * 8 * 2)
    assert set(fr["op"].astype(str)) == {"F", "B"}
    assert (fr["rank"] == fr["replica"] * 4 + fr["stage"]).all()
    assert fr.groupby("step")["start_s"].min().eq(0).all()  # per-step origin
    meta = ev.runs["sim-0"]
    assert (meta.schedule, meta.stages, meta.microbatches, meta.chunks, meta.replicas) == \
        ("interleaved", 4, 8, 2, 2)
    # comm 0, equal stages: exactly the interleaved closed form
    assert bubble_fraction(fr) == pytest.approx(3 / (2 * 8 + 3), rel=1e-9)
    assert (fr["layers"] == 2).all() and (fr["speed"] == 1.0).all()


def test_gpipe_comm0_closed_form_from_the_file(tmp_path):
    code, out = run(tmp_path, "--schedule", "gpipe", "--stages", "6", "--microbatches", "10",
                    "--f", "1.5", "--b", "2", "--w", "0.5")
    assert code == 0
    assert bubble_fraction(read_events(out).frame) == pytest.approx(5 / 15, rel=1e-12)


def test_same_command_twice_gives_identical_files(tmp_path):
    args = ["--schedule", "zb-h2", "--stages", "4", "--microbatches", "8", "--steps", "20",
            "--scenario", "mixed", "--seed", "3", "--runs", "2", "--model", "uniform:12"]
    assert run(tmp_path, *args, name="a.parquet")[0] == 0
    assert run(tmp_path, *args, name="b.parquet")[0] == 0
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
    code, _ = run(tmp_path, *args[:-6], "--seed", "4", "--runs", "2", "--model", "uniform:12",
                  "--scenario", "mixed", name="c.parquet")
    assert code == 0
    assert (tmp_path / "a.parquet").read_bytes() != (tmp_path / "c.parquet").read_bytes()


def test_runs_are_distinct_and_carry_ground_truth(tmp_path):
    code, out = run(tmp_path, "--schedule", "1f1b", "--stages", "4", "--microbatches", "4",
                    "--steps", "300", "--scenario", "failslow", "--runs", "3", "--seed", "9")
    assert code == 0
    ev = read_events(out)
    assert list(ev.runs) == ["sim-0", "sim-1", "sim-2"]
    onsets = {ev.runs[r].extra["scenario"]["realised"]["onset"] for r in ev.runs}
    assert len(onsets) == 3
    for run_id in ev.runs:
        fr = ev.run(run_id).frame
        slow = fr.loc[fr["speed"] > 1, "rank"].unique()
        assert list(slow) == [ev.runs[run_id].extra["scenario"]["realised"]["rank"]]


def test_model_and_partition(tmp_path):
    code, out = run(tmp_path, "--schedule", "zb-h1", "--stages", "4", "--microbatches", "8",
                    "--model", str(GNMT), "--partition", "10,12,12,14", "--scenario", "seqlen")
    assert code == 0
    ev = read_events(out)
    meta = ev.runs["sim-0"]
    assert meta.partition == [10, 12, 12, 14]
    assert len(meta.extra["workload"]["layers"]) == 48
    fr = ev.frame
    assert fr.groupby("stage")["layers"].first().tolist() == [10, 12, 12, 14]
    assert fr["tokens"].min() > 0 and set(fr["op"].astype(str)) == {"F", "B", "W"}


@pytest.mark.parametrize(("args", "match"), [
    (["--schedule", "pipedream"], "unknown schedule"),
    (["--schedule", "1f1b", "--chunks", "2"], "--chunks"),
    (["--schedule", "interleaved", "--chunks", "2", "--microbatches", "9"], "multiple"),
    (["--schedule", "torch:ScheduleNope"], "multi-stage schedule classes"),
    (["--schedule", "csv:no/such.csv"], "cannot read"),
    (["--schedule", "1f1b", "--model", "uniform:8", "--partition", "3,4,1,1"], "sums to 9"),
    (["--schedule", "1f1b", "--model", "uniform:8", "--partition", "3,x"], "integers"),
    (["--schedule", "1f1b", "--partition", "2,2,2,2"], "needs --model"),
    (["--schedule", "1f1b", "--scenario", "meteor"], "unknown scenario"),
    (["--schedule", "1f1b", "--steps", "0"], "--steps"),
    (["--schedule", "1f1b", "--f", "-1"], "--f"),
    (["--schedule", "1f1b", "--model", "no/such/file.json"], "no such file"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, args, match):
    base = {"--stages": "4", "--microbatches": "8"}
    for key, value in base.items():
        if key not in args:
            args = [*args, key, value]
    code, out = run(tmp_path, *args)
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("bubblecast: error:") and "\n" not in err and match in err
    assert not out.exists()


def test_partition_changes_between_steps_in_library(tmp_path):
    from bubblecast.sim.simulator import SimConfig, simulate_events

    cfg = SimConfig(schedule="1f1b", stages=2, microbatches=2, steps=4, model="uniform:6",
                    partition=lambda s: [3, 3] if s < 2 else [2, 4])
    ev = simulate_events(cfg)
    assert ev.runs["sim-0"].extra["partition_steps"] == [[0, [3, 3]], [2, [2, 4]]]
    layers = ev.frame.groupby(["step", "stage"])["layers"].first().unstack().to_numpy()
    np.testing.assert_array_equal(layers, [[3, 3], [3, 3], [2, 4], [2, 4]])


def test_schedule_help_lists_every_simulable_schedule_and_source(capsys):
    """``simulate --help`` names every schedule of the table (one source) and the sources."""
    from bubblecast.cli import main
    from bubblecast.sim.schedule_table import SCHEDULES

    assert main(["simulate", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    for name, spec in SCHEDULES.items():
        if spec.simulable:
            assert name in out, name
    for word in ("zb-v", "dualpipev", "zb-interleaved", "looped-bfs", "torch:<ClassName>",
                 "csv:FILE", "ScheduleDualPipeV", "ScheduleLoopedBFS"):
        assert word in out, word
