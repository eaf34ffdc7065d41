"""PolicyState with a per-rank fixed cost: stage load, solver problem and engine timing."""

from __future__ import annotations

import numpy as np

from bubblecast.policy.cost import MigrationConstants, MigrationCost
from bubblecast.policy.state import PolicyState
from bubblecast.sim.steptime import predicted_step, timing_shape

PIPE = timing_shape("1f1b", stages=2, microbatches=4)
COSTS = np.tile([[0.27e-3, 0.53e-3, 0.0]], (12, 1))  # the live benchmark's layers (s per mb)
MIG = MigrationCost(np.full(12, 1e6), MigrationConstants())
PARTS = [(n, 12 - n) for n in range(5, 12)]


def state(fixed=None, pipe=PIPE) -> PolicyState:
    return PolicyState(t=50, history=np.ones((51, 2)), partition=(6, 6), costs=COSTS,
                       pipeline=pipe, migration=MIG, fixed=fixed)


def test_without_a_fixed_cost_the_state_times_as_the_engine_does() -> None:
    speeds = np.array([[1.0, 2.0], [1.0, 1.5]])
    mine, _ = state().predicted_step(PARTS, speeds)
    assert np.array_equal(mine, predicted_step(PIPE, PARTS, COSTS, speeds)[0])
    assert np.allclose(state().stage_load((8, 4)), COSTS.sum(axis=1)[0] * np.array([8, 4]))


def test_a_fixed_cost_is_timed_as_a_layer_each_stage_keeps() -> None:
    """Fixed cost x per stage == the engine on a model with one more layer of cost x per stage
    (each stage's extra layer pinned to it), under any speeds."""
    x = 0.5e-3
    speeds = np.array([[1.0, 2.0], [1.3, 1.0]])
    mine, _ = state(np.full(2, x)).predicted_step(PARTS, speeds)
    share = COSTS.sum(axis=0) / COSTS.sum()
    for k, (a, b) in enumerate(PARTS):
        costs = np.vstack([COSTS[:a], share * x, COSTS[a:], share * x])
        ref, _ = predicted_step(PIPE, [(a + 1, b + 1)], costs, speeds)
        assert np.allclose(mine[k], ref[0], rtol=1e-12)
    assert np.allclose(state(np.full(2, x)).stage_load((9, 3)),
                       COSTS.sum(axis=1)[0] * np.array([9, 3]) + x)


def test_with_the_runtime_fixed_cost_the_best_split_under_a_2x_slowdown_is_9_3() -> None:
    """The live runtime's numbers (0.8 ms per layer, 0.5 ms fixed per micro-batch, rank 1 2x
    slower): the solver's problem and the engine agree on 9|3; compute-only, the solver's
    bottleneck answer is 8|4."""
    from bubblecast.policy.solver import candidates, solve

    slow = np.array([1.0, 2.0])
    fixed = state(np.full(2, 0.5e-3))
    step, _ = fixed.predicted_step(PARTS, slow[None, :])
    assert PARTS[int(np.argmin(step[:, 0]))] == (9, 3)
    assert (9, 3) in candidates(fixed.problem(slow), current=(6, 6))
    assert solve(state().problem(slow)) == (8, 4)
    assert (9, 3) not in candidates(state().problem(slow), current=(6, 6))


def test_fixed_cost_splits_over_a_rank_s_chunks() -> None:
    pipe = timing_shape("interleaved", stages=2, microbatches=4, chunks=2)
    s = state(np.array([1.0, 3.0]), pipe=pipe)
    assert np.allclose(s.vfixed(), [0.5, 1.5, 0.5, 1.5])
    assert np.allclose(s.problem(np.ones(2)).fixed, [0.5, 1.5, 0.5, 1.5])


def test_the_live_predictive_scores_the_neighbours_and_aims_at_9_3_in_one_move() -> None:
    """Rank 1 forecast 1.9x slower (the thermal lead's estimate), no fixed cost: the
    bottleneck's 8|4 and its slack candidates miss 9|3, the engine's best; with the
    neighbours scored the policy moves 6|6 -> 9|3 directly."""
    from bubblecast.policy.policies import PredictivePolicy

    class Flat:
        name = "flat"

        def forecast(self, state, horizons):
            return np.tile(np.array([1.0, 1.9])[None, :, None], (len(horizons), 1, 3))

    def decide(neighbours: bool):
        s = PolicyState(t=50, history=np.tile([1.0, 1.9], (51, 1)), partition=(6, 6),
                        costs=COSTS, pipeline=PIPE, migration=MIG)
        p = PredictivePolicy(forecaster=Flat(), guard={"enabled": False, "confirm": 1},
                             neighbours=neighbours)
        return p.decide(s).action.partition

    assert PredictivePolicy().neighbours  # the default, offline as live
    assert tuple(decide(True)) == (9, 3)
    assert tuple(decide(False)) == (8, 4)  # the solver's candidates alone
