"""The Megatron-LM importer on the real production trace in data/megatron-ops."""

from __future__ import annotations

import pyarrow.parquet as pq

from bubblecast.telemetry.importers import detect_format, load_events


def test_real_trace_imports_with_its_parallel_sizes(megatron_trace):
    events = load_events(megatron_trace, "megatron-ops")
    meta = events.runs["ST"]
    assert (meta.stages, meta.replicas, meta.microbatches, meta.chunks) == (4, 2, 4, 1)
    assert meta.source == "megatron-ops" and meta.schedule == "1f1b"
    assert meta.extra["world_size"] == 8
    frame = events.frame
    assert frame["step"].nunique() == 32
    assert frame["rank"].nunique() == 8
    # Every source row is kept: unknown optypes become OTHER, never dropped.
    assert len(frame) == pq.read_metadata(megatron_trace).num_rows
    other = frame.loc[frame["op"] == "OTHER", "name"].unique()
    assert {"gc", "optimizer-clip-main-grad"} <= set(other)
    # 4 microbatches x (F, B) per rank per step.
    compute = events.compute()
    assert len(compute) == 32 * 8 * 4 * 2


def test_last_stage_carries_about_1_6_times_the_compute(megatron_trace):
    compute = load_events(megatron_trace).compute()
    busy = compute.groupby("stage", observed=True)["duration_s"].sum()
    ratio = busy[3] / busy[[0, 1, 2]].mean()
    assert 1.5 < ratio < 1.7


def test_format_is_detected_by_content(megatron_trace, tmp_path):
    assert detect_format(megatron_trace) == "megatron-ops"


def test_a_directory_of_megatron_traces_is_refused_in_one_line(megatron_trace, tmp_path):
    import shutil

    import pytest

    from bubblecast.errors import BubblecastError

    shutil.copy(megatron_trace, tmp_path / "trace-ST.parquet")
    with pytest.raises(BubblecastError, match="directory of megatron-ops files"):
        detect_format(tmp_path)
