"""The exact best plan of a step (policy/work_optimum.py): checked against every plan of small
steps, timed by the engine, and against the planner on a realistic one."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from bubblecast.errors import BubblecastError
from bubblecast.policy.work_optimum import optimal_step
from bubblecast.policy.work_plan import PlanConfig, plan_batch, plan_static
from bubblecast.policy.work_timing import time_replicas
from bubblecast.sim.documents import WorkCost, microbatch_stats

COST = WorkCost(per_token=1e-3, per_token_sq=4e-6, per_document=2e-3, per_microbatch=5e-3)


def _every_plan(x: np.ndarray, m: int, budget: int, cost: WorkCost, kinds: np.ndarray,
                schedule: str, stages: int, chunks: int, comm_s: float) -> float:
    """The fastest of every assignment of ``x`` to ``m`` non-empty micro-batches within the
    budget, timed by the engine."""
    rows = []
    for slots in itertools.product(range(m), repeat=len(x)):
        s = np.asarray(slots)
        tokens, sq, docs = microbatch_stats(x, s, m)
        if (docs == 0).any() or (tokens > budget).any():
            continue
        rows.append(cost.microbatch(tokens, sq, docs))
    kind = np.broadcast_to(kinds, (len(rows),) + kinds.shape)
    window, _ = time_replicas(schedule, stages, chunks, comm_s, rows, kind)
    return float(window.min())


@pytest.mark.parametrize(("schedule", "stages", "m", "chunks", "comm_s", "seed"), [
    ("1f1b", 2, 3, 1, 0.0, 0),
    ("1f1b", 3, 3, 1, 0.002, 1),
    ("gpipe", 2, 3, 1, 0.001, 2),
    ("zb-h1", 2, 3, 1, 0.0, 3),
    ("interleaved", 2, 2, 2, 0.001, 4),
])
def test_the_optimum_is_the_fastest_of_every_plan(schedule, stages, m, chunks, comm_s, seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(20, 400, size=7)
    budget = int(x.sum() // (m - 1))  # tight enough that the budget binds
    kinds = rng.uniform(0.5, 2.0, size=(stages * chunks, 3))
    if schedule in ("1f1b", "gpipe", "interleaved"):
        kinds[:, 2] *= 0.3
    best = _every_plan(x, m, budget, COST, kinds, schedule, stages, chunks, comm_s)
    got = optimal_step(x, m, budget, COST, kinds, schedule, stages, chunks, comm_s, 20.0)
    assert got.proven
    assert got.best_s == pytest.approx(best, rel=1e-6)
    assert got.bound_s <= got.best_s and got.bound_s >= best * (1 - 1e-4)  # HiGHS's gap
    # the plan it returns is one: every micro-batch non-empty, within the budget, and it
    # times to the reported step
    tokens, sq, docs = microbatch_stats(x, got.slots, m)
    assert (docs > 0).all() and (tokens <= budget).all()
    window, _ = time_replicas(schedule, stages, chunks, comm_s,
                              [COST.microbatch(tokens, sq, docs)], kinds[None])
    assert window[0] == pytest.approx(got.best_s, rel=1e-6)


def test_no_plan_beats_it_and_it_beats_the_planner_on_a_realistic_step():
    """A documents-setting step (2 stages, 4 micro-batches, a 4096-token budget, documents up
    to a quarter of it): the loader's plan and the planner's are no faster than the bound."""
    rng = np.random.default_rng(7)
    x = np.clip(rng.lognormal(5.5, 1.0, size=60).astype(np.int64), 16, 1024)
    x = x[np.cumsum(x) <= 4 * 4096 - 200]
    config = PlanConfig(4096, 1, 4, 2, kind_weights=(1.0, 2.0, 0.0))
    kinds = np.array([[1.0, 2.0, 0.0], [1.1, 2.1, 0.0]]) / 3.0
    cost = WorkCost(per_token=4.5e-6, per_token_sq=5.7e-9)
    got = optimal_step(x, 4, 4096, cost, kinds, "1f1b", 2, time_limit_s=20.0)
    for plan in (plan_static(x, config, cost), plan_batch(x, config, cost)):
        window, _ = time_replicas("1f1b", 2, 1, 0.0, [np.asarray(plan.cost[0])], kinds[None])
        assert got.bound_s <= window[0] * (1 + 1e-9)
    assert got.gap < 1e-3


def test_steps_without_a_plan_are_refused_in_one_line():
    kinds = np.ones((2, 3))
    with pytest.raises(BubblecastError, match="no plan into 4 non-empty micro-batches"):
        optimal_step(np.array([10, 10, 10]), 4, 100, COST, kinds, "1f1b", 2)
    with pytest.raises(BubblecastError, match="longest 200 tokens"):
        optimal_step(np.array([200, 10, 10, 10]), 2, 100, COST, kinds, "1f1b", 2)
    with pytest.raises(BubblecastError, match=r"kinds: expected shape \(2, 3\)"):
        optimal_step(np.array([10, 10, 10]), 2, 100, COST, np.ones((3, 3)), "1f1b", 2)
