"""The helpers of benchmarks/bench_serve_plan.py: its seeded ``POST /v1/plan`` bodies and the
check that an answer is a valid plan (every document once, budget respected)."""

from __future__ import annotations

import copy
import json

import pytest

from benchmarks.bench_serve_plan import check_plan, plan_requests, slow_replica_counts
from bubblecast import plan_batch
from bubblecast.serve.schemas import PlanRequest

SMALL = {"documents": 64, "replicas": 2, "microbatches": 4, "stages": 2}


def answer(req: dict) -> dict:
    plan = plan_batch(req["lengths"], token_budget=req["token_budget"],
                      replicas=req["replicas"], microbatches=req["microbatches"],
                      stages=req["stages"], schedule=req["schedule"], cost=req["cost"],
                      speeds=req["speeds"])
    return json.loads(json.dumps(plan.to_json()))


def test_bodies_are_seeded_lognormal_steps_half_with_one_slow_replica():
    reqs = plan_requests(6, seed=3)
    assert reqs == plan_requests(6, seed=3)
    assert reqs != plan_requests(6, seed=4)
    for q in reqs:
        PlanRequest.model_validate(q)  # the service accepts it
        assert len(q["lengths"]) == 1024
        assert (q["token_budget"], q["replicas"], q["microbatches"], q["stages"]) == (
            4096, 8, 16, 4)
        assert min(q["lengths"]) >= 1 and max(q["lengths"]) <= 4096 // 4  # the preset's cap
        assert q["cost"]["per_token"] > 0 and q["cost"]["per_token_sq"] > 0
    slowed = [q["speeds"] for q in reqs if q["speeds"] is not None]
    assert len(slowed) == 3
    assert all(sorted(s) == [1.0] * 7 + [1.5] for s in slowed)


def test_a_real_plan_passes_and_the_slow_replica_counts_are_reported():
    reqs = plan_requests(4, seed=0, **SMALL)
    plans = [answer(q) for q in reqs]
    assert all(check_plan(p, q) == [] for p, q in zip(plans, reqs, strict=True))
    counts = slow_replica_counts(plans, reqs)
    assert counts["equal_speeds"] == pytest.approx(4.0)
    assert counts["slow_replica"] + counts["other_replicas"] == pytest.approx(8.0)


@pytest.mark.parametrize("damage, says", [
    (lambda p, q: p["microbatches"][0][0].pop(), "missing"),
    (lambda p, q: p["microbatches"][1][0].append(p["microbatches"][0][0][0]),
     "more than once"),
    (lambda p, q: p["microbatches"][0][0].append(10**6), "not a document"),
    (lambda p, q: p["microbatches"][0][0].append(True), "not a document"),
    (lambda p, q: q.update(token_budget=1), "over the budget"),
    (lambda p, q: p["counts"].__setitem__(0, p["counts"][0] + 1), "counts"),
    (lambda p, q: p["microbatches"].append([]), "replicas"),
    (lambda p, q: p["cost"][0].pop(), "cost"),
    (lambda p, q: p.pop("fallback"), "missing keys"),
])
def test_a_damaged_plan_is_named(damage, says):
    req = plan_requests(1, seed=1, **SMALL)[0]
    plan = answer(req)
    plan, req = copy.deepcopy(plan), copy.deepcopy(req)
    damage(plan, req)
    problems = check_plan(plan, req)
    assert problems and any(says in p for p in problems), problems


def test_not_an_object():
    assert check_plan([], plan_requests(1, **SMALL)[0]) == ["not a JSON object: list"]
