"""Property tests of the per-step planner (policy/work_plan.py): whatever the lengths, replicas,
micro-batch counts, speeds and cost, a plan places each document exactly once, keeps every
micro-batch within the token budget and the step's micro-batch total."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from bubblecast.errors import BubblecastError
from bubblecast.policy.work_eval import check_plan
from bubblecast.policy.work_plan import TOKENS, PlanConfig, plan_batch, plan_static
from bubblecast.sim.documents import WorkCost, next_fit


def _placed_once_within_budget(plan, lengths: np.ndarray, config: PlanConfig) -> None:
    placed = sorted(i for rep in plan.microbatches for mb in rep for i in mb)
    assert placed == list(range(len(lengths)))
    assert sum(plan.counts) == config.total
    assert len(plan.counts) == config.replicas
    assert min(plan.counts) >= config.min_microbatches
    for rep in plan.microbatches:
        for mb in rep:
            assert int(lengths[list(mb)].sum()) <= config.token_budget
    assert [len(c) for c in plan.cost] == plan.counts


@st.composite
def steps(draw: st.DrawFn) -> tuple[np.ndarray, PlanConfig, np.ndarray, WorkCost]:
    """A step as the loader cuts it: a stream of lengths (1..budget) truncated to the
    documents that fill exactly ``replicas * microbatches`` micro-batches by first-fit."""
    budget = draw(st.sampled_from([64, 100, 256]))
    replicas = draw(st.integers(1, 4))
    microbatches = draw(st.integers(1, 6))
    stages = draw(st.integers(1, 4))
    total = replicas * microbatches
    big = draw(st.booleans())  # long-tail like: documents up to the whole budget
    top = budget if big else budget // 4
    stream = np.asarray(draw(st.lists(st.integers(1, top), min_size=1, max_size=4 * total)),
                        dtype=np.int64)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    while next_fit(stream, budget)[-1] < total:  # until it reaches past the last micro-batch
        stream = np.concatenate([stream, rng.integers(1, top + 1, 4 * total)])
    lengths = stream[next_fit(stream, budget) < total]
    speeds = np.asarray(draw(st.lists(st.floats(0.5, 3.0), min_size=replicas * stages,
                                      max_size=replicas * stages))).reshape(replicas, stages)
    cost = WorkCost(per_token=draw(st.floats(0.0, 2.0)),
                    per_token_sq=draw(st.floats(0.0, 0.05)),
                    per_document=draw(st.floats(0.0, 5.0)),
                    per_microbatch=draw(st.floats(0.1, 3.0)))
    config = PlanConfig(budget, replicas, microbatches, stages, "1f1b")
    return lengths, config, speeds, cost


@settings(max_examples=150, deadline=None)
@given(steps())
def test_plan_batch_places_every_document_once_within_the_budget(step):
    lengths, config, speeds, cost = step
    plan = plan_batch(lengths, config, cost, speeds)
    _placed_once_within_budget(plan, lengths, config)
    check_plan(plan, lengths, config, "hypothesis")  # the evaluator's own check agrees
    tokens = plan_batch(lengths, config, TOKENS, None, method="tokens")
    _placed_once_within_budget(tokens, lengths, config)


@settings(max_examples=100, deadline=None)
@given(steps())
def test_plan_static_is_the_loaders_first_fit_replica_by_replica(step):
    lengths, config, _, cost = step
    plan = plan_static(lengths, config, cost)
    _placed_once_within_budget(plan, lengths, config)
    owner = next_fit(lengths, config.token_budget)
    m = config.microbatches
    for r, rep in enumerate(plan.microbatches):
        for j, mb in enumerate(rep):
            assert list(mb) == np.flatnonzero(owner == r * m + j).tolist()


@settings(max_examples=60, deadline=None)
@given(steps(), st.sampled_from([1, 2]))
def test_rebalanced_counts_keep_the_step_total_and_the_schedule_rules(step, least):
    lengths, config, speeds, cost = step
    # with one stage a replica's time is its load alone, whatever its count: counts are free
    assume(config.microbatches >= least and config.stages >= 2)
    speeds = speeds.copy()
    speeds[0] = 2.5 * speeds.max()  # one replica much the slowest: counts move away from it
    config = PlanConfig(config.token_budget, config.replicas, config.microbatches,
                        config.stages, "1f1b", min_microbatches=least)
    plan = plan_batch(lengths, config, cost, speeds)
    _placed_once_within_budget(plan, lengths, config)
    if plan.fallback is None and config.replicas > 1:
        assert plan.counts[0] <= config.microbatches  # never more work on the slowest


def test_fewer_documents_than_microbatches_is_bad_input():
    config = PlanConfig(64, 2, 4, 2)
    with pytest.raises(BubblecastError, match="fewer than the 8 micro-batches"):
        plan_batch([10] * 7, config)
    with pytest.raises(BubblecastError, match="longer than the token budget 64"):
        plan_batch([10] * 7 + [65], config)


def test_light_ends_take_the_documents_cheapest_per_token():
    """One replica: the ends get the documents cheapest per token under the cost, not the
    shortest: with a per-document overhead, 10-token documents cost 6 per token against 1.5
    for 250-300-token ones, so they fill the middle micro-batches and the ends stay light."""
    x = np.array([250] * 8 + [10] * 60 + [300] * 4)
    x = x[np.random.default_rng(0).permutation(len(x))]
    config = PlanConfig(token_budget=1000, replicas=1, microbatches=4, stages=2)
    cost = WorkCost(per_token=1, per_token_sq=0.002, per_document=50)
    plan = plan_batch(x, config, cost, None)
    mbs = plan.microbatches[0]
    assert not any(x[i] == 10 for mb in (mbs[0], mbs[-1]) for i in mb)
    assert max(plan.cost[0][0], plan.cost[0][-1]) < min(plan.cost[0][1:-1])
