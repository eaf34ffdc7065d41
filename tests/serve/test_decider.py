"""``ServiceDecider``: the live controller's fail-open client of ``/v1/recommend``.

Against a real service (the fake model in a subprocess) it returns the service's decision as a
``Decision``; against nothing, a decision to keep the plan that says why.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bubblecast.policy.cost import MigrationConstants, MigrationCost
from bubblecast.policy.decision import Decision
from bubblecast.policy.state import PolicyState
from bubblecast.serve.client import Client
from bubblecast.serve.decider import ServiceDecider
from bubblecast.sim.steptime import timing_shape
from tests.helpers import free_port
from tests.serve.conftest import fake_server

PARAMS = {"horizon": 16, "risk": 0.3, "margin": 0.5, "min_gain": 0.01, "hold": 5,
          "min_history": 4}


def _inputs(steps: int = 20) -> tuple[PolicyState, np.ndarray, np.ndarray]:
    """Rank 1 three times slower than rank 0 on an even 4|4 split of 8 equal layers."""
    costs = np.tile([1 / 3, 2 / 3, 0.0], (8, 1))
    held = np.full((steps, 2), 4.0)
    speed = np.tile([1.0, 3.0], (steps, 1))
    compute = speed * held * 4  # 4 micro-batches
    state = PolicyState(t=steps - 1, history=speed, partition=(4, 4), costs=costs,
                        pipeline=timing_shape("1f1b", 2, 4, 1, 0.0),
                        migration=MigrationCost(np.full(8, 1e3), MigrationConstants()))
    return state, compute, held


def test_the_services_decision_comes_back_as_a_decision(model_dir: Path) -> None:
    state, compute, held = _inputs()
    with fake_server(model_dir) as (port, _):
        decider = ServiceDecider(f"http://127.0.0.1:{port}", 5.0, PARAMS)
        try:
            decision = decider.decide(state, compute, held)
        finally:
            decider.close()
    assert isinstance(decision, Decision) and decision.reason
    assert decision.predicted_step_s is not None and decision.predicted_step_s > 0
    assert decision.acts and list(decision.action.partition)[0] > 4  # work leaves rank 1
    assert decision.predicted_step_with_action_s < decision.predicted_step_s


def test_no_service_keeps_the_plan_and_says_why() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    decider = ServiceDecider(url, 0.2, PARAMS)
    try:
        decision = decider.decide(*_inputs())
    finally:
        decider.close()
    assert not decision.acts and decision.predicted_step_s is None
    assert decision.reason.startswith(f"service {url}: ")
    assert decision.reason.endswith("; keeping the current plan")


def test_requests_name_the_run_and_step_once_the_controller_sets_it(model_dir: Path) -> None:
    state, compute, held = _inputs()
    decider = ServiceDecider("http://127.0.0.1:1", 1.0, PARAMS)
    try:
        assert "run_id" not in decider.request(state, compute, held, [1])  # no step: own
        decider.step = 119
        body = decider.request(state, compute, held, [1])
        assert body["step"] == 119 and body["run_id"] == decider.run_id
        other = ServiceDecider("http://127.0.0.1:1", 1.0, PARAMS)
        assert other.run_id != decider.run_id  # one run per decider
        other.close()
        with fake_server(model_dir) as (port, _):  # the service adapts that run's intervals
            client = Client(f"http://127.0.0.1:{port}", timeout=5.0)
            try:
                resp = client.recommend(body)
            finally:
                client.close()
        assert resp is not None and resp.intervals == "run"
    finally:
        decider.close()
