"""The megatron-timeline importer on the real timeline of trace-ST (data/megatron-ops).

``timeline-ST.json.gz`` is the Chrome-trace timeline of the same Megatron-LM run as
``trace-ST.parquet``: both must give the same layout, steps, bottleneck and slow ranks, and the
same per-stage busy time (compute ops are identical; the timeline draws receives without their
waiting, so communication differs).
"""

from __future__ import annotations

import gzip
import json

import pytest

from bubblecast.cli import main
from bubblecast.errors import BubblecastError
from bubblecast.sim.accounting import inspect_summary
from bubblecast.telemetry.importers import detect_format, load_events
from tests.conftest import MEGATRON_TIMELINE, MEGATRON_TRACE


@pytest.fixture(scope="module")
def both():
    return (load_events(MEGATRON_TIMELINE, "megatron-timeline"),
            load_events(MEGATRON_TRACE, "megatron-ops"))


@pytest.fixture(scope="module")
def summaries(both):
    return tuple(inspect_summary(ev) for ev in both)


def test_detected_by_content(tmp_path):
    assert detect_format(MEGATRON_TIMELINE) == "megatron-timeline"
    plain = tmp_path / "renamed.json"  # no telling name, not gzipped: still found by content
    plain.write_bytes(gzip.decompress(MEGATRON_TIMELINE.read_bytes()))
    assert detect_format(plain) == "megatron-timeline"


def test_same_layout_and_ops_as_the_parquet_trace(both):
    timeline, trace = both
    mt, mp = timeline.runs["ST"], trace.runs["ST"]
    assert (mt.stages, mt.replicas, mt.microbatches, mt.chunks, mt.schedule) == \
        (mp.stages, mp.replicas, mp.microbatches, mp.chunks, mp.schedule) == (4, 2, 4, 1, "1f1b")
    assert mt.source == "megatron-timeline" and mt.extra["timing"] == "host"
    key = ["step", "rank", "stage", "replica", "chunk", "microbatch", "op"]
    a = timeline.compute().sort_values(key).reset_index(drop=True)
    b = trace.compute().sort_values(key).reset_index(drop=True)
    assert len(a) == len(b) == 32 * 8 * 4 * 2
    assert (a[key].to_numpy() == b[key].to_numpy()).all()
    assert abs(a["duration_s"] - b["duration_s"]).max() < 1e-6
    assert sorted(timeline.frame["op"].astype(str).unique()) == \
        sorted(trace.frame["op"].astype(str).unique())


def test_same_inspect_answers(summaries):
    tl, pq = summaries
    for key in ("steps", "stages", "replicas", "bottleneck_stage", "slow_ranks"):
        assert tl[key] == pq[key], key
    assert tl["bottleneck_stage"] == 3
    for s_tl, s_pq in zip(tl["per_stage"], pq["per_stage"], strict=True):
        assert s_tl["stage"] == s_pq["stage"]
        assert s_tl["busy_s"] == pytest.approx(s_pq["busy_s"], rel=0.01)
    assert tl["granularity"] == "op" and tl["timing"] == "host"


def test_cli_whatif_accepts_the_timeline(capsys):
    assert main(["whatif", str(MEGATRON_TIMELINE), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bottleneck_stage"] == 3 and out["timing"] == "host"
    assert out["scenarios"]["fix_bottleneck"]["speedup"] > 1.05


def test_dataset_and_policy_eval_json_say_the_timing(tmp_path, capsys):
    assert main(["dataset", str(MEGATRON_TIMELINE), "--out", str(tmp_path / "f.parquet"),
                 "--windows", "5,10", "--horizons", "1", "--lags", "4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["timing"] == "host"
    assert main(["policy-eval", str(MEGATRON_TIMELINE), "--policies", "static,reactive",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["timing"] == "host"


def test_a_timeline_without_megatron_thread_names_is_refused(tmp_path):
    bad = tmp_path / "timeline-x.json"
    bad.write_text(json.dumps({"traceEvents": [
        {"name": "forward-compute", "ph": "X", "pid": 0, "tid": 0, "ts": 0, "dur": 1,
         "args": {"step": 1, "model_chunk": 0, "mb_id": 0}}]}))
    with pytest.raises(BubblecastError, match="thread names") as err:
        load_events(bad, "megatron-timeline")
    assert "\n" not in str(err.value)


def test_an_op_without_a_step_names_its_event(tmp_path):
    events = json.loads(gzip.decompress(MEGATRON_TIMELINE.read_bytes()))
    xs = [i for i, e in enumerate(events) if e.get("ph") == "X"]
    del events[xs[5]]["args"]["step"]
    bad = tmp_path / "timeline-ST.json"
    bad.write_text(json.dumps(events))
    with pytest.raises(BubblecastError, match=rf"traceEvents\[{xs[5]}\].*'step'"):
        load_events(bad)
