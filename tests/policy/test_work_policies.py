"""Work-balancing policies (policy/work_policies.py): the plan action and its JSON, one decision
per step carrying the plan, what the balance policy reads (never the truth), and per-replica
micro-batch counts around a slow replica's onset."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from bubblecast.errors import BubblecastError
from bubblecast.policy.actions import NoOp, PlanWork, action_from_json, action_to_json
from bubblecast.policy.decision import Decision
from bubblecast.policy.policy_evaluation import EvalConfig, evaluate_events
from bubblecast.policy.work_eval import load_document_run, observed_context
from bubblecast.policy.work_policies import (
    BalanceWork,
    OracleWork,
    StaticWork,
    TokensWork,
    plan_action,
)
from bubblecast.sim.scenarios import SlowReplica
from bubblecast.sim.simulator import SimConfig, simulate_events
from bubblecast.telemetry.events import Events

R, M, P = 4, 8, 4


def _run(steps: int = 60, scenario: object = "jitter", documents: str = "lognormal",
         seed: int = 5) -> Events:
    return simulate_events(SimConfig(schedule="1f1b", stages=P, microbatches=M, replicas=R,
                                     steps=steps, documents=documents, scenario=scenario,
                                     seed=seed))


@pytest.fixture(scope="module")
def run() -> Events:
    return _run()


def test_plan_work_round_trips_through_action_and_decision_json():
    action = PlanWork((2, 1), (((0, 3), (1,)), ((2, 4),)))
    doc = action_to_json(action)
    assert doc == {"action": "plan_work", "counts": [2, 1],
                   "microbatches": [[[0, 3], [1]], [[2, 4]]]}
    assert action_from_json(json.loads(json.dumps(doc))) == action
    decision = Decision(action, 1.5, 1.25, 0.0, "planned")
    back = Decision.from_json(json.loads(json.dumps(decision.to_json())))
    assert back == decision and back.acts
    assert back.predicted_saving_s == pytest.approx(0.25)


@pytest.mark.parametrize("bad", [
    {"action": "plan_work", "counts": [2], "microbatches": [[[0]]]},  # count != plan
    {"action": "plan_work", "counts": [1, 1], "microbatches": [[[0, 1]], [[1]]]},  # twice
    {"action": "plan_work", "counts": [1], "microbatches": [[[-1]]]},
    {"action": "plan_work", "counts": [1], "microbatches": [[["x"]]]},
])
def test_plan_work_refuses_malformed_plans(bad):
    with pytest.raises(BubblecastError, match="plan_work"):
        action_from_json(bad)


def test_every_policy_decides_each_step_with_its_plan_as_the_action(run):
    context, truth = load_document_run(run, run.run_ids[0])
    for policy in (StaticWork(), TokensWork(), BalanceWork(), OracleWork(truth)):
        policy.reset(context)
        savings = []
        for t in range(len(context.lengths)):
            plan, decision = policy.decide(t)
            assert isinstance(decision.action, PlanWork)
            assert decision.action == plan_action(plan)
            assert decision.action.microbatches == plan.microbatches
            assert decision.migration_s == 0.0 and decision.reason
            if decision.predicted_step_s is not None:
                savings.append(decision.predicted_saving_s)
        if policy.name in ("balance", "oracle"):  # they predict in seconds (balance once
            # its online cost fit has data: from step min_fit_steps on)
            first = policy.min_fit_steps if policy.name == "balance" else 0
            assert len(savings) == len(context.lengths) - first and np.mean(savings) > 0
        else:  # they predict nothing
            assert savings == []
    assert not isinstance(decision.action, NoOp)


def test_balance_plans_on_tokens_until_its_online_fit_has_data(run):
    context = observed_context(run, run.run_ids[0])
    policy = BalanceWork(min_fit_steps=3, refit_every=10)
    policy.reset(context)
    reasons = [policy.decide(t)[1].reason for t in range(12)]
    assert all("token balancing" in r for r in reasons[:3])
    assert not any("token balancing" in r for r in reasons[3:])
    assert policy.fitted_at_ == 3 + 0 * 10  # refitted at 13 next: not yet
    assert policy.report()["cost_model"] == "online fit from the run's own telemetry"


def _tampered(events: Events) -> Events:
    """The same telemetry with different ground truth: replica 2 made 1.6x slower in the
    ``speed`` column and a different true cost in the metadata (durations untouched)."""
    out = Events(events.frame.copy(), copy.deepcopy(events.runs))
    slow = out.frame["replica"] == 2
    out.frame.loc[slow, "speed"] = out.frame.loc[slow, "speed"] * 1.6
    meta = out.runs[out.run_ids[0]]
    meta.extra["documents"]["cost"] = {"per_token": 1.0, "per_token_sq": 0.0}
    return out


def test_balance_never_reads_ground_truth(run):
    names = ["static", "balance", "oracle"]
    _, honest = evaluate_events(run, names, EvalConfig())
    _, tampered = evaluate_events(_tampered(run), names, EvalConfig())
    rid = run.run_ids[0]

    def decisions(traces: dict, name: str) -> list[dict]:
        return [d.to_json() for _, d in traces[rid][name].decisions]

    assert decisions(honest, "balance") == decisions(tampered, "balance")
    # the tampering is material: the oracle, which is handed the truth, plans differently
    assert decisions(honest, "oracle") != decisions(tampered, "oracle")


def test_slow_replica_gets_fewer_microbatches_after_the_onset_only():
    steps, onset = 80, 40
    scenario = SlowReplica(factor_min=1.5, factor_max=1.5, onset_min=0.5, onset_max=0.5,
                           replica=1)
    events = _run(steps, scenario, seed=11)
    speed = events.frame.groupby("step")["speed"].max().to_numpy()
    assert (speed[:onset] == 1.0).all() and (speed[onset:] == 1.5).all()  # the fixture
    context = observed_context(events, events.run_ids[0])
    policy = BalanceWork()
    policy.reset(context)
    counts = np.array([policy.decide(t)[0].counts for t in range(steps)])
    assert (counts.sum(axis=1) == R * M).all()
    assert (counts[:onset] == M).all()  # equal before the slowdown
    # after it: the slow replica runs fewer micro-batches, from a few steps after the onset
    # (the trend forecaster restarts from a level shift once it has lasted 3 steps)
    late = counts[onset + 5:]
    assert (late[:, 1] < M).all()
    assert (np.delete(late, 1, axis=1) >= M).all()


def test_a_trained_models_speed_table_is_rescaled_and_used_ahead_of_the_trend():
    """A perfect model (its table holds, after each step, the next step's true speeds, in
    its own unit: x7) moves micro-batches at the onset itself, not steps later."""
    steps, onset = 40, 20
    scenario = SlowReplica(factor_min=1.5, factor_max=1.5, onset_min=0.5, onset_max=0.5,
                           replica=2)
    events = _run(steps, scenario, seed=4)
    context, truth = load_document_run(events, events.run_ids[0])
    table = np.full(truth.speed.shape, np.nan)
    table[:-1] = 7.0 * truth.speed[1:]  # made after step t, for step t + 1
    policy = BalanceWork(speed_table=table, speed_signal=7.0 * truth.speed)
    policy.reset(context)
    counts = np.array([policy.decide(t)[0].counts for t in range(steps)])
    assert (counts[2:onset] == M).all()  # from the first fit on: equal before the onset
    assert (counts[onset:, 2] < M).all()  # fewer for the slow replica from the onset on

