"""The live planner's worker (issue 25 item 3: the plan comes from off the training thread):
one step's plan and record in process, its failures as reasons, and the worker process
answering requests, reporting a worker that exited at once rather than after the timeout."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pytest

from bubblecast.policy.work_plan import plan_static
from bubblecast.runtime.document_loader import DocumentLoader
from bubblecast.runtime.plan_worker import PlanProcess, PlanWorker
from bubblecast.sim.documents import WorkCost

COST = WorkCost(per_token=1.0, per_token_sq=0.01, per_document=5.0, per_microbatch=0.0)


def _worker(method: str = "balance", cls: type[PlanWorker] = PlanWorker) -> PlanWorker:
    loader = DocumentLoader(budget=256, vocab=16, seed=3, replicas=2, microbatches=3, stages=2,
                            schedule="1f1b")
    return cls(method, loader, replace(loader.config, kind_weights=(0.4, 0.6, 0.0)), COST,
               None, np.array([2.0, 2.0]))


def _places_every_document_once(plan: Any, n: int) -> bool:
    return sorted(i for rep in plan.microbatches for mb in rep for i in mb) == list(range(n))


def test_one_step_planned_in_process_with_its_decision() -> None:
    w = _worker()
    slow = [np.array([[1.0, 1.0], [2.0, 2.0]])] * 20  # replica 1 twice as slow
    plan, why, record = w(4, slow)
    n = len(w.loader.lengths(4))
    assert why is None and _places_every_document_once(plan, n)
    assert plan.counts[0] > plan.counts[1]  # the slow replica runs fewer micro-batches
    assert all(list(mb) == sorted(mb) for rep in plan.microbatches for mb in rep)
    assert record["action"]["action"] == "plan_work" and record["latency_s"] >= 0
    assert record["predicted_step_with_action_s"] < record["predicted_step_s"]
    first, _, record0 = w(0, [])
    assert "no telemetry yet" in record0["reason"] and first.counts == [3, 3]


def test_the_loader_method_plans_the_loaders_order() -> None:
    w = _worker("loader")
    plan, why, _ = w(2, None)
    assert why is None
    assert plan.microbatches == plan_static(w.loader.lengths(2), w.config).microbatches


@dataclass
class _Raises(PlanWorker):
    def plan_step(self, step: int, speeds: Any, seen: bool) -> Any:
        raise ValueError("no  plan\n today")


@dataclass
class _Exits(PlanWorker):
    def plan_step(self, step: int, speeds: Any, seen: bool) -> Any:
        if step == 1:
            os._exit(7)
        return super().plan_step(step, speeds, seen)


def test_a_failing_plan_is_a_reason_not_an_exception() -> None:
    plan, why, record = _worker(cls=_Raises)(0, None)
    assert plan is None and why == "the planner failed (ValueError: no plan today)"
    assert record["latency_s"] >= 0


def test_the_worker_process_plans_and_an_exited_one_is_named_at_once() -> None:
    proc = PlanProcess(_worker(cls=_Exits))
    try:
        proc.request(0, None)
        plan, why, _ = proc.result(0, 60.0)
        assert why is None and _places_every_document_once(plan, len(
            _worker().loader.lengths(0)))
        proc.request(1, None)  # the worker exits on this one
        t0 = time.perf_counter()
        got = proc.result(1, 60.0)
        assert got == "the planner process exited (exit code 7)"
        proc.request(2, None)  # later steps: the same reason, without waiting
        assert proc.result(2, 60.0) == got
        assert time.perf_counter() - t0 < 30.0  # far under the timeout
    finally:
        proc.close()


def test_a_late_plan_is_named_with_the_timeout() -> None:
    proc = PlanProcess(_worker())
    try:
        assert proc.result(5, 0.01) == "the plan was not ready within 0.01 s"  # never asked
    finally:
        proc.close()


@pytest.mark.parametrize("method", ["tokens", "balance"])
def test_the_worker_survives_pickling(method: str) -> None:
    import pickle

    w = _worker(method)
    back = pickle.loads(pickle.dumps(w))
    assert back(3, [])[0] == w(3, [])[0]


def test_an_answer_older_than_the_step_taken_is_dropped() -> None:
    proc = PlanProcess(_worker("tokens"))
    try:
        proc.request(0, None)
        proc.request(1, None)
        assert not isinstance(proc.result(1, 60.0), str)  # step 0's answer came first
        assert proc.result(0, 0.01) == "the plan was not ready within 0.01 s"  # not kept
    finally:
        proc.close()


def test_the_worker_keeps_the_speed_history_from_the_newest_ratios() -> None:
    from bubblecast.runtime.plan_worker import HISTORY

    w = _worker()
    slow = np.array([[1.0, 1.0], [2.0, 2.0]])
    for step in range(HISTORY + 5):
        plan, why, _ = w.answer(step, slow)
    assert len(w.history) == HISTORY and why is None
    assert plan.counts[0] > plan.counts[1]  # planned from the kept history
    before = len(w.history)
    w.answer(HISTORY + 5, None)  # no new ratios: the history stands
    assert len(w.history) == before
    tokens = _worker("tokens")
    tokens.answer(0, slow)
    assert not tokens.uses_speeds and tokens.history == []  # plans without the speeds


@dataclass
class _Drops(PlanWorker):
    def plan_step(self, step: int, speeds: Any, seen: bool) -> Any:
        plan, record = super().plan_step(step, speeds, seen)
        first = plan.microbatches[0]
        return replace(plan, microbatches=((first[0][1:], *first[1:]),
                                           *plan.microbatches[1:])), record


def test_the_worker_checks_its_own_plan() -> None:
    plan, why, record = _worker(cls=_Drops).answer(1, None)
    assert plan is None and why == "the plan does not place every document of the step " \
        "exactly once"
    assert record["latency_s"] >= 0


@dataclass
class _Nice(PlanWorker):
    def plan_step(self, step: int, speeds: Any, seen: bool) -> Any:
        plan, record = super().plan_step(step, speeds, seen)
        return plan, {**record, "nice": os.nice(0)}


def test_the_worker_process_plans_at_the_lowest_priority() -> None:
    from bubblecast.runtime.plan_worker import WORKER_NICE

    here = os.nice(0)
    proc = PlanProcess(_worker("tokens", cls=_Nice))
    try:
        proc.request(0)
        _, why, record = proc.result(0, 60.0)
        assert why is None and record["nice"] == min(19, here + WORKER_NICE)
    finally:
        proc.close()
