"""The engine's shortcuts give the general path's times bit for bit: ``simulate_rows`` without
communication (no arrival rows in its working array, no end times kept) and the levels found
without ``np.unique``."""

from __future__ import annotations

import numpy as np
import pytest

from bubblecast.sim.engine import BLOCK_CELLS, simulate, simulate_rows, sorted_unique
from bubblecast.sim.schedules import schedule_graph


@pytest.mark.parametrize("name,chunks", [("1f1b", 1), ("interleaved", 2), ("zbv", 2),
                                         ("dualpipev", 2), ("zb-h1", 1), ("gpipe", 1)])
@pytest.mark.parametrize("comm", [0.0, 0.3])
def test_simulate_rows_without_comm_equals_the_general_engine(name, chunks, comm):
    graph = schedule_graph(name, 4, 8, chunks).graph
    batch = 2 * BLOCK_CELLS // graph.n_ops + 7  # two full blocks and a short one
    op_major = np.random.default_rng(3).uniform(0.0, 2.0, (graph.n_ops, batch))
    op_major[:, ::5] = 0.0  # zero durations: ties between an end and its arrival
    rows = np.empty((batch, graph.n_ops))
    start = simulate_rows(graph, op_major, comm, rows)
    want, _ = simulate(graph, op_major.T, np.full(batch, comm))  # per-row comm: general path
    np.testing.assert_array_equal(start, want)
    np.testing.assert_array_equal(rows, op_major.T)


def test_levels_are_found_once_and_cover_every_op():
    graph = schedule_graph("zb-h1", 4, 8).graph
    levels = graph.levels()
    assert graph.levels() is levels
    np.testing.assert_array_equal(np.sort(np.concatenate(levels)), np.arange(graph.n_ops))


@pytest.mark.parametrize("values", [np.array([], dtype=np.int64), np.array([3]),
                                    np.array([5, 1, 5, 2, 1, 9]), np.array([0.5, 2.0, 0.5, 1.0])])
def test_sorted_unique_is_np_unique(values):
    got = sorted_unique(values)
    np.testing.assert_array_equal(got, np.unique(values))
    assert got.dtype == values.dtype
