"""The planner's polish (policy/work_polish.py): single-document moves within a replica that
never break a plan and never lengthen its predicted step."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bubblecast.errors import BubblecastError
from bubblecast.policy.work_plan import PlanConfig, plan_batch
from bubblecast.policy.work_polish import polish
from bubblecast.policy.work_timing import predicted_plan_step, time_replicas
from bubblecast.sim.documents import WorkCost, microbatch_stats

COST = WorkCost(per_token=4.5e-6, per_token_sq=5.7e-9, per_document=2e-5, per_microbatch=1e-4)
KINDS = np.array([[0.35, 0.65, 0.0], [0.4, 0.7, 0.0]])  # two stages' F, B, W per unit


def _timer(rows: np.ndarray) -> np.ndarray:
    """1F1B step seconds of rows of micro-batch costs."""
    kinds = np.broadcast_to(KINDS, (len(rows),) + KINDS.shape)
    return time_replicas("1f1b", 2, 1, 0.0, list(rows), kinds)[0]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 1024), min_size=5, max_size=40), st.integers(2, 5),
       st.integers(0, 10_000), st.floats(1.0, 1.5))
def test_polish_keeps_the_plan_valid_and_never_slower(lengths, m, seed, slack):
    x = np.random.default_rng(seed).permutation(np.asarray(lengths))
    slot = np.arange(len(x)) % m  # every micro-batch holds a document
    budget = int(np.bincount(slot, x, m).max() * slack)  # binds at slack 1
    a = COST.documents_cost(x)
    timer = _timer
    before = float(timer((np.bincount(slot, a, m) + COST.per_microbatch)[None, :])[0])
    out, after = polish(slot, x, a, m, budget, COST.per_microbatch, timer, rounds=8)
    tokens, sq, docs = microbatch_stats(x, out, m)
    assert len(out) == len(x) and (docs > 0).all() and (tokens <= budget).all()
    assert after <= before * (1 + 1e-12)
    again = float(timer(COST.microbatch(tokens, sq, docs)[None, :])[0])
    assert again == pytest.approx(after, rel=1e-9)


def test_polish_shortens_the_planned_step_of_packed_documents():
    """On lognormal documents at a 4096-token budget (2 stages, 4 micro-batches) the polished
    plans are predicted faster on the mean, and never slower on a step."""
    rng = np.random.default_rng(0)
    on, off = [], []
    for _ in range(12):
        x = np.clip(rng.lognormal(5.5, 1.0, size=80).astype(np.int64), 16, 1024)
        x = x[np.cumsum(x) <= 4 * 4096 - 300]
        for rounds, out in ((8, on), (0, off)):
            config = PlanConfig(4096, 1, 4, 2, kind_weights=(1.0, 2.0, 0.0),
                                polish_rounds=rounds)
            out.append(plan_batch(x, config, COST).predicted_step)
    on_, off_ = np.asarray(on), np.asarray(off)
    assert (on_ <= off_ * (1 + 1e-12)).all()
    assert on_.mean() < off_.mean() * 0.999


def test_only_the_replicas_that_set_the_step_are_polished():
    """4 replicas, one 1.5x slower: a replica whose micro-batches the polish changed was,
    unpolished, at least as slow as the polished plan's step (it set the step when its turn
    came; a faster one cannot shorten the step); the step is never slower than unpolished and
    faster on the mean."""
    rng = np.random.default_rng(1)
    speeds = np.array([1.0, 1.0, 1.5, 1.0])
    on, off, changed = [], [], 0
    for _ in range(8):
        x = np.clip(rng.lognormal(5.5, 1.0, size=400).astype(np.int64), 16, 1024)
        x = x[np.cumsum(x) <= 16 * 4096 - 1200]
        plans = {}
        for rounds in (8, 0):
            config = PlanConfig(4096, 4, 4, 2, kind_weights=(1.0, 2.0, 0.0),
                                polish_rounds=rounds)
            plans[rounds] = plan_batch(x, config, COST, speeds)
        on.append(plans[8].predicted_step)
        off.append(plans[0].predicted_step)
        for r in range(4):
            if plans[8].microbatches[r] != plans[0].microbatches[r]:
                changed += 1
                alone = predicted_plan_step("1f1b", 2, [plans[0].cost[r]],
                                            np.full((1, 2), speeds[r]), (1.0, 2.0, 0.0))
                assert alone >= plans[8].predicted_step * (1 - 1e-9), (r, alone)
    on_, off_ = np.asarray(on), np.asarray(off)
    assert changed >= 8  # the polish did move documents
    assert (on_ <= off_ * (1 + 1e-12)).all()
    assert on_.mean() < off_.mean() * 0.999


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_polish_rounds_must_be_a_count(bad):
    with pytest.raises(BubblecastError, match="polish_rounds: must be an integer >= 0"):
        PlanConfig(4096, polish_rounds=bad)
