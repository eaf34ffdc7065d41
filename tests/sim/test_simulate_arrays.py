"""``simulate`` without pandas: ``write_simulation`` (numpy columns, written by the fast
writer) writes the very bytes that ``write_events(simulate_events(...))`` writes, device
metrics included, for files and fleet directories; the columns built on a worker thread are
the ones built inline."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from bubblecast.sim import simulator
from bubblecast.sim.device_metrics import write_simulated_metrics
from bubblecast.sim.simulator import (
    SimConfig,
    simulate_arrays,
    simulate_events,
    simulate_fleet,
    write_simulation,
)
from bubblecast.telemetry.fastwrite import Periodic
from bubblecast.telemetry.io import write_events

CONFIGS = {
    "1f1b": SimConfig(schedule="1f1b", stages=4, microbatches=4, steps=6),
    "zbv-comm": SimConfig(schedule="zbv", stages=4, microbatches=8, steps=4, comm=0.3),
    "interleaved-replicas": SimConfig(schedule="interleaved", stages=2, microbatches=4,
                                      chunks=2, steps=5, replicas=2,
                                      scenario="slow-replica"),
    "mixed-runs": SimConfig(schedule="1f1b", stages=4, microbatches=4, steps=40,
                            scenario="mixed", runs=6, seed=3),  # seqlen tokens, nulls
    "seqlen": SimConfig(schedule="zb-h1", stages=2, microbatches=4, steps=8, scenario="seqlen"),
    "documents": SimConfig(schedule="1f1b", stages=2, microbatches=4, steps=5, replicas=2,
                           documents="lognormal", runs=2),
    "thermal": SimConfig(schedule="1f1b", stages=2, microbatches=2, steps=30,
                         scenario="thermal", runs=2),
    "130 runs": SimConfig(schedule="1f1b", stages=2, microbatches=2, steps=1, runs=130),
}


def _full(values: np.ndarray | Periodic) -> np.ndarray:
    return values.full() if isinstance(values, Periodic) else values


def _files(root: Path) -> dict[str, bytes]:
    if root.is_file():
        return {".": root.read_bytes()}
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_write_simulation_writes_what_the_frame_path_writes(tmp_path: Path, name):
    config = CONFIGS[name]
    fast = tmp_path / "fast" / "e.parquet"
    run_ids, events = write_simulation(config, str(fast))
    frame = simulate_events(config)
    slow = tmp_path / "slow" / "e.parquet"
    write_events(frame, slow)
    write_simulated_metrics(config, slow)
    assert (run_ids, events) == (list(frame.runs), len(frame))
    assert _files(fast.parent) == _files(slow.parent)
    if name == "mixed-runs":  # runs with and without token counts: nulls written
        assert frame.frame["tokens"].isna().any() and frame.frame["tokens"].notna().any()


@pytest.mark.parametrize("name", ["mixed-runs", "thermal", "documents"])
def test_a_fleet_directory_is_written_as_before(tmp_path: Path, name):
    config = CONFIGS[name]
    run_ids, events = write_simulation(config, f"{tmp_path / 'fast'}/")
    for k in range(config.runs):  # the frame path, a run at a time
        write_events(simulate_events(replace(config, first_run=k, runs=1)),
                     f"{tmp_path / 'slow'}/")
    write_simulated_metrics(config, f"{tmp_path / 'slow'}/")
    assert _files(tmp_path / "fast") == _files(tmp_path / "slow")
    assert run_ids == config.run_ids() and events == len(simulate_events(config))
    assert simulate_fleet(config, f"{tmp_path / 'again'}/") == (run_ids, events)


def test_columns_built_on_a_worker_thread_equal_those_built_inline(monkeypatch):
    config = SimConfig(schedule="interleaved", stages=4, microbatches=8, chunks=2, steps=12,
                       replicas=2, scenario="mixed", runs=3)
    monkeypatch.setattr(simulator, "PARALLEL_ROWS", 1 << 40)
    inline = simulate_arrays(config)
    monkeypatch.setattr(simulator, "PARALLEL_ROWS", 0)
    threaded = simulate_arrays(config)
    assert list(inline.columns) == list(threaded.columns)
    for col, values in inline.columns.items():
        other = threaded.columns[col]
        assert type(values) is type(other) and values.dtype == other.dtype
        np.testing.assert_array_equal(_full(values), _full(other))
    assert inline.nulls.keys() == threaded.nulls.keys()
    assert {k: m.to_json() for k, m in inline.runs.items()} == \
        {k: m.to_json() for k, m in threaded.runs.items()}


def test_simulate_events_is_the_arrays_as_a_frame():
    config = CONFIGS["documents"]
    arrays, events = simulate_arrays(config), simulate_events(config)
    assert list(events.frame.columns) == list(arrays.columns)
    assert str(events.frame["tokens"].dtype) == "Int64"
    assert str(events.frame["documents"].dtype) == "Int32"
    for col, values in arrays.columns.items():
        if col not in ("run_id", "op", "tokens", "documents"):
            np.testing.assert_array_equal(events.frame[col].to_numpy(), _full(values))
