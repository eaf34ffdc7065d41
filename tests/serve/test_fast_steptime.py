"""The service's step timing (a compiled scalar program for small graphs) equals the engine."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from bubblecast.errors import BubblecastError
from bubblecast.sim import steptime
from bubblecast.sim.engine import OpGraph
from bubblecast.sim.schedules import SCHEDULES

SHAPES = [(1, 1, 1), (2, 4, 1), (4, 8, 1), (4, 8, 2), (3, 5, 2), (8, 16, 1), (2, 2, 2)]


engine_times = steptime.engine_step_times  # the engine's path, no scalar shortcut


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_scalar_program_is_the_engine_bit_for_bit(name):
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    tried = 0
    for stages, micro, chunks in SHAPES:
        for comm in (0.0, float(rng.random() * 0.05)):
            try:
                shape = steptime.timing_shape(name, stages, micro, chunks, comm_s=comm)
            except BubblecastError:
                continue
            n = steptime.shape_graph(shape).graph.n_ops
            d = rng.random((3, n)) * rng.choice([1e-3, 1.0, 30.0])
            d[:, rng.integers(n)] = 0.0  # a zero-length op
            assert steptime._scalar_times(steptime.shape_graph(shape).graph, stages, d,
                                          comm) is not None
            got = steptime.step_times(shape, d)
            want = engine_times(shape, d)
            np.testing.assert_array_equal(got[0], want[0])
            np.testing.assert_array_equal(got[1], want[1])
            tried += 1
    assert tried >= 3


def test_service_shapes_take_the_scalar_path_and_large_ones_the_engine():
    shape = steptime.timing_shape("1f1b", 4, 8)
    d = steptime.stage_op_durations(shape, np.ones((3, 4)))
    graph = steptime.shape_graph(shape).graph
    assert steptime._scalar_times(graph, 4, d, 0.0) is not None
    big = np.ones((steptime.SCALAR_MAX_CELLS // d.shape[1] + 1, d.shape[1]))
    assert steptime._scalar_times(graph, 4, big, 0.0) is None
    bad = d.copy()
    bad[0, 3] = np.nan
    assert steptime._scalar_times(graph, 4, bad, 0.0) is None  # the engine decides
    bad[0, 3] = -1.0
    with pytest.raises(ValueError):  # the engine's own refusal, unchanged
        steptime.step_times(shape, bad)


def test_scalar_program_of_a_hand_graph():
    """Two lanes, a lagged dependency: op 2 starts at max(end of op 1, end of op 0 + 2c)."""
    g = OpGraph(rank=[0, 1, 1], prev=[-1, -1, 1], deps=[[0, 2]], dep_lag=[2.0])
    program = steptime.scalar_program(g)
    first, last = program([1.0, 0.5, 0.25], 0.1)
    assert (first, last) == (0.0, 1.0 + 2.0 * 0.1 + 0.25)
    g2 = OpGraph(rank=[0, 0], prev=[1, 0])
    with pytest.raises(ValueError, match="cycle"):
        steptime.scalar_program(g2)
