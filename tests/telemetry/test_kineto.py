"""The ``kineto`` importer on real profiler traces of a 2-process gloo pipeline on CPU.

A worker script (``pp_profile_worker.py``) trains a 4-layer model with
torch.distributed.pipelining under torch.profiler for several schedules; the tests import the
traces and check them against what the pipeline must have done (op counts, dependencies).
Variants (no ``distributedInfo``, no ``ProfilerStep``, device annotations, extra replicas) are
derived from those real traces. ScheduleGPipe and Schedule1F1B emit no ``PP:`` labels in torch
2.13, so the runtime schedules are used (ScheduleLoopedBFS with one stage per rank is the
single-chunk case) and a GPipe trace checks the refusal.
"""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bubblecast.cli import main
from bubblecast.errors import BubblecastError
from bubblecast.telemetry import read_events, write_events
from bubblecast.telemetry.importers import detect_format, load_events
from bubblecast.telemetry.importers.kineto import parse_label, read_kineto

WORKER = Path(__file__).with_name("pp_profile_worker.py")
RANKS, MICROBATCHES, STEPS = 2, 4, [2, 3, 4]  # as set in the worker
TOLERANCE_S = 20e-6
#: schedule -> (chunks, has W, guessed schedule)
EXPECTED = {
    "interleaved": (2, False, "interleaved"),
    "zb-interleaved": (2, True, "zb-interleaved"),
    "zbv": (2, True, "zbv"),
    "looped-bfs-1": (1, False, "gpipe"),
}


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> Path:
    pytest.importorskip("torch.distributed.pipelining")
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    out = tmp_path_factory.mktemp("kineto")
    proc = subprocess.run(
        [sys.executable, str(WORKER), str(out), *EXPECTED, "gpipe"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _load(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        return json.load(fh)


def _derive(
    src: Path,
    dst: Path,
    edit: Callable[[dict[str, Any], Path], None],
    rename: Callable[[str], str] = lambda n: n,
) -> Path:
    """Copy every trace of ``src`` to ``dst`` (plain JSON) after ``edit(trace, file)``."""
    dst.mkdir(parents=True, exist_ok=True)
    for file in sorted(src.iterdir()):
        trace = _load(file)
        edit(trace, file)
        name = rename(file.name.removesuffix(".gz"))
        (dst / name).write_text(json.dumps(trace))
    return dst


def _global_stage(stage: np.ndarray, chunk: np.ndarray, layout: str) -> np.ndarray:
    if layout == "v-shape":
        return np.where(chunk == 0, stage, 2 * RANKS - 1 - stage)
    return chunk * RANKS + stage


@pytest.mark.dist
@pytest.mark.parametrize("schedule", list(EXPECTED))
def test_import_matches_the_pipeline_that_ran(traces, schedule):
    chunks, has_w, guess = EXPECTED[schedule]
    events = read_kineto(traces / schedule)
    meta = events.runs[schedule]
    frame = events.frame
    assert (meta.stages, meta.chunks, meta.replicas, meta.microbatches) == (
        RANKS,
        chunks,
        1,
        MICROBATCHES,
    )
    assert meta.source == "kineto" and meta.schedule == guess
    assert meta.extra["rank_from"] == "distributedInfo"
    assert meta.extra["steps_from"] == "ProfilerStep" and meta.extra["timing"] == "host"
    assert sorted(frame["rank"].unique()) == [0, 1]
    assert sorted(frame["step"].unique()) == STEPS
    assert (frame["stage"] == frame["rank"]).all()  # one pipeline: stage = pipeline rank

    comp = frame.loc[frame["op"].isin(["F", "B", "W"])]
    counts = comp.groupby(["step", "rank", "chunk", "microbatch", "op"], observed=True).size()
    ops = ["F", "B", "W"] if has_w else ["F", "B"]
    assert len(counts) == len(STEPS) * RANKS * chunks * MICROBATCHES * len(ops)
    assert (counts == 1).all()
    assert set(comp["op"].astype(str)) == set(ops)
    optimizer = frame.loc[frame["op"] == "OPTIMIZER"]
    assert len(optimizer) == len(STEPS) * RANKS and (optimizer["microbatch"] == -1).all()
    assert frame["op"].isin(["SEND_F", "RECV_F", "SEND_B", "RECV_B"]).any()

    # plausible timings: positive (but for the backward-input of the first stage, which has no
    # input gradient to compute), each step starts at 0, a step lasts well under 10 s
    g = _global_stage(
        comp["stage"].to_numpy(), comp["chunk"].to_numpy(), meta.extra["stage_layout"]
    )
    empty = (comp["duration_s"] == 0).to_numpy()
    expected_empty = (g == 0) & (comp["op"] == "B").to_numpy() & has_w
    assert np.array_equal(empty, expected_empty)
    assert (comp["duration_s"] < 1.0).all() and (frame["wait_s"] >= 0).all()
    assert (frame["start_s"] >= 0).all()
    assert np.allclose(frame.groupby("step")["start_s"].min(), 0.0)
    assert ((frame["start_s"] + frame["duration_s"]).groupby(frame["step"]).max() < 10).all()

    # causality across ranks (shared clock, right stage/chunk mapping, waits trimmed): F of a
    # microbatch on global stage g+1 starts after it ends on g; B runs the other way and after
    # its own F. The tolerance only absorbs clock jitter between processes.
    table = comp.assign(g=g, end=comp["start_s"] + comp["duration_s"] - TOLERANCE_S).set_index(
        ["step", "microbatch", "g", "op"]
    )
    f = table.xs("F", level="op")
    b = table.xs("B", level="op")
    for step in STEPS:
        for mb in range(MICROBATCHES):
            for gs in range(RANKS * chunks - 1):
                assert f.loc[(step, mb, gs + 1), "start_s"] >= f.loc[(step, mb, gs), "end"]
                assert b.loc[(step, mb, gs), "start_s"] >= b.loc[(step, mb, gs + 1), "end"]
            last = RANKS * chunks - 1
            assert b.loc[(step, mb, last), "start_s"] >= f.loc[(step, mb, last), "end"]


@pytest.mark.dist
def test_round_trip_through_parquet(traces, tmp_path):
    events = read_kineto(traces / "zbv")
    out = write_events(events, tmp_path / "zbv.parquet")
    back = read_events(out)
    assert back.runs["zbv"].schedule == "zbv" and back.runs["zbv"].source == "kineto"
    assert len(back) == len(events)
    assert np.array_equal(back.frame["start_s"], events.frame["start_s"])


@pytest.mark.dist
def test_cli_inspect_kineto_and_auto_detection(traces, capsys):
    directory = traces / "interleaved"
    assert detect_format(directory) == "kineto"
    assert main(["inspect", str(directory), "--format", "kineto", "--json"]) == 0
    explicit = json.loads(capsys.readouterr().out)
    assert main(["inspect", str(directory), "--format", "auto", "--json"]) == 0
    auto = json.loads(capsys.readouterr().out)
    assert explicit == auto
    assert (explicit["stages"], explicit["replicas"], explicit["steps"]) == (RANKS, 1, len(STEPS))
    assert all(s["busy_s"] > 0 for s in explicit["per_stage"])


def _one_error_line(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith("bubblecast: error:") and "Traceback" not in captured.err
    return captured.err


def test_directory_of_non_trace_files_exits_2(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("not a trace\n")
    err = _one_error_line(capsys, ["inspect", str(tmp_path), "--json"])
    assert "kineto" in err
    (tmp_path / "config.json").write_text('{"lr": 0.1}')
    err = _one_error_line(capsys, ["inspect", str(tmp_path), "--format", "auto", "--json"])
    assert "config.json" in err and "traceEvents" in err
    (tmp_path / "config.json").write_text("{broken")
    err = _one_error_line(capsys, ["inspect", str(tmp_path), "--format", "kineto"])
    assert "config.json" in err


@pytest.mark.dist
def test_trace_without_pp_labels_is_refused_naming_the_file(traces, tmp_path, capsys):
    def strip(trace: dict[str, Any], file: Path) -> None:
        if file.name.startswith("rank1"):
            trace["traceEvents"] = [
                e for e in trace["traceEvents"] if not str(e.get("name", "")).startswith("PP:")
            ]

    directory = _derive(traces / "interleaved", tmp_path / "nopp", strip)
    err = _one_error_line(capsys, ["inspect", str(directory), "--format", "kineto"])
    assert "rank1.json" in err and "PP:" in err


@pytest.mark.dist
def test_gpipe_trace_is_refused_for_lack_of_pp_labels(traces, capsys):
    # torch 2.13's ScheduleGPipe labels "Forward i"/"Backward i" only, without a stage index
    err = _one_error_line(capsys, ["inspect", str(traces / "gpipe"), "--format", "kineto"])
    assert "rank0.json" in err and "ScheduleGPipe" in err


@pytest.mark.dist
def test_rank_from_file_name_when_distributed_info_is_missing(traces, tmp_path):
    def drop_info(trace: dict[str, Any], file: Path) -> None:
        trace.pop("distributedInfo")

    directory = _derive(traces / "zb-interleaved", tmp_path / "zb-interleaved", drop_info)
    events = read_kineto(directory)
    reference = read_kineto(traces / "zb-interleaved")
    meta = events.runs["zb-interleaved"]
    assert meta.extra["rank_from"] == "file name"
    assert sorted(meta.extra["rank_from_file_name"]) == ["rank0.json", "rank1.json"]
    cols = ["step", "rank", "stage", "chunk", "microbatch", "op", "start_s", "duration_s"]
    assert events.frame[cols].equals(reference.frame[cols])


@pytest.mark.dist
def test_steps_from_action_rounds_without_profiler_steps(traces, tmp_path):
    def drop_steps(trace: dict[str, Any], file: Path) -> None:
        trace["traceEvents"] = [
            e
            for e in trace["traceEvents"]
            if not str(e.get("name", "")).startswith("ProfilerStep#")
        ]

    directory = _derive(traces / "interleaved", tmp_path / "interleaved", drop_steps)
    events = read_kineto(directory)
    reference = read_kineto(traces / "interleaved")
    assert events.runs["interleaved"].extra["steps_from"] == "action occurrence"
    assert sorted(events.frame["step"].unique()) == [s - STEPS[0] for s in STEPS]
    cols = ["rank", "chunk", "microbatch", "op", "start_s", "duration_s"]
    shifted = reference.frame.assign(step=reference.frame["step"] - STEPS[0])
    assert events.frame[["step", *cols]].equals(shifted[["step", *cols]])


@pytest.mark.dist
def test_device_annotations_replace_host_times_of_compute_ops(traces, tmp_path):
    def add_gpu(trace: dict[str, Any], file: Path) -> None:
        extra = []
        for ev in trace["traceEvents"]:
            kinds = parse_label(str(ev.get("name", "")))
            if ev.get("cat") == "user_annotation" and kinds and kinds[0][1] in "FIBW":
                extra.append(
                    dict(ev, cat="gpu_user_annotation", ts=ev["ts"] + 5.0, dur=ev["dur"] * 2)
                )
        trace["traceEvents"] += extra

    directory = _derive(traces / "zbv", tmp_path / "zbv", add_gpu)
    events = read_kineto(directory)
    host = read_kineto(traces / "zbv")
    assert events.runs["zbv"].extra["timing"] == "device"
    key = ["step", "rank", "chunk", "microbatch", "op"]
    comp = events.compute().set_index(key).sort_index()
    host_comp = host.compute().set_index(key).sort_index()
    raw = host_comp["duration_s"] + host_comp["wait_s"]  # the whole host range
    assert np.allclose(comp["duration_s"], 2 * raw) and (comp["wait_s"] == 0).all()
    other = events.frame.loc[events.frame["op"] == "SEND_F", "duration_s"].to_numpy()
    assert np.allclose(other, host.frame.loc[host.frame["op"] == "SEND_F", "duration_s"])


@pytest.mark.dist
def test_second_pipeline_copy_becomes_replica_1(traces, tmp_path):
    src = traces / "zb-interleaved"
    _derive(src, tmp_path / "dp", lambda t, f: None)

    def shift(trace: dict[str, Any], file: Path) -> None:
        trace["distributedInfo"]["rank"] += RANKS

    _derive(src, tmp_path / "dp", shift, rename=lambda n: n.replace("rank", "copy-rank"))
    events = read_kineto(tmp_path / "dp")
    meta = events.runs["dp"]
    assert (meta.stages, meta.replicas, meta.chunks) == (RANKS, 2, 2)
    placement = events.frame.groupby("rank")[["stage", "replica"]].first()
    assert placement.to_dict("index") == {
        0: {"stage": 0, "replica": 0},
        1: {"stage": 1, "replica": 0},
        2: {"stage": 0, "replica": 1},
        3: {"stage": 1, "replica": 1},
    }
    names = events.frame["name"].astype(str)
    assert set(events.frame.loc[names.str.endswith("REDUCE_GRAD"), "op"]) == {"ALLREDUCE"}


@pytest.mark.dist
def test_inconsistent_or_duplicated_ranks_are_refused(traces, tmp_path):
    lone = tmp_path / "lone"
    lone.mkdir()
    shutil.copy(traces / "interleaved" / "rank0.json", lone / "rank0.json")
    with pytest.raises(BubblecastError, match="inconsistent pipeline stage indices"):
        read_kineto(lone)
    twice = tmp_path / "twice"
    shutil.copytree(traces / "interleaved", twice)
    shutil.copy(twice / "rank0.json", twice / "rank0-again.json")
    with pytest.raises(BubblecastError, match="rank 0 appears in overlapping traces"):
        load_events(twice, "kineto")


def test_parse_label_covers_torch_action_strings():
    assert parse_label("PP:2F0") == ((2, "F", 0),)
    assert parse_label("PP:13SEND_B7") == ((13, "SEND_B", 7),)
    assert parse_label("PP:1I3") == ((1, "I", 3),)
    assert parse_label("PP:0REDUCE_GRAD") == ((0, "REDUCE_GRAD", -1),)
    assert parse_label("PP:(0F1;3I0)OVERLAP_F_B") == ((0, "F", 1), (3, "I", 0))
    assert parse_label("PP:") == () and parse_label("Forward 0") == ()
