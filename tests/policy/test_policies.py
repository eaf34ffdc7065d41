"""Policies: what each decides on hand-made histories, hysteresis, infeasible requests."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bubblecast.errors import BubblecastError
from bubblecast.policy.actions import NoOp, Repartition
from bubblecast.policy.cost import MigrationConstants, MigrationCost
from bubblecast.policy.policies import (
    PolicyState,
    PredictivePolicy,
    ReactivePolicy,
    StaticPolicy,
    make_policy,
    viterbi,
)
from bubblecast.sim.steptime import predicted_step, timing_shape

PIPE = timing_shape("1f1b", stages=4, microbatches=8)
COSTS = np.tile([[0.01, 0.01, 0.005]], (16, 1))  # 16 equal layers, seconds per microbatch
CHEAP = MigrationCost(np.full(16, 1e6), MigrationConstants(bandwidth_Bps=1e10, fixed_pause_s=0.01))


def state(history: np.ndarray, partition=(4, 4, 4, 4), last=None, migration=CHEAP, **kw):
    h = np.asarray(history, dtype=float)
    return PolicyState(len(h) - 1, h, tuple(partition), COSTS, PIPE, migration, last, **kw)


def action_of(policy, st):
    """The action of the policy's Decision."""
    return policy.decide(st).action


def slow_rank(steps: int, factor: float, rank: int = 2, onset: int = 0) -> np.ndarray:
    h = np.ones((steps, 4))
    h[onset:, rank] = factor
    return h


def test_static_never_acts():
    assert isinstance(action_of(StaticPolicy(), state(slow_rank(50, 3.0))), NoOp)


def test_reactive_rebalances_a_persistent_slow_rank_then_cools_down():
    pol = ReactivePolicy(window=10)
    assert isinstance(action_of(pol, state(slow_rank(5, 2.0))), NoOp)  # not enough history yet
    act = action_of(pol, state(slow_rank(20, 2.0)))
    assert isinstance(act, Repartition)
    assert act.partition[2] < 4 and sum(act.partition) == 16
    assert isinstance(action_of(pol, state(slow_rank(20, 2.0), act.partition, last=15)), NoOp)
    # Balanced already: nothing to do.
    assert isinstance(action_of(pol, state(np.ones((20, 4)))), NoOp)


def test_predictive_moves_on_a_foreseeable_drift_before_reactive():
    t = np.arange(120)
    h = np.ones((120, 4))
    h[:, 1] = 1.0 + 0.006 * np.clip(t - 20, 0, None)  # a throttle ramping up from step 20

    def first_move(pol):
        for end in range(21, 120):
            act = action_of(pol, state(h[:end]))
            if isinstance(act, Repartition):
                assert act.partition[1] < 4
                return end
        return None

    reactive, predictive = first_move(ReactivePolicy()), first_move(PredictivePolicy())
    assert predictive is not None and reactive is not None
    assert predictive < reactive


def test_predictive_holds_and_respects_migration_cost():
    h = slow_rank(40, 1.5)
    pol = PredictivePolicy(hold=5, guard={"confirm": 1})  # one decision: no confirmation
    assert isinstance(action_of(pol, state(h)), Repartition)
    held = action_of(pol, state(h, last=37))
    assert isinstance(held, NoOp) and "hysteresis" in held.reason
    dear = MigrationCost(np.full(16, 1e9), MigrationConstants(bandwidth_Bps=1e6))
    refused = action_of(pol, state(h, migration=dear))
    assert isinstance(refused, NoOp) and "migration" in refused.reason


def test_predictive_ignores_noise():
    rng = np.random.default_rng(4)
    pol = PredictivePolicy()
    for k in range(20):
        h = 1.0 + 0.02 * rng.standard_normal((60 + k, 4))
        assert isinstance(action_of(pol, state(h)), NoOp)


def test_infeasible_memory_cap_gives_noop_with_reason():
    memory = np.full(16, 10.0)
    h = slow_rank(40, 2.0)
    for pol in (ReactivePolicy(), PredictivePolicy()):
        act = action_of(pol, state(h, memory=memory, memory_cap=30.0))  # 4 x 30 < 160 bytes
        assert isinstance(act, NoOp) and "memory_cap" in act.reason


def test_memory_cap_is_respected():
    memory = np.full(16, 10.0)
    act = action_of(ReactivePolicy(), state(slow_rank(40, 3.0), memory=memory, memory_cap=50.0))
    assert isinstance(act, Repartition) and max(act.partition) <= 5


def test_make_policy_names_the_known_ones():
    assert make_policy("static").name == "static"
    with pytest.raises(BubblecastError, match="unknown policy 'magic'.*static"):
        make_policy("magic")


def test_predicted_step_counts_bubbles_not_only_the_bottleneck():
    # Same bottleneck (stage time 4 units), different fill: the engine tells them apart.
    parts = [(4, 4, 4, 4), (4, 4, 4, 4)]
    step, bubble = predicted_step(PIPE, parts, COSTS, np.ones((1, 4)))
    assert step.shape == (2, 1) and step[0, 0] == pytest.approx(step[1, 0])
    unit = 4 * 0.025  # one microbatch through one stage (F + B + W)
    assert step[0, 0] == pytest.approx((8 + 3) * unit)  # (m + p - 1) x stage time for 1F1B
    assert bubble[0, 0] == pytest.approx(3 / 11)
    light_ends = predicted_step(PIPE, [(3, 5, 5, 3)], COSTS, np.ones((1, 4)))[0]
    heavy_ends = predicted_step(PIPE, [(5, 3, 3, 5)], COSTS, np.ones((1, 4)))[0]
    assert light_ends[0, 0] != pytest.approx(heavy_ends[0, 0])


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3), st.integers(1, 5), st.data())
def test_viterbi_is_the_best_path(k, T, data):
    times = np.array(data.draw(st.lists(st.lists(st.integers(1, 9), min_size=T, max_size=T),
                                        min_size=k, max_size=k)), dtype=float)
    mig = np.array(data.draw(st.lists(st.lists(st.integers(0, 5), min_size=k, max_size=k),
                                      min_size=k, max_size=k)), dtype=float)
    np.fill_diagonal(mig, 0.0)
    path = viterbi(times, mig, start=0)

    def total(p):
        return sum(times[p[t], t] + (mig[p[t - 1], p[t]] if t else 0.0) for t in range(T))

    best = min(total(p) for p in itertools.product(range(k), repeat=T) if p[0] == 0)
    assert path[0] == 0 and total(path) == pytest.approx(best)


def test_decisions_carry_the_numbers_the_policy_computed():
    h = slow_rank(40, 1.5)
    moved = PredictivePolicy(hold=5, guard={"confirm": 1}).decide(state(h))
    assert isinstance(moved.action, Repartition) and moved.reason.startswith("stage 2 forecast")
    assert moved.predicted_step_with_action_s < moved.predicted_step_s
    assert moved.migration_s == pytest.approx(CHEAP.seconds((4, 4, 4, 4), moved.action.partition))
    held = PredictivePolicy(hold=5).decide(state(h, last=37))
    assert held.action == NoOp(reason=held.reason) and held.predicted_step_s is None
    reactive = ReactivePolicy(window=10).decide(state(slow_rank(20, 2.0)))
    step, _ = predicted_step(PIPE, [(4, 4, 4, 4), reactive.action.partition], COSTS,
                             np.array([[1.0, 1.0, 2.0, 1.0]]))
    assert reactive.predicted_step_s == pytest.approx(step[0, 0])
    assert reactive.predicted_step_with_action_s == pytest.approx(step[1, 0])
    assert StaticPolicy().decide(state(h)).to_json()["predicted_step_s"] is None
