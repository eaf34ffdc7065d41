"""Public policy API: Policy objects validate at once; evaluate_policies equals policy-eval."""

from __future__ import annotations

import json

import pytest

from bubblecast.cli import main
from bubblecast.errors import BubblecastError
from bubblecast.policy.api import Policy, evaluate_policies
from bubblecast.sim.simulator import SimConfig, simulate_events
from bubblecast.telemetry import write_events


@pytest.fixture(scope="module")
def runs_file(tmp_path_factory):
    ev = simulate_events(SimConfig(schedule="1f1b", stages=4, microbatches=4,
                                   model="uniform:12", steps=60, scenario="failslow", seed=3,
                                   runs=2))
    path = tmp_path_factory.mktemp("api") / "runs.parquet"
    write_events(ev, path)
    return path


def test_policies_validate_when_made():
    assert Policy.predictive(horizon=64).get_params()["horizon"] == 64
    assert Policy.static().build().name == "static"
    with pytest.raises(BubblecastError, match="horizon >= 1"):
        Policy.predictive(horizon=0)
    with pytest.raises(BubblecastError, match="unknown policy 'magic'"):
        Policy("magic")
    with pytest.raises(BubblecastError, match="policy 'reactive'.*speed"):
        Policy("reactive", {"speed": 3})


def test_evaluate_policies_equals_the_command(runs_file, capsys):
    code = main(["policy-eval", str(runs_file), "--policies", "static,reactive,predictive",
                 "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    result = evaluate_policies(runs_file, ["static", Policy.reactive(), "predictive"])
    assert json.loads(json.dumps(result.to_json())) == json.loads(out.out)
    table = result.table
    assert list(table.index) == ["static", "reactive", "predictive"]
    assert table.loc["static", "speedup_vs_static"] == pytest.approx(1.0)
    assert table.loc["reactive", "actions"] == result.to_json()["policies"]["reactive"]["actions"]


def test_parameters_reach_the_policy(runs_file):
    held = evaluate_policies(runs_file, [Policy.reactive(window=10, threshold=10.0)])
    assert held.to_json()["policies"]["reactive"]["actions"] == 0  # never that imbalanced
    with pytest.raises(BubblecastError, match="given twice"):
        evaluate_policies(runs_file, ["static", Policy.static()])
    with pytest.raises(BubblecastError, match="--run: no run 'nope'"):
        evaluate_policies(runs_file, ["static"], run_ids=["nope"])
