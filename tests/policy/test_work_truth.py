"""policy-eval on a packed-document run without simulator truth (policy/work_truth.py): the
plans are timed against the run's own fit, which must reproduce what the truth says."""

from __future__ import annotations

import copy

import pytest

from bubblecast.policy.policy_evaluation import EvalConfig, evaluate_events
from bubblecast.policy.work_truth import ESTIMATED_NOTE
from bubblecast.sim.simulator import SimConfig, simulate_events
from bubblecast.sim.steptime import observed_step_times
from bubblecast.telemetry.events import Events

NAMES = ["static", "tokens", "balance", "oracle"]


def _without_truth(events: Events) -> Events:
    """The run as a recording would hold it: no speed column, no workload, no true cost."""
    rid = events.run_ids[0]
    meta = copy.deepcopy(events.runs[rid])
    meta.extra.pop("workload")
    meta.extra["documents"].pop("cost")
    return Events(events.frame.drop(columns=["speed"]), {rid: meta})


@pytest.mark.parametrize(("scenario", "rel"), [("none", 1e-3), ("jitter", 0.02)])
def test_a_recorded_run_is_timed_against_its_own_fit(scenario: str, rel: float) -> None:
    """Noise-free, the fit recovers the truth: the loader's plan predicts the observed step
    times and every policy's predicted speedup is the truth's (to 0.1%); with 5% jitter on
    every op, to 2%."""
    events = simulate_events(SimConfig(schedule="1f1b", stages=2, microbatches=4, replicas=2,
                                       steps=40, documents="lognormal", scenario=scenario,
                                       seed=3, b=1.5, w=0.7))
    truth, _ = evaluate_events(events, NAMES, EvalConfig())
    fitted, _ = evaluate_events(_without_truth(events), NAMES, EvalConfig())
    run = next(iter(fitted["runs"].values()))
    assert run["note"] == ESTIMATED_NOTE
    assert next(iter(truth["runs"].values()))["note"] != ESTIMATED_NOTE
    observed = observed_step_times(events.frame).to_numpy().mean()
    assert fitted["policies"]["static"]["step_s"] == pytest.approx(observed, rel=rel)
    for name in NAMES:
        assert fitted["policies"][name]["speedup_vs_static"] == pytest.approx(
            truth["policies"][name]["speedup_vs_static"], rel=rel), name
