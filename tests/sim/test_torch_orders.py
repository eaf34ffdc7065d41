"""Simulated op orders against torch: the orders torch 2.13 generates for its multi-stage
schedule classes, its CSV format, and the order a live two-rank run records."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from benchmarks.oracles.sim_reference import simulate_reference
from bubblecast.errors import BubblecastError
from bubblecast.sim import torch_actions
from bubblecast.sim.engine import simulate
from bubblecast.sim.schedules import SCHEDULES, build_schedule, schedule_graph, to_torch_actions

torch_schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
HERE = Path(__file__).resolve().parent
#: bubblecast's builders that port a torch generator, by torch class.
PORTS = {"ScheduleLoopedBFS": ("looped-bfs", (2, 3)),
         "ScheduleInterleaved1F1B": ("interleaved", (2, 3)),
         "ScheduleInterleavedZeroBubble": ("zb-interleaved", (2, 3)),
         "ScheduleZBVZeroBubble": ("zbv", (2,)),
         "ScheduleDualPipeV": ("dualpipev", (2,))}
SHAPES = [(p, m) for p in (1, 2, 3, 4, 8) for m in (1, 2, 3, 4, 5, 8, 12, 16, 24)]


def _ours(name: str, p: int, m: int, v: int):
    try:
        return build_schedule(name, p, m, v)
    except BubblecastError:
        return None


@pytest.mark.parametrize("cls", sorted(PORTS))
def test_builders_equal_the_orders_torch_generates(cls):
    name, chunk_options = PORTS[cls]
    checked = 0
    for p, m in SHAPES:
        for v in chunk_options:
            ours = _ours(name, p, m, v)
            if ours is None:
                continue
            lanes, placement = torch_actions.torch_lanes(cls, p, m, v)
            assert [list(lane) for lane in ours.ranks] == lanes, (cls, p, m, v)
            assert tuple(map(tuple, ours.vstages.tolist())) == placement, (cls, p, m, v)
            checked += 1
    assert checked >= 20


def test_zb_h1_is_torch_zero_bubble_with_one_chunk():
    for p, m in [(2, 4), (4, 8), (4, 12), (8, 24)]:
        lanes, _ = torch_actions.torch_lanes("ScheduleInterleavedZeroBubble", p, m, 1)
        assert [list(lane) for lane in build_schedule("zb-h1", p, m).ranks] == lanes


@pytest.mark.parametrize("cls", sorted(PORTS))
def test_torch_schedule_simulates_like_its_port(cls):
    """``--schedule torch:<ClassName>`` times exactly as the ported builder does."""
    name, _ = PORTS[cls]
    p, m = 4, 8
    port, theirs = schedule_graph(name, p, m, 2), schedule_graph(f"torch:{cls}", p, m, 2)
    assert (port.kind == theirs.kind).all() and (port.vstage == theirs.vstage).all()
    assert (port.fused == theirs.fused).all()
    dur = np.random.default_rng(0).uniform(0.5, 2, (3, port.graph.n_ops))
    for a, b in zip(simulate(port.graph, dur, 0.1), simulate_reference(theirs.graph, dur, 0.1),
                    strict=True):
        np.testing.assert_array_equal(a, b)


def test_dualpipev_fuses_some_backwards():
    sg = schedule_graph("dualpipev", 4, 8, 2)
    b = sg.kind == 1
    assert sg.fused[b].any() and not sg.fused[b].all()
    assert (sg.kind == 2).sum() == (~sg.fused[b]).sum()  # one W per split backward


@pytest.mark.parametrize("name", ["interleaved", "zb-h2", "zbv", "dualpipev", "looped-bfs"])
def test_csv_round_trip(tmp_path, name):
    v = 2 if SCHEDULES[name].multi_chunk else 1
    sched = build_schedule(name, 4, 8, v)
    path = tmp_path / "s.csv"
    torch_actions.write_csv(path, to_torch_actions(sched))
    back = build_schedule(f"csv:{path}", 4, 8, v)
    assert back.ranks == sched.ranks and (back.vstages == sched.vstages).all()


def test_csv_from_torchs_own_dump(tmp_path):
    """A file torch's ``_dump_csv`` wrote (compute only: empty cells for idle slots, overlapped
    pairs) and one with its communication actions both load."""
    from bubblecast.sim.torch_actions import _StandIn

    torch = pytest.importorskip("torch")
    p, m = 2, 4
    per_rank = {}
    for rank in range(p):
        stages = [_StandIn(p, rank, 2 * p, i, torch.nn.Identity()) for i in (rank, 3 - rank)]
        per_rank[rank] = torch_schedules.ScheduleDualPipeV(stages, m)
    sched = per_rank[0]
    sched._dump_csv(str(tmp_path / "compute.csv"), format="compute_only")
    sched._dump_csv(str(tmp_path / "comms.csv"), format="compute_comms")
    want = build_schedule("dualpipev", p, m, 2)
    for file in ("compute.csv", "comms.csv"):
        got = build_schedule(f"csv:{tmp_path / file}", p, m, 2)
        assert got.ranks == want.ranks, file


@pytest.mark.parametrize(("text", "match"), [
    ("0F0,0Q1", "not a torch action"), ("0F0,1F0", "every op once"),
    ("0F0,0B0\n0F0,0B0", "runs on ranks"),
])
def test_bad_csv_is_a_one_line_error(tmp_path, text, match):
    path = tmp_path / "bad.csv"
    path.write_text(text + "\n")
    with pytest.raises(BubblecastError, match=match) as err:
        schedule_graph(f"csv:{path}", len(text.splitlines()), 1, 1)
    assert "\n" not in str(err.value)


def _recorded_lanes(parts: Path) -> list[list[tuple[str, int, int]]]:
    frame = pd.concat([pd.read_parquet(f) for f in sorted(parts.glob("*.parquet"))])
    frame = frame[frame["op"].astype(str).isin(["F", "B", "W"])]
    frame = frame.sort_values(["rank", "start_s"], kind="stable")
    return [list(zip(g["op"].astype(str), g["microbatch"].astype(int), g["chunk"].astype(int),
                     strict=True)) for _, g in frame.groupby("rank", sort=True)]


@pytest.mark.dist
def test_live_two_rank_orders_equal_the_simulated_ones(tmp_path):
    """Every schedule the runtime runs: the per-rank F/B/W order it records (start order)
    is the simulated order, op by op."""
    from bubblecast.runtime.launch import failure_message, launch
    from bubblecast.runtime.plan import SCHEDULES as RUNNABLE

    code = launch(tmp_path, 2, script=str(HERE / "live_orders.py"), timeout=240)
    log = tmp_path / "torchrun.log"
    assert code == 0, failure_message(tmp_path) + (log.read_text()[-3000:] if log.exists() else "")
    plans = json.loads((tmp_path / "plans.json").read_text())
    assert sorted(plans) == sorted(RUNNABLE)
    for name, shape in plans.items():
        sched = build_schedule(name, shape["stages"], shape["microbatches"], shape["chunks"])
        want = [[(op.kind, op.microbatch, op.chunk) for op in lane] for lane in sched.ranks]
        assert _recorded_lanes(tmp_path / name) == want, name


@pytest.mark.parametrize("name", ["zbv", "dualpipev", "interleaved"])
def test_csv_and_torch_sources_simulate_like_the_named_schedule(tmp_path, name):
    """Same events (times, layers per rank) from the name, its torch class and its CSV file,
    with a per-rank partition split over the chunks as the placement puts them."""
    from bubblecast.sim.schedules import vstage_ranks
    from bubblecast.sim.simulator import SimConfig, simulate_events

    path = tmp_path / "s.csv"
    torch_actions.write_csv(path, to_torch_actions(build_schedule(name, 4, 8, 2)))
    torch_name = "torch:" + SCHEDULES[name].torch_class
    frames = []
    for source in (name, f"csv:{path}", torch_name):
        assert vstage_ranks(source, 4, 2).tolist() == vstage_ranks(name, 4, 2).tolist()
        config = SimConfig(schedule=source, stages=4, microbatches=8, chunks=2, comm=0.1,
                           model="uniform:16", partition=[3, 5, 4, 4], scenario="jitter")
        frames.append(simulate_events(config).frame)
    cols = ["rank", "chunk", "microbatch", "op", "start_s", "duration_s", "layers"]
    for other in frames[1:]:
        pd.testing.assert_frame_equal(frames[0][cols], other[cols])
    assert frames[0].groupby("rank")["layers"].first().tolist() == [3, 5, 4, 4]
