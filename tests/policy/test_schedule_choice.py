"""SetSchedule within an activation-memory cap (bubblecast.policy.schedule_choice)."""

from __future__ import annotations

import numpy as np
import pytest

from bubblecast.policy.actions import NoOp, SetSchedule
from bubblecast.policy.cost import MigrationConstants, MigrationCost
from bubblecast.policy.schedule_choice import (
    SchedulePolicy,
    choose_schedule,
    rank_layers,
    schedule_options,
)
from bubblecast.policy.state import PolicyState
from bubblecast.sim.memory import schedule_peak
from bubblecast.sim.steptime import timing_shape

COSTS = np.tile([[0.01, 0.01, 0.005]], (16, 1))
CHEAP = MigrationCost(np.full(16, 1e6), MigrationConstants(bandwidth_Bps=1e10, fixed_pause_s=0.01))


def _state(schedule: str = "1f1b", chunks: int = 1, partition=(4, 4, 4, 4)) -> PolicyState:
    pipe = timing_shape(schedule, stages=4, microbatches=8, chunks=chunks)
    return PolicyState(0, np.ones((1, 4)), tuple(partition), COSTS, pipe, CHEAP)


def test_every_option_fits_the_cap_and_keeps_each_ranks_layers():
    st = _state()
    for cap in (4.0, 7.0, None):
        options = schedule_options(st, np.ones(4), cap)
        names = {o.shape.schedule for o in options}
        assert "1f1b" in names and ("gpipe" in names) == (cap is None or cap >= 8)
        for o in options:
            assert cap is None or o.peak_activations <= cap
            assert o.peak_activations == schedule_peak(o.shape.schedule, 4, 8, o.shape.chunks)
            assert rank_layers(o.shape, o.partition) == [4, 4, 4, 4]


def test_switches_to_a_faster_schedule_within_the_cap_only():
    st = _state()
    free = choose_schedule(st, np.ones(4), activation_cap=4.0)
    assert isinstance(free.action, SetSchedule)
    assert free.predicted_step_with_action_s < free.predicted_step_s
    chosen = free.action.schedule
    assert schedule_peak(chosen, 4, 8, 2 if chosen in ("zbv", "dualpipev", "interleaved",
                                                       "zb-interleaved", "looped-bfs") else 1) <= 4
    tight = choose_schedule(st, np.ones(4), activation_cap=0.5)
    assert isinstance(tight.action, NoOp) and "fits" in tight.reason


def test_runnable_only_never_picks_a_simulation_only_schedule():
    st = _state()
    for o in schedule_options(st, np.ones(4), None, runnable_only=True):
        assert o.shape.schedule != "zb-h2"


def test_policy_decides_from_the_last_speeds_and_keeps_when_already_best():
    st = _state()
    first = SchedulePolicy(activation_cap=4.0).decide(st)
    assert isinstance(first.action, SetSchedule)
    name = first.action.schedule
    chunks = 2 if name in ("zbv", "dualpipev", "interleaved", "zb-interleaved",
                           "looped-bfs") else 1
    part = (2, 2, 2, 2, 2, 2, 2, 2) if chunks == 2 else (4, 4, 4, 4)
    again = SchedulePolicy(activation_cap=4.0).decide(_state(name, chunks, part))
    assert isinstance(again.action, NoOp)


def test_v_shape_speeds_follow_the_placement():
    st = _state("zbv", 2, (2,) * 8)
    assert st.vspeed(np.array([1.0, 2.0, 3.0, 4.0])).tolist() == [1, 2, 3, 4, 4, 3, 2, 1]
    assert _state("interleaved", 2, (2,) * 8).vspeed(np.arange(4.0)).tolist() == \
        [0, 1, 2, 3, 0, 1, 2, 3]


@pytest.mark.parametrize("slow_rank", [0, 3])
def test_options_see_a_slow_rank(slow_rank):
    speed = np.ones(4)
    speed[slow_rank] = 2.0
    fast = {o.shape.schedule: o.step_s for o in schedule_options(_state(), np.ones(4))}
    slow = {o.shape.schedule: o.step_s for o in schedule_options(_state(), speed)}
    assert all(slow[n] > fast[n] for n in fast)
