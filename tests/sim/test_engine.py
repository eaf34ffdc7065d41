"""The vectorised engine against the reference event loop, and SPEC §2 properties."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.oracles.sim_reference import simulate_reference
from bubblecast.sim.engine import BLOCK_CELLS, OpGraph, simulate, simulate_rows
from bubblecast.sim.schedules import SCHEDULES, SIMULABLE, schedule_graph


@st.composite
def graphs(draw):
    """A random DAG: ops in a hidden global order, lanes and deps follow that order, then the
    op indices are shuffled so the engine cannot rely on them."""
    n = draw(st.integers(1, 30))
    lanes = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    pairs = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=40))
    deps = sorted({(a, b) for a, b in pairs if a < b})
    lag_choice = draw(st.sampled_from(["one", "zero", "mixed"]))
    lags = draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0]), min_size=len(deps),
                         max_size=len(deps)))
    if lag_choice != "mixed":
        lags = [1.0 if lag_choice == "one" else 0.0] * len(deps)
    perm = np.array(draw(st.permutations(range(n))))  # hidden position -> op index
    prev, last = np.full(n, -1), {}
    for pos in range(n):
        if lanes[pos] in last:
            prev[perm[pos]] = perm[last[lanes[pos]]]
        last[lanes[pos]] = pos
    rank = np.empty(n, dtype=np.int64)
    rank[perm] = lanes
    dep_arr = np.array([(perm[a], perm[b]) for a, b in deps], dtype=np.int64).reshape(-1, 2)
    return OpGraph(rank, prev, dep_arr, np.array(lags, dtype=np.float64))


def _durations(draw, graph: OpGraph, batch: int) -> np.ndarray:
    values = draw(st.lists(st.floats(0, 10, allow_nan=False), min_size=batch * graph.n_ops,
                           max_size=batch * graph.n_ops))
    return np.array(values).reshape(batch, graph.n_ops)


@settings(max_examples=150, deadline=None)
@given(graphs(), st.data())
def test_engine_equals_reference(graph, data):
    batch = data.draw(st.integers(1, 3))
    dur = _durations(data.draw, graph, batch)
    comm = np.array(data.draw(st.lists(st.floats(0, 3), min_size=batch, max_size=batch)))
    origin = data.draw(st.floats(-5, 5))
    s1, e1 = simulate(graph, dur, comm, origin)
    s2, e2 = simulate_reference(graph, dur, comm, origin)
    np.testing.assert_array_equal(s1, s2)
    np.testing.assert_array_equal(e1, e2)


@settings(max_examples=150, deadline=None)
@given(graphs(), st.data())
def test_every_dependency_holds(graph, data):
    dur = _durations(data.draw, graph, 2)
    comm = data.draw(st.floats(0, 3))
    start, end = simulate(graph, dur, comm)
    np.testing.assert_allclose(end - start, dur, atol=1e-9)
    assert (start >= 0).all()
    has_prev = graph.prev >= 0
    assert (start[:, has_prev] >= end[:, graph.prev[has_prev]]).all()
    if len(graph.deps):
        src, dst = graph.deps[:, 0], graph.deps[:, 1]
        assert (start[:, dst] >= end[:, src] + comm * graph.dep_lag - 1e-12).all()
    # Every op starts as early as its constraints allow (tight): at the origin or at one
    # of its predecessors' arrival times.
    for i in range(graph.n_ops):
        bounds = [np.zeros(2)]
        if graph.prev[i] >= 0:
            bounds.append(end[:, graph.prev[i]])
        for k in np.flatnonzero(graph.deps[:, 1] == i):
            bounds.append(end[:, graph.deps[k, 0]] + comm * graph.dep_lag[k])
        np.testing.assert_allclose(start[:, i], np.max(bounds, axis=0), atol=1e-12)


@settings(max_examples=150, deadline=None)
@given(graphs(), st.data())
def test_slower_op_never_makes_step_faster(graph, data):
    dur = _durations(data.draw, graph, 1)
    op = data.draw(st.integers(0, graph.n_ops - 1))
    extra = data.draw(st.floats(0, 5))
    comm = data.draw(st.floats(0, 2))
    _, end = simulate(graph, dur, comm)
    slower = dur.copy()
    slower[0, op] += extra
    _, end2 = simulate(graph, slower, comm)
    assert end2.max() >= end.max()
    assert (end2 >= end).all()  # no op ends earlier either


def _accounting(start, end, dur, lane, lanes):
    """SPEC §2 per row: window, busy and idle per lane."""
    window = end.max(axis=1) - start.min(axis=1)
    busy = np.stack([dur[:, lane == r].sum(axis=1) for r in range(lanes)], axis=1)
    return window, busy, window[:, None] - busy


@pytest.mark.parametrize("name", SIMULABLE)
def test_idle_nonnegative_and_busy_plus_idle(name):
    chunks = 2 if SCHEDULES[name].multi_chunk else 1
    sg = schedule_graph(name, 4, 8, chunks)
    rng = np.random.default_rng(3)
    dur = rng.lognormal(0, 0.5, (20, sg.graph.n_ops))
    start, end = simulate(sg.graph, dur, rng.uniform(0, 0.3, 20))
    window, busy, idle = _accounting(start, end, dur, sg.stage, 4)
    assert (idle >= -1e-9).all()
    np.testing.assert_allclose((busy + idle).sum(axis=1), 4 * window)
    # a lane never runs two ops at once
    for r in range(4):
        ops = np.flatnonzero(sg.stage == r)
        order = np.argsort(start[:, ops], axis=1, kind="stable")
        s = np.take_along_axis(start[:, ops], order, 1)
        e = np.take_along_axis(end[:, ops], order, 1)
        assert (s[:, 1:] >= e[:, :-1] - 1e-12).all()


@pytest.mark.parametrize("name", SIMULABLE)
@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (3, 9), (8, 24)])
def test_every_schedule_equals_the_reference_loop(name, p, m):
    """Exact start and end times, every schedule (V-shape ones included), random op times."""
    chunks = 2 if SCHEDULES[name].multi_chunk else 1
    if name in ("interleaved", "zb-interleaved") and m % max(1, m // p):
        m = p * 2
    sg = schedule_graph(name, p, m, chunks)
    rng = np.random.default_rng(p * 1000 + m)
    dur = rng.uniform(0, 2, (5, sg.graph.n_ops))
    comm = rng.uniform(0, 0.5, 5)
    for got, want in zip(simulate(sg.graph, dur, comm), simulate_reference(sg.graph, dur, comm),
                         strict=True):
        np.testing.assert_array_equal(got, want)


def test_cycle_is_reported():
    graph = OpGraph([0, 1], [-1, -1], [[0, 1], [1, 0]])
    with pytest.raises(ValueError, match="cycle"):
        simulate(graph, np.ones((1, 2)))
    with pytest.raises(ValueError, match="cycle"):
        simulate_reference(graph, np.ones((1, 2)))


def test_blocks_and_distinct_lags_agree_with_reference(monkeypatch):
    """Several row blocks, and lags other than 0/1 (one scratch block per distinct lag)."""
    import bubblecast.sim.engine as engine

    monkeypatch.setattr(engine, "BLOCK_CELLS", 1)  # 16-row blocks
    sg = schedule_graph("interleaved", 4, 8, 2)
    g = sg.graph
    lags = np.random.default_rng(1).choice([0.0, 0.5, 1.0, 2.0], len(g.deps))
    graph = OpGraph(g.rank, g.prev, g.deps, lags)
    dur = np.random.default_rng(2).uniform(0, 2, (50, graph.n_ops))
    comm = np.random.default_rng(3).uniform(0, 1, 50)
    for got, want in zip(simulate(graph, dur, comm, 1.5),
                         simulate_reference(graph, dur, comm, 1.5), strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("rows", [1, 63, 64, 130])
def test_c_and_fortran_ordered_inputs_agree_with_reference(rows):
    """C-ordered input goes through the tiled transpose (partial last tile included);
    Fortran-ordered input skips it; both equal the reference."""
    sg = schedule_graph("zb-h2", 4, 8)
    dur = np.random.default_rng(rows).uniform(0, 2, (rows, sg.graph.n_ops))
    want = simulate_reference(sg.graph, dur, 0.3)
    for layout in (np.ascontiguousarray(dur), np.asfortranarray(dur)):
        for got, ref in zip(simulate(sg.graph, layout, 0.3), want, strict=True):
            np.testing.assert_array_equal(got, ref)


def test_negative_times_are_refused():
    graph = OpGraph([0, 0], [-1, 0])
    with pytest.raises(ValueError, match=">= 0"):
        simulate(graph, np.array([[1.0, -1.0]]))
    with pytest.raises(ValueError, match=">= 0"):
        simulate(graph, np.ones((1, 2)), comm=-1.0)
    with pytest.raises(ValueError, match="dep_lag"):
        OpGraph([0, 1], [-1, -1], [[0, 1]], [-1.0])


def test_bad_shapes_are_refused():
    graph = OpGraph([0, 0], [-1, 0])
    with pytest.raises(ValueError, match="ops"):
        simulate(graph, np.ones((1, 3)))
    with pytest.raises(ValueError, match="prev"):
        OpGraph([0, 0], [-1])
    with pytest.raises(ValueError, match="range"):
        OpGraph([0, 0], [-1, 0], [[0, 5]])


def test_plan_is_cached_and_reused():
    sg = schedule_graph("1f1b", 4, 8)
    plan = sg.graph.plan()
    assert sg.graph.plan() is plan
    np.testing.assert_array_equal(np.sort(plan.order), np.arange(sg.graph.n_ops))
    assert plan.levels[-1].hi == sg.graph.n_ops


def test_scalar_and_row_comm_agree():
    sg = schedule_graph("zb-h1", 4, 6)
    dur = np.random.default_rng(0).uniform(0.5, 1.5, (3, sg.graph.n_ops))
    a = simulate(sg.graph, dur, 0.2)
    b = simulate(sg.graph, dur, np.full(3, 0.2))
    np.testing.assert_array_equal(a[0], b[0])
    # and a row simulated alone equals the same row in a batch
    c = simulate(sg.graph, dur[1], 0.2)
    np.testing.assert_array_equal(c[1][0], a[1][1])


@pytest.mark.parametrize("name,chunks", [("1f1b", 1), ("interleaved", 2), ("zbv", 2),
                                         ("dualpipev", 2), ("zb-h2", 1)])
def test_simulate_rows_equals_simulate_in_row_order(name, chunks):
    """The simulator's row-major variant: the same start times, C-ordered ``(batch, ops)``,
    across several blocks, and a row-major copy of the durations."""
    graph = schedule_graph(name, 4, 8, chunks).graph
    batch = 3 * BLOCK_CELLS // graph.n_ops + 5  # three full blocks and a short one
    op_major = np.random.default_rng(1).uniform(0.2, 3.0, (graph.n_ops, batch))
    rows = np.empty((batch, graph.n_ops))
    start = simulate_rows(graph, op_major, 0.25, rows)
    assert start.flags.c_contiguous and start.shape == (batch, graph.n_ops)
    np.testing.assert_array_equal(start, simulate(graph, op_major.T, 0.25)[0])
    np.testing.assert_array_equal(rows, op_major.T)
    with pytest.raises(ValueError):
        simulate_rows(graph, -op_major, 0.25)
