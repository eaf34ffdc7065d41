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


def _moved_layers(old_rank, new_rank) -> int:
    return sum(int(old_rank(layer) != new_rank(layer)) for layer in range(16))


def test_a_switch_prices_the_layers_whose_rank_changes():
    """1F1B with 4 layers a rank -> zbv (2 layers a virtual stage, rank r holds virtual
    stages r and 7 - r) or interleaved (v on rank v % 4): the pause is the bytes of the
    layers that change rank, counted here layer by layer, over the bandwidth plus the pause."""
    st = _state()
    per_layer = 1e6 * (1 + CHEAP.constants.optimizer_factor)
    want = {
        "zbv": _moved_layers(lambda x: x // 4, lambda x: x // 2 if x // 2 < 4 else 7 - x // 2),
        "interleaved": _moved_layers(lambda x: x // 4, lambda x: (x // 2) % 4),
        "zb-h1": 0, "1f1b": None,
    }
    options = {o.shape.schedule: o for o in schedule_options(st, np.ones(4))}
    assert want["zbv"] == 12 and want["interleaved"] == 12
    for name, moved in want.items():
        got = options[name].migration_s
        if moved is None:  # the current plan: nothing to pay
            assert got == 0.0
        else:  # a switch always pays the fixed pause (the schedule is rebuilt)
            assert got == pytest.approx(moved * per_layer / 1e10 + 0.01), name
    # Back from zbv to 1F1B moves the same layers back.
    back = {o.shape.schedule: o for o in schedule_options(_state("zbv", 2, (2,) * 8),
                                                          np.ones(4))}
    assert back["1f1b"].migration_s == pytest.approx(options["zbv"].migration_s)
    decision = choose_schedule(st, np.ones(4), activation_cap=4.0)
    assert decision.migration_s == pytest.approx(options[decision.action.schedule].migration_s)


def test_a_v_shape_cost_moves_layers_between_ranks_not_virtual_stages():
    """Under zbv, virtual stages 3 and 4 are both rank 3: a layer moving between them ships
    nothing, while the looped reading (4 % 4 = rank 0) would ship it."""
    shape = timing_shape("zbv", stages=4, microbatches=8, chunks=2)
    cost = MigrationCost.for_shape(np.full(16, 1e6), CHEAP.constants, shape)
    assert cost.placement == (0, 1, 2, 3, 3, 2, 1, 0)
    old, new = (2,) * 8, (2, 2, 2, 1, 3, 2, 2, 2)
    assert cost.bytes_moved(old, new) == 0.0
    looped = MigrationCost(np.full(16, 1e6), CHEAP.constants, ranks=4)
    assert looped.bytes_moved(old, new) == pytest.approx(1e6 * 7)
    assert cost.seconds(old, new) == pytest.approx(0.01)  # the pause only
    # Interleaved keeps the looped placement; one chunk needs none.
    inter = timing_shape("interleaved", stages=4, microbatches=8, chunks=2)
    assert CHEAP.placed(inter).placement == (0, 1, 2, 3, 0, 1, 2, 3)
    assert CHEAP.placed(timing_shape("1f1b", stages=4, microbatches=8)) is CHEAP
