"""Replay: rebuilds each step's graph from the observed order and reproduces model-made runs.

``synthetic_run`` (also used by the accounting, what-if and plot tests) times a schedule with
a plain per-op Python loop of the SPEC §2 communication model, independent of the engine.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bubblecast.errors import BubblecastError
from bubblecast.sim.replay import ReplayConfig, ReplayModel, replay
from bubblecast.sim.schedules import build_schedule
from bubblecast.telemetry import RunMeta, from_frame

COLUMNS = ["run_id", "step", "rank", "stage", "replica", "chunk", "microbatch", "op",
           "start_s", "duration_s"]


def _time_lanes(lanes: list[list[tuple[str, int, int]]], dur: Callable[[int, str, int, int], float],
                comm: float, origin: float, vstage: Callable[[int, int], int], n_virtual: int,
                stalls: dict | None = None) -> tuple[list[tuple], list[float]]:
    """Per-op event loop: each op starts at max(previous op on its rank, dependency + comm)
    (comm only across ranks), plus an optional host stall ``stalls[(rank, kind, microbatch)]``."""
    p = len(lanes)
    end: dict[tuple[str, int, int], tuple[float, int]] = {}
    pos, clock, out = [0] * p, [origin] * p, []
    left = sum(len(lane) for lane in lanes)
    while left:
        moved = False
        for r in range(p):
            while pos[r] < len(lanes[r]):
                kind, mb, ch = lanes[r][pos[r]]
                v = vstage(r, ch)
                dep = ("F", mb, v - 1) if kind == "F" and v > 0 else \
                    ("B", mb, v + 1) if kind == "B" and v < n_virtual - 1 else None
                if dep is not None and dep not in end:
                    break
                ready = clock[r]
                if dep is not None:
                    dep_end, dep_rank = end[dep]
                    ready = max(ready, dep_end + (comm if dep_rank != r else 0.0))
                ready += (stalls or {}).get((r, kind, mb), 0.0)
                d = dur(r, kind, mb, ch)
                out.append((r, kind, mb, ch, ready, d))
                clock[r] = ready + d
                end[(kind, mb, v)] = (clock[r], r)
                pos[r] += 1
                left -= 1
                moved = True
        if not moved:
            raise RuntimeError("deadlocked schedule")
    return out, clock


def v_shape_lanes(p: int, m: int) -> list[list[tuple[str, int, int]]]:
    """A simple V-shape order (rank r holds virtual stages r and 2p - 1 - r): every forward of
    chunk 0, then of chunk 1, then the backwards in reverse chunk order."""
    lane = [("F", i, 0) for i in range(m)] + [("F", i, 1) for i in range(m)]
    lane += [("B", i, 1) for i in range(m)] + [("B", i, 0) for i in range(m)]
    return [list(lane) for _ in range(p)]


def synthetic_run(schedule: str = "1f1b", stages: int = 4, microbatches: int = 8, *,
                  chunks: int = 1, replicas: int = 1, steps: int = 2, f: float = 1e-3,
                  b: float = 2e-3, w: float = 1e-3, comm: float = 0.0,
                  stage_scale: list[float] | None = None,
                  speed: Callable[[int, int], float] | None = None, jitter: float = 0.0,
                  allreduce: float | None = None, stalls: dict | None = None, seed: int = 0,
                  posted_p2p: bool = False, run_id: str = "syn"):
    """A run generated exactly by the SPEC §2 model (plus, optionally, a gradient all-reduce
    per stage across replicas and an optimizer op at the end of each step). ``schedule``
    ``v-shape`` uses :func:`v_shape_lanes`; ``posted_p2p`` adds zero-length posted sends and
    receives around forwards and tags the run as a Kineto import."""
    rng = np.random.default_rng(seed)
    if schedule == "v-shape":
        lanes, split, chunks = v_shape_lanes(stages, microbatches), False, 2
        vstage = lambda r, ch: r if ch == 0 else 2 * stages - 1 - r  # noqa: E731
    else:
        order = build_schedule(schedule, stages, microbatches, chunks)
        lanes = [[(op.kind, op.microbatch, op.chunk) for op in lane] for lane in order.ranks]
        split = order.split_backward
        vstage = lambda r, ch: ch * stages + r  # noqa: E731
    base = {"F": f / chunks, "B": (b if split else b + w) / chunks, "W": w / chunks}
    scale = stage_scale or [1.0] * stages
    rows = []
    for step in range(steps):
        origin = 10.0 * step
        ready = {}
        for d in range(replicas):
            def dur(r, kind, mb, ch, d=d, step=step):
                x = base[kind] * scale[r] * (speed(step, d * stages + r) if speed else 1.0)
                return x * float(np.exp(rng.normal(0.0, jitter))) if jitter else x
            ops, clock = _time_lanes(lanes, dur, comm, origin, vstage, chunks * stages,
                                     stalls if d == 0 else None)
            for r, kind, mb, ch, s, du in ops:
                rows.append((run_id, step, d * stages + r, r, d, ch, mb, kind, s, du))
                if posted_p2p and kind == "F":
                    v = vstage(r, ch)
                    if v > 0:
                        rows.append((run_id, step, d * stages + r, r, d, ch, mb, "RECV_F", s, 0.0))
                    if v < chunks * stages - 1:
                        rows.append((run_id, step, d * stages + r, r, d, ch, mb, "SEND_F",
                                     s + du, 0.0))
            for r in range(stages):
                ready[(d, r)] = clock[r]
        if allreduce is None:
            continue
        for r in range(stages):
            go = max(ready[(d, r)] for d in range(replicas))
            for d in range(replicas):
                rank, own = d * stages + r, ready[(d, r)]
                rows.append((run_id, step, rank, r, d, 0, -1, "ALLREDUCE", own,
                             go + allreduce - own))
                rows.append((run_id, step, rank, r, d, 0, -1, "OPTIMIZER", go + allreduce,
                             2e-4))
    frame = pd.DataFrame(rows, columns=COLUMNS)
    meta = RunMeta(schedule=schedule, stages=stages, microbatches=microbatches, chunks=chunks,
                   replicas=replicas, source="kineto" if posted_p2p else "test",
                   extra={"stage_layout": "v-shape"} if schedule == "v-shape" else {})
    return from_frame(frame, {run_id: meta})


SCHEDULE_CASES = [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb-h1", 1), ("zb-h2", 1)]


@pytest.mark.parametrize(("schedule", "chunks"), SCHEDULE_CASES)
def test_replay_reproduces_a_model_generated_run(schedule, chunks):
    ev = synthetic_run(schedule, 4, 8, chunks=chunks, replicas=2, steps=3, comm=3e-4,
                       jitter=0.3, allreduce=5e-3, seed=1)
    model = ReplayModel(ev)
    result = model.run()
    assert model.comm == pytest.approx(3e-4, abs=1e-12)
    # Collectives start at the last participant's arrival: compare their ends.
    np.testing.assert_allclose(result.end, model.start + model.observed, atol=1e-9)
    local = ~model.is_comm
    np.testing.assert_allclose(result.start[local], model.start[local], atol=1e-9)
    np.testing.assert_allclose(result.replayed_step_s, result.observed_step_s, rtol=1e-9)
    assert len(model.groups) == 1  # every step shares one signature: one engine call


def test_v_shape_placement_and_same_rank_dependencies():
    ev = synthetic_run("v-shape", 3, 4, replicas=2, steps=2, comm=5e-4, jitter=0.3, seed=2)
    model = ReplayModel(ev)
    assert model.v_shape and model.comm == pytest.approx(5e-4, abs=1e-12)
    np.testing.assert_allclose(model.run().start, model.start, atol=1e-9)


def test_posted_sends_and_receives_are_local_ops():
    ev = synthetic_run("1f1b", 4, 6, steps=2, comm=3e-4, jitter=0.3, seed=7, posted_p2p=True)
    assert (ev.frame["op"] == "RECV_F").any()
    model = ReplayModel(ev)  # auto: posted for a Kineto import
    assert not model.blocking_p2p and model.comm == pytest.approx(3e-4, abs=1e-12)
    result = model.run()
    comp = model.is_compute  # a posted receive runs as soon as its rank is free
    np.testing.assert_allclose(result.start[comp], model.start[comp], atol=1e-9)
    np.testing.assert_allclose(result.error, 0.0, atol=1e-9)
    blocking = ReplayModel(ev, config=ReplayConfig(p2p="blocking"))
    assert blocking.blocking_p2p and blocking.comm == 0.0


def test_allreduce_waiting_is_replaced_by_the_transfer_time():
    ev = synthetic_run("1f1b", 2, 4, replicas=2, steps=1, allreduce=4e-3,
                       stage_scale=[1.0, 1.0], speed=lambda s, r: 2.0 if r == 3 else 1.0)
    model = ReplayModel(ev)
    ar = (model.frame["op"] == "ALLREDUCE").to_numpy()
    np.testing.assert_allclose(model.pure[ar], 4e-3, rtol=1e-9)
    assert model.observed[ar].max() > 4e-3 * 2  # rank 1 waited for the slow rank 3


def test_scaling_every_duration_scales_the_step():
    ev = synthetic_run("zb-h1", 4, 6, steps=2, jitter=0.2, seed=3)
    model = ReplayModel(ev)
    base, doubled = model.run(), model.run(model.pure * 2.0)
    np.testing.assert_allclose(doubled.replayed_step_s, 2 * base.replayed_step_s, rtol=1e-9)


def test_steps_with_different_orders_get_their_own_graphs():
    one = synthetic_run("1f1b", 3, 4, steps=1, seed=0).frame
    two = synthetic_run("gpipe", 3, 4, steps=1, seed=0).frame.assign(step=1)
    frame = pd.concat([one, two], ignore_index=True)
    frame["run_id"] = frame["run_id"].astype(str)
    ev = from_frame(frame, {"syn": RunMeta(schedule="mixed", stages=3, microbatches=4)})
    model = ReplayModel(ev)
    assert len(model.groups) == 2
    np.testing.assert_allclose(model.run().error, 0.0, atol=1e-12)


def test_an_order_that_contradicts_the_dependencies_is_refused():
    rows = [("r", 0, 0, 0, 0, 0, 0, "B", 0.0, 1.0), ("r", 0, 0, 0, 0, 0, 0, "F", 1.0, 1.0),
            ("r", 0, 1, 1, 0, 0, 0, "F", 2.0, 1.0), ("r", 0, 1, 1, 0, 0, 0, "B", 3.0, 1.0)]
    ev = from_frame(pd.DataFrame(rows, columns=COLUMNS),
                    {"r": RunMeta(stages=2, microbatches=1)})
    with pytest.raises(BubblecastError, match="step 0"):
        replay(ev)


def test_launch_delays_are_kept_when_asked():
    stalls = {(0, "F", 2): 5e-4, (2, "B", 1): 3e-4}  # host stalls the model does not explain
    ev = synthetic_run("1f1b", 3, 4, steps=2, comm=1e-4, jitter=0.2, stalls=stalls)
    model = ReplayModel(ev, config=ReplayConfig(launch_delays=True, comm_s=1e-4))
    np.testing.assert_allclose(model.run().start, model.start, atol=1e-9)
    assert np.sort(model.delay)[-4:] == pytest.approx([3e-4, 3e-4, 5e-4, 5e-4])
    plain = ReplayModel(ev, config=ReplayConfig(comm_s=1e-4)).run()
    assert (plain.replayed_step_s <= plain.observed_step_s + 1e-12).all()
    assert (plain.replayed_step_s < plain.observed_step_s - 1e-4).any()


def test_bad_durations_are_rejected():
    model = ReplayModel(synthetic_run("gpipe", 2, 2, steps=1))
    with pytest.raises(ValueError):
        model.run(np.zeros(3))
    with pytest.raises(ValueError):
        model.run(-model.pure)
    with pytest.raises(ValueError):
        ReplayConfig(comm_s=-1.0)
    with pytest.raises(ValueError):
        ReplayConfig(collectives={"x": "galaxy"})


runs = st.builds(
    lambda sched, p, m, d, comm, seed: synthetic_run(
        sched[0], p, m * (p if sched[0] == "interleaved" else 1), chunks=sched[1], replicas=d,
        steps=2, comm=comm, jitter=0.5, seed=seed, allreduce=1e-3 if d > 1 else None),
    st.sampled_from(SCHEDULE_CASES), st.integers(1, 4), st.integers(1, 4), st.integers(1, 2),
    st.sampled_from([0.0, 1e-4, 7e-4]), st.integers(0, 10_000))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs)
def test_property_replay_of_a_model_run_has_no_error(ev):
    result = replay(ev)
    assert np.max(result.error) < 1e-9


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs, st.integers(0, 10**9), st.floats(1e-5, 5e-3))
def test_property_a_slower_op_never_makes_a_step_faster(ev, pick, extra):
    model = ReplayModel(ev)
    base = model.run()
    slower = model.pure.copy()
    slower[pick % len(slower)] += extra
    after = model.run(slower)
    assert (after.replayed_step_s >= base.replayed_step_s - 1e-12).all()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs, st.integers(0, 2**32 - 1))
def test_property_replayed_times_respect_every_dependency(ev, seed):
    model = ReplayModel(ev)
    rng = np.random.default_rng(seed)
    result = model.run(model.pure * rng.uniform(0.2, 3.0, len(model.pure)))
    f = model.frame.assign(s=result.start, e=result.end, obs=model.start)
    f = f.sort_values(["step", "rank", "obs"], kind="stable")
    same = (f["step"].diff() == 0) & (f["rank"].diff() == 0)
    assert (f["s"][same].to_numpy() >= f["e"].shift()[same].to_numpy() - 1e-12).all()
    meta = ev.runs["syn"]
    comp = f[f["op"].isin(["F", "B"])].copy()
    comp["v"] = comp["chunk"] * meta.stages + comp["stage"]
    comp["src_v"] = np.where(comp["op"] == "F", comp["v"] - 1, comp["v"] + 1)
    pairs = comp.merge(comp, left_on=["step", "replica", "op", "microbatch", "src_v"],
                       right_on=["step", "replica", "op", "microbatch", "v"],
                       suffixes=("", "_src"))
    lag = np.where(pairs["rank"] != pairs["rank_src"], model.comm, 0.0)
    assert (pairs["s"] >= pairs["e_src"] + lag - 1e-12).all()
    ar = f[f["op"] == "ALLREDUCE"]
    if len(ar):
        spread = ar.groupby(["step", "stage"])["s"].agg(lambda x: x.max() - x.min())
        assert (spread < 1e-12).all()
