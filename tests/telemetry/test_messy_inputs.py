"""Messy real inputs: clock jitter in external traces, ALCF-style logs, text logs that open
with a bracket (issue 21 item 3).

Every file here is written by the test: a PyTorch-profiler (Kineto) Chrome trace, a Megatron
timeline, a megatron-ops Parquet and Megatron logs, each with one op of -2.7e-5 s (clock
jitter: clamped to 0, counted in ``inspect --json``'s ``input_fixes`` and said in one stderr
line) or of -0.5 s (refused: exit 2, one line naming the file and the place, nothing out).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bubblecast import BubbleAnalysis
from bubblecast.cli import main
from bubblecast.errors import BubblecastError
from bubblecast.telemetry import read_events, write_events
from bubblecast.telemetry.importers import detect_format, load_events, looks_like_json
from bubblecast.telemetry.importers.fixes import JITTER_S, InputFixes

JITTER, BROKEN = -2.7e-5, -0.5  # seconds
FIX = "negative_durations_clamped"
#: A 2-stage pipeline, 2 microbatches, one step: (stage, kind, microbatch, start us, dur us)
SCHEDULE = [(0, "F", 0, 0, 100), (0, "F", 1, 100, 100), (1, "F", 0, 110, 100),
            (1, "B", 0, 210, 200), (1, "F", 1, 410, 100), (0, "B", 0, 420, 200),
            (1, "B", 1, 510, 200), (0, "B", 1, 720, 200)]


def _with_bad(bad_s: float | None, at: int) -> Callable[[int, float], float]:
    """Duration (us) of op ``i``: its own ``d``, or ``bad_s`` for op ``at`` when given."""
    return lambda i, d: bad_s * 1e6 if bad_s is not None and i == at else d


def write_kineto(out: Path, bad_s: float | None = None, at: int = 3) -> Path:
    """One Chrome trace per rank (``PP:`` labels inside a ``ProfilerStep#1``); op ``at`` of
    :data:`SCHEDULE` gets duration ``bad_s`` when given."""
    out.mkdir()
    dur = _with_bad(bad_s, at)
    for rank in (0, 1):
        events: list[dict[str, Any]] = [
            {"ph": "X", "name": "ProfilerStep#1", "cat": "user_annotation", "pid": 1, "tid": 1,
             "ts": 1000.0, "dur": 2000.0}]
        for i, (stage, kind, mb, ts, d) in enumerate(SCHEDULE):
            if stage == rank:
                events.append({"ph": "X", "name": f"PP:{stage}{kind}{mb}",
                               "cat": "user_annotation", "pid": 1, "tid": 1,
                               "ts": 1000.0 + ts, "dur": dur(i, float(d))})
        trace = {"schemaVersion": 1, "distributedInfo": {"rank": rank, "world_size": 2},
                 "traceEvents": events}
        (out / f"rank{rank}.json").write_text(json.dumps(trace))
    return out


def write_timeline(path: Path, bad_s: float | None = None, at: int = 3) -> Path:
    """A Megatron timeline (StragglerAnalysis layout): one ``X`` event per compute op."""
    names = {"F": "forward-compute", "B": "backward-compute"}
    dur = _with_bad(bad_s, at)
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "thread_name", "pid": 0, "tid": stage,
         "args": {"name": f"PP rank {stage}, TP rank 0, compute"}} for stage in (0, 1)]
    for i, (stage, kind, mb, ts, d) in enumerate(SCHEDULE):
        events.append({"ph": "X", "name": names[kind], "pid": 0, "tid": stage,
                       "ts": 5e6 + ts + 0.123, "dur": dur(i, float(d)),
                       "args": {"step": 1, "model_chunk": 0, "mb_id": mb, "seq_id": mb}})
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def write_megatron_ops(path: Path, bad_s: float | None = None, at: int = 3) -> Path:
    """The megatron-ops Parquet of the same schedule (seconds)."""
    rows = [{"dp_rank": 0, "stage": stage, "rank": stage, "step": 1,
             "optype": "forward-compute" if kind == "F" else "backward-compute",
             "start_ts": ts / 1e6, "duration": bad_s if bad_s is not None and i == at else d / 1e6,
             "seq_id": mb, "mc": 0, "gmc": 0, "mb_id": mb}
            for i, (stage, kind, mb, ts, d) in enumerate(SCHEDULE)]
    pd.DataFrame(rows).to_parquet(path)
    return path


WRITERS = {"kineto": (write_kineto, "rank1.json: traceEvents[2] ('PP:1B0'), field 'dur'"),
           "megatron-timeline": (write_timeline, "traceEvents[5] ('backward-compute'), "
                                                 "field 'dur'"),
           "megatron-ops": (write_megatron_ops, "column 'duration', row 3")}
NAMES = {"kineto": "traces", "megatron-timeline": "timeline-x.json",
         "megatron-ops": "trace-x.parquet"}


def _inspect(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["inspect", str(path), "--json"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_jitter_is_clamped_counted_and_said_once(fmt, tmp_path, capsys):
    write, _ = WRITERS[fmt]
    path = write(tmp_path / NAMES[fmt], JITTER)
    assert detect_format(path) == fmt
    events = load_events(path)
    assert (events.frame["duration_s"] >= 0).all()
    assert int((events.frame["duration_s"] == 0).sum()) == 1
    capsys.readouterr()
    code, out, err = _inspect(path, capsys)
    assert code == 0
    assert json.loads(out)["input_fixes"] == {FIX: 1}
    lines = err.splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and "1 negative duration" in lines[0]
    assert "-2.7e-05 s" in lines[0] and "clamped to 0" in lines[0]


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_clean_external_input_reports_zero_fixes_silently(fmt, tmp_path, capsys):
    path = WRITERS[fmt][0](tmp_path / NAMES[fmt])
    code, out, err = _inspect(path, capsys)
    assert code == 0 and json.loads(out)["input_fixes"] == {FIX: 0}
    assert "negative" not in err


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_a_larger_negative_duration_is_refused_in_one_line(fmt, tmp_path, capsys):
    write, place = WRITERS[fmt]
    path = write(tmp_path / NAMES[fmt], BROKEN)
    with pytest.raises(BubblecastError, match="negative duration -0.5 s"):
        load_events(path)
    plot = tmp_path / "out.png"
    assert main(["inspect", str(path), "--json", "--plot", str(plot)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert f"{path}: {place}: negative duration -0.5 s" in captured.err
    assert not plot.exists()


def test_the_limit_is_one_millisecond_either_side(tmp_path):
    fixes = InputFixes("f")
    values = fixes.clamp(np.array([1.0, -JITTER_S, 0.0, -1e-9, np.nan]))
    assert values[:4].tolist() == [1.0, 0.0, 0.0, 0.0] and np.isnan(values[4])
    assert (fixes.clamped, fixes.worst_s) == (2, -JITTER_S)
    assert fixes.clamp(np.array([-1000.0]), unit_s=1e-6).tolist() == [0.0]  # -1000 us
    with pytest.raises(BubblecastError, match=r"^f: column 'duration_s', row 1: negative "
                                              r"duration -0.0011 s"):
        fixes.clamp(np.array([0.0, -1.1e-3]))


def test_bubblecast_events_stay_strict(tmp_path, capsys):
    """The import's fix travels in the run metadata; a bubblecast file with the same jitter
    is refused (the events format is never fixed)."""
    events = load_events(write_megatron_ops(tmp_path / "trace-x.parquet", JITTER))
    assert events.runs["trace-x"].extra["input_fixes"] == {FIX: 1}
    good, bad = tmp_path / "events.parquet", tmp_path / "bad.parquet"
    write_events(events, good)
    assert read_events(good).runs["trace-x"].extra["input_fixes"] == {FIX: 1}
    table = pq.read_table(good)
    durations = table.column("duration_s").to_numpy().copy()
    durations[3] = JITTER
    pq.write_table(table.set_column(table.schema.get_field_index("duration_s"), "duration_s",
                                    pa.array(durations)), bad)
    capsys.readouterr()
    with pytest.raises(BubblecastError, match="column 'duration_s', row 3: negative duration"):
        read_events(bad)
    code, out, err = _inspect(bad, capsys)
    assert code == 2 and out == "" and err.count("\n") == 1


# --- logs ---------------------------------------------------------------------------------

ALCF_ITERATION = (
    "[2024-05-01 10:{m:02d}:00,123][INFO][training:1609] - iteration=        {it}/  317892 | "
    "consumed_samples=          {samples} | elapsed_time_per_iteration_ms={ms} | "
    "learning_rate=0.0003 | global_batch_size=  768 | lm_loss=11.17 | loss_scale=1.0 | "
    "grad_norm=12.3 | actual_seqlen= 4096 | number_of_skipped_iterations=  0 | "
    "number_of_nan_iterations=  0 | samples_per_second=7.053 | tokens_per_gpu_per_second_tgs="
    "1204.1 | [LM]TFLOPs=55.6 | [DS]TFLOPs=52.3 |")
#: (iteration, step ms, {timer: (min ms, max ms)})
ALCF_STEPS = [
    (1, 108893.2, {"forward-backward": (108745.29, 108746.08),
                   "forward-compute": (30112.5, 31200.75), "backward-compute": (70140.0, 72011.5),
                   "optimizer": (140.12, 142.5)}),
    (2, 107120.9, {"forward-backward": (106990.1, 106995.6),
                   "forward-compute": (30010.0, 31150.25), "backward-compute": (70001.5, 71890.0),
                   "optimizer": (139.9, 141.75)}),
    (3, 109004.4, {"forward-backward": (108870.0, 108877.5),
                   "forward-compute": (30200.5, 31300.0), "backward-compute": (70300.25, 72100.0),
                   "optimizer": (141.0, 143.25)}),
]


def write_alcf_log(path: Path, low_ms: float | None = None) -> Path:
    """An ALCF Megatron-DeepSpeed log: logging-record iteration lines, then ``(min, max)``
    blocks: the first bare, the second's header inside a logging record (a multi-line record),
    the third with a record header on every line (one record a line); ``low_ms`` replaces the
    second step's optimizer min (line 14)."""
    lines = ["[2024-05-01 09:59:00,001][INFO][utils:200] - Using Megatron-DeepSpeed",
             "[2024-05-01 09:59:00,002][INFO][training:100] - > building train dataset ..."]
    for n, (it, ms, timers) in enumerate(ALCF_STEPS):
        lines.append(ALCF_ITERATION.format(m=n, it=it, samples=768 * it, ms=ms))
        header = "(min, max) time across ranks (ms):"
        lines.append(header if n == 0 else f"[2024-05-01 10:0{n}:00,124][INFO][timers:90] - "
                                           f"{header}")
        for j, (timer, (low, high)) in enumerate(timers.items()):
            if n == 1 and timer == "optimizer" and low_ms is not None:
                low = low_ms
            record = f"[2024-05-01 10:0{n}:00,{200 + j}][INFO][timers:91] - " if n == 2 else ""
            lines.append(f"{record}    {timer} {'.' * (48 - len(timer))}: ({low}, {high})")
    lines.append("[2024-05-01 10:05:00,000][INFO][training:1700] - after training is done")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_an_alcf_log_is_detected_and_read_as_megatron_log(tmp_path, capsys):
    path = write_alcf_log(tmp_path / "train.log")
    assert path.read_bytes()[:1] == b"["  # opens with a bracket, yet it is no JSON
    assert detect_format(path) == "megatron-log"
    events = load_events(path)
    meta = events.runs["train"]
    assert meta.source == "megatron-log" and meta.extra["granularity"] == "step"
    assert meta.extra["steps_from"] == "iteration lines"
    assert meta.extra["step_time_s"] == {str(it): pytest.approx(ms / 1e3)
                                         for it, ms, _ in ALCF_STEPS}
    frame = events.frame.set_index(["step", "name"])
    for it, _, timers in ALCF_STEPS:
        for timer, (low, high) in timers.items():
            assert frame.loc[(it, timer), "duration_s"] == pytest.approx(high / 1e3)
            assert frame.loc[(it, timer), "min_s"] == pytest.approx(low / 1e3)
    assert len(frame) == sum(len(t) for _, _, t in ALCF_STEPS)
    assert dict(zip(events.frame["name"], events.frame["op"].astype(str), strict=True)) == {
        "forward-backward": "OTHER", "forward-compute": "F", "backward-compute": "B",
        "optimizer": "OPTIMIZER"}
    code, out, err = _inspect(path, capsys)
    assert code == 0 and err == ""
    summary = json.loads(out)
    assert summary["granularity"] == "step" and summary["steps"] == 3
    assert summary["step_time_s"]["median"] == pytest.approx(108.8932)
    assert summary["input_fixes"] == {FIX: 0}
    assert BubbleAnalysis(path).summary() == summary  # the API's summary is the JSON


def test_an_alcf_log_with_jitter_and_with_a_broken_timer(tmp_path, capsys):
    path = write_alcf_log(tmp_path / "jitter.log", low_ms=-0.027)
    code, out, err = _inspect(path, capsys)
    assert code == 0 and json.loads(out)["input_fixes"] == {FIX: 1}
    assert err.count("\n") == 1 and "1 negative duration" in err
    assert load_events(path).frame.set_index(["step", "name"]).loc[(2, "optimizer"),
                                                                   "min_s"] == 0.0
    capsys.readouterr()
    bad = write_alcf_log(tmp_path / "broken.log", low_ms=-500.0)
    code, out, err = _inspect(bad, capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert f"{bad}: line 14: timer 'optimizer': negative duration -0.5 s" in err


@pytest.mark.parametrize("head, is_json", [
    (b'{"traceEvents": []}', True), (b"[\n  {\"ph\": \"X\"}", True), (b"  []", True),
    (b"\xef\xbb\xbf{", True), (b"[", True),
    (b"[2024-05-01 10:00:00,123][INFO][training:1609] - iteration=", False),
    (b"[Rank 0] time (ms) | forward_microstep: 1.0", False),
    (b"[default0]:(min, max) time across ranks (ms):", False), (b"iteration 1", False),
])
def test_json_is_told_from_bracketed_text_by_its_first_bytes(head, is_json):
    assert looks_like_json(head) is is_json


def test_a_log_named_json_or_gzipped_is_still_read_as_a_log(tmp_path):
    path = write_alcf_log(tmp_path / "train.json")
    assert detect_format(path) == "megatron-log"
    packed = tmp_path / "train.log.gz"
    packed.write_bytes(gzip.compress(path.read_bytes()))
    assert detect_format(packed) == "megatron-log"
    pd.testing.assert_frame_equal(load_events(packed).frame, load_events(path).frame)
    not_json = tmp_path / "x.json"
    not_json.write_text("hello\n")
    with pytest.raises(BubblecastError, match="not a readable Chrome trace JSON"):
        load_events(not_json)


@pytest.mark.parametrize("value, fixed", [("-0.027", 1), ("-3.5", None)])
def test_a_deepspeed_log_timer_below_zero(value, fixed, tmp_path, capsys):
    path = tmp_path / "ds.log"
    path.write_text(
        "[2026-01-01 10:00:20,000] [INFO] [logging.py:96:log_dist] [Rank 0] step=1, skipped=0\n"
        "steps: 1 loss: 7.1000 iter time (s): 0.020 samples/sec: 3.670\n"
        "[2026-01-01 10:00:20,001] [INFO] [logging.py:96:log_dist] [Rank 0] time (ms) | "
        f"forward_microstep: 6.5 | backward_microstep: 9.0 | step_microstep: {value}\n")
    assert detect_format(path) == "deepspeed-log"
    code, out, err = _inspect(path, capsys)
    assert err.count("\n") == 1
    if fixed is None:
        assert code == 2 and out == ""
        assert f"{path}: line 3: timer 'step_microstep': negative duration -0.0035 s" in err
    else:
        assert code == 0 and json.loads(out)["input_fixes"] == {FIX: fixed}
        assert "1 negative duration (clock jitter, down to -2.7e-05 s)" in err
