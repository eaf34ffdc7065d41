"""``inspect --perfetto``: starts and ends in whole nanoseconds, durations their difference."""

from __future__ import annotations

import json
from decimal import Decimal

import numpy as np
import pandas as pd

from bubblecast.cli import main
from bubblecast.sim.perfetto import trace_events, write_perfetto
from bubblecast.telemetry import write_events
from bubblecast.telemetry.events_builder import from_frame
from bubblecast.telemetry.schema import RunMeta

#: 1.0006 us: rounding start and duration to the nanosecond separately, as the export once
#: did, made op k end at round(k * 1.0006 us) + k ns past where op k + 1 starts.
DUR_S = 1.0006e-6
OPS = 12


def _back_to_back(steps: int = 2) -> pd.DataFrame:
    """One rank, ``OPS`` forwards per step, each starting where the previous one ends (the
    next start is the float sum start + duration), on float times that are not whole ns."""
    starts = np.zeros(OPS)
    for k in range(1, OPS):
        starts[k] = starts[k - 1] + DUR_S
    return pd.DataFrame({
        "run_id": "ns", "step": np.repeat(np.arange(steps), OPS), "rank": 0, "stage": 0,
        "replica": 0, "chunk": 0, "microbatch": np.tile(np.arange(OPS), steps), "op": "F",
        "start_s": np.tile(starts + 3.3e-10, steps), "duration_s": DUR_S,
    })


def _events():
    runs = {"ns": RunMeta(schedule="gpipe", stages=1, microbatches=OPS, source="test")}
    return from_frame(_back_to_back(), runs)


def _spans_ns(text: str) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """(pid, tid) -> [(start_ns, end_ns)] in start order, read back exactly (decimal, no
    binary floats) from trace JSON text (an object with ``traceEvents`` or the bare list)."""
    trace = json.loads(text, parse_float=Decimal)
    tracks: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for e in trace["traceEvents"] if isinstance(trace, dict) else trace:
        if e["ph"] != "X":
            continue
        start, dur = Decimal(e["ts"]) * 1000, Decimal(e["dur"]) * 1000
        assert start == start.to_integral_value() and dur == dur.to_integral_value()
        tracks.setdefault((e["pid"], e["tid"]), []).append((int(start), int(start + dur)))
    return {k: sorted(v) for k, v in tracks.items()}


def test_back_to_back_ops_never_overlap_and_times_are_whole_ns():
    tracks = _spans_ns(json.dumps(trace_events(_events())))
    spans = tracks[(0, 0)]
    assert len(spans) == 2 * OPS
    ends, next_starts = np.array(spans[:-1])[:, 1], np.array(spans[1:])[:, 0]
    assert (ends <= next_starts).all()
    within_step = np.r_[np.arange(OPS - 1), OPS + np.arange(OPS - 1)]
    assert (ends[within_step] == next_starts[within_step]).all()  # they meet, no gap either
    # each duration is within half a nanosecond of the true one either way (1000.6 ns)
    durations = np.array([e - s for s, e in spans])
    assert set(durations.tolist()) <= {1000, 1001}
    assert abs(durations[:OPS].sum() - OPS * DUR_S * 1e9) <= 1.0


def test_the_old_separate_rounding_would_overlap_on_this_trace():
    """The fixture is one where rounding ``ts`` and ``dur`` separately overlaps (guards the
    test above against a fixture on which any rounding passes)."""
    frame = _back_to_back(1)
    ts = (frame["start_s"] - frame["start_s"].min()).to_numpy() * 1e6
    old_end = np.round(ts, 3) + np.round(frame["duration_s"].to_numpy() * 1e6, 3)
    assert (old_end[:-1] > np.round(ts, 3)[1:] + 1e-9).any()


def test_inspect_perfetto_file_has_the_same_whole_ns_spans(tmp_path, capsys):
    src, out = tmp_path / "ns.parquet", tmp_path / "trace.json"
    write_events(_events(), src)
    assert main(["inspect", str(src), "--perfetto", str(out), "--json"]) == 0
    assert "input_fixes" not in json.loads(capsys.readouterr().out)  # bubblecast: never fixed
    assert _spans_ns(out.read_text()) == _spans_ns(json.dumps(trace_events(_events())))
    assert write_perfetto(_events(), tmp_path / "again.json").read_text() == out.read_text()
