"""Peak in-flight activations from the op order (bubblecast.sim.memory)."""

from __future__ import annotations

import numpy as np
import pytest

from bubblecast.sim.memory import in_flight, peak_activations, schedule_peak
from bubblecast.sim.schedules import SCHEDULES, SIMULABLE, build_schedule

SHAPES = [(2, 4), (4, 8), (4, 12), (8, 24)]


@pytest.mark.parametrize(("p", "m"), SHAPES + [(4, 2)])
def test_textbook_peaks(p, m):
    assert peak_activations(build_schedule("gpipe", p, m)).tolist() == [m] * p
    assert peak_activations(build_schedule("1f1b", p, m)).tolist() == \
        [min(p - r, m) for r in range(p)]
    assert peak_activations(build_schedule("looped-bfs", p, m, 2)).tolist() == [m] * p
    zb_h2 = peak_activations(build_schedule("zb-h2", p, m))
    assert zb_h2.max() <= 2 * p - 1 and zb_h2[0] == min(2 * p - 1, m)


@pytest.mark.parametrize(("p", "m"), SHAPES)
def test_zbv_has_1f1b_memory(p, m):
    """The V-shape schedule's point: 1F1B's peak (P microbatches) at a fraction of its bubble."""
    assert schedule_peak("zbv", p, m) == schedule_peak("1f1b", p, m) == min(p, m)


def test_chunks_count_as_fractions_of_a_microbatch():
    """Megatron interleaving holds (P-1)*2 + (V-1)*P + 1 chunk-forwards on rank 0 at most."""
    p, m, v = 8, 24, 3
    peaks = peak_activations(build_schedule("interleaved", p, m, v))
    assert peaks[0] == pytest.approx(((p - 1) * 2 + (v - 1) * p + 1) / v)


@pytest.mark.parametrize("name", SIMULABLE)
def test_every_schedule_starts_and_ends_empty(name):
    v = 2 if SCHEDULES[name].multi_chunk else 1
    for curve in in_flight(build_schedule(name, 4, 8, v)):
        assert curve[-1] == 0 and curve.min() >= 0
        assert np.all(np.abs(np.diff(np.r_[0.0, curve])) <= 1 / v + 1e-12)
