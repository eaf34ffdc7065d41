"""Move timing (``PredictivePolicy.timing``, :func:`bubblecast.policy.viterbi.first_move`): a
move the forecast's least-time path makes later waits; a partition it passes through first is
taken first. The live loop turns it on for thermal-lead decisions."""

from __future__ import annotations

import numpy as np

from bubblecast.policy.cost import MigrationConstants, MigrationCost
from bubblecast.policy.policies import PredictivePolicy
from bubblecast.policy.state import PolicyState, horizon_grid
from bubblecast.policy.viterbi import first_move
from bubblecast.sim.shape import PipelineShape

HZ, WEIGHT = horizon_grid(64)  # 1, 2, 4, ..., 64: 7 points
CHEAP = np.full((3, 3), 0.1) - 0.1 * np.eye(3)


def _steps(*rows: list[float]) -> np.ndarray:
    return np.array(rows, dtype=np.float64)


def test_a_move_that_pays_from_now_is_made_now() -> None:
    step = _steps([1.0] * 7, [0.8] * 7, [0.9] * 7)
    assert first_move(step, WEIGHT, HZ, CHEAP) == (1, 1)


def test_a_move_that_pays_only_later_waits_and_says_when() -> None:
    # option 1 is 1.3 up to step 8, 0.7 from step 16: interpolated, it passes 1.0 at step 12
    step = _steps([1.0] * 7, [1.3, 1.3, 1.3, 1.3, 0.7, 0.7, 0.7], [1.5] * 7)
    assert first_move(step, WEIGHT, HZ, CHEAP) == (0, 13)
    assert first_move(step, WEIGHT, HZ, CHEAP, every=10) == (0, 11)  # decisions at 1, 11, 21


def test_a_move_due_before_the_next_decision_is_made_now() -> None:
    step = _steps([1.0] * 7, [1.2, 1.2, 1.0, 0.6, 0.6, 0.6, 0.6], [1.5] * 7)  # 1.0 at step 4
    assert first_move(step, WEIGHT, HZ, CHEAP) == (0, 5)
    assert first_move(step, WEIGHT, HZ, CHEAP, every=3) == (0, 4)
    assert first_move(step, WEIGHT, HZ, CHEAP, every=10) == (1, 1)  # step 11 would be late


def test_only_the_steps_the_payback_counts_are_planned() -> None:
    step = _steps([1.0] * 7, [1.3, 1.3, 1.3, 1.3, 0.7, 0.7, 0.7], [1.5] * 7)
    assert first_move(step, np.clip(10 - (HZ - WEIGHT), 0, WEIGHT), HZ, CHEAP) == (0, 0)
    assert first_move(step, np.zeros(len(HZ)), HZ, CHEAP) == (0, 0)


def test_an_intermediate_partition_is_taken_first() -> None:
    # option 1 a little faster now, option 2 much faster once the slowdown has ramped in
    step = _steps([1.0] * 7, [0.9, 0.9, 0.9, 0.9, 0.9, 0.8, 0.8],
                  [1.2, 1.2, 1.2, 1.2, 0.9, 0.5, 0.5])
    assert first_move(step, WEIGHT, HZ, CHEAP)[0] == 1


def test_a_move_that_never_pays_its_migration_is_not_made() -> None:
    step = _steps([1.0] * 7, [0.99] * 7, [1.0] * 7)
    assert first_move(step, WEIGHT, HZ, 100.0 * (1 - np.eye(3))) == (0, 0)  # 0: never


class _SlowFrom:
    """Forecasts rank 3 twice as slow from horizon ``at`` on, every rank at 1 before."""

    name = "slow-from"

    def __init__(self, at: int) -> None:
        self.at = at

    def forecast(self, state: PolicyState, horizons: np.ndarray) -> np.ndarray:
        q = np.ones((len(horizons), 4, 3))
        q[np.asarray(horizons) >= self.at, 3, :] = 2.0
        return q


def test_the_policy_defers_an_announced_slowdown_only_with_timing_on() -> None:
    hist = np.exp(np.random.default_rng(0).normal(0, 0.01, size=(120, 4)))
    state = PolicyState(len(hist) - 1, hist, (4, 4, 4, 4), np.ones((16, 3)),
                        PipelineShape("1f1b", 4, 8),
                        MigrationCost(np.zeros(16), MigrationConstants()))
    guard = {"enabled": False, "persistence": False}  # as the live loop's lead decisions
    decide = {(at, timing): PredictivePolicy(forecaster=_SlowFrom(at), guard=guard,
                                             timing=timing).decide(state)
              for at in (1, 32) for timing in (False, True)}
    assert decide[1, False].acts and decide[1, True].action == decide[1, False].action
    assert decide[32, False].acts  # without timing: the full slowdown's split, 31 steps early
    late = decide[32, True]
    assert not late.acts and "best path moves in" in late.reason
    assert 17 <= int(late.reason.split(" in ")[1].split()[0]) <= 32  # the slowdown ramps in
