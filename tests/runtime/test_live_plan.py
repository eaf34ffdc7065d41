"""Planning live (issue 25 item 3): the plan's wire form, the checks that make a plan fall
back to the loader's order, and (torchrun, 2 ranks) the live planner: every step planned and
recorded as a Decision, the same losses as the loader's order, fail-open with the reason.
``run --policy balance`` end to end with a cost model, and its refusals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bubblecast.policy.work_plan import TOKENS, PlanConfig, WorkPlan, plan_batch, plan_static
from bubblecast.runtime.live_plan import decode, encode
from bubblecast.runtime.plan_worker import canonical, plan_problem
from tests.runtime.dist_live_plan import DIES, DROPS, RAISES, STEPS
from tests.runtime.dist_results import launch_scenarios

HERE = Path(__file__).resolve().parent
LENGTHS = np.array([30, 5, 60, 12, 7, 44, 9, 21, 3, 16, 50, 8, 40], dtype=np.int64)
CONFIG = PlanConfig(64, replicas=2, microbatches=3, stages=2, schedule="1f1b",
                    min_microbatches=2)


def test_a_plan_survives_the_wire() -> None:
    plan = plan_batch(LENGTHS, CONFIG, TOKENS, [2.0, 1.0])
    assert plan.counts != [3, 3]  # the slow replica runs fewer
    row = encode(plan, len(LENGTHS), 2, (4, 1.25))
    back = decode(row, len(LENGTHS), 2, "balance")
    assert back is not None and back.microbatches == canonical(plan).microbatches
    assert (row[-2], row[-1]) == (4.0, 1.25)
    assert decode(encode(None, len(LENGTHS), 2, None), len(LENGTHS), 2, "balance") is None


def test_plans_that_cannot_run_are_named() -> None:
    good = plan_static(LENGTHS, CONFIG)
    assert plan_problem(good, LENGTHS, CONFIG) is None
    reps = good.microbatches
    missing = WorkPlan(((reps[0][0][1:], *reps[0][1:]), reps[1]))
    assert "exactly once" in plan_problem(missing, LENGTHS, CONFIG)
    twice = WorkPlan(((reps[0][0] + reps[1][0][:1], *reps[0][1:]), reps[1]))
    assert "budget" in plan_problem(twice, LENGTHS, CONFIG) or \
        "exactly once" in plan_problem(twice, LENGTHS, CONFIG)
    one = WorkPlan(((reps[0][0],), (*reps[0][1:], *reps[1])))
    assert "its schedule cannot run" in plan_problem(one, LENGTHS, CONFIG)  # 1f1b: >= 2
    assert "replicas planned" in plan_problem(WorkPlan((reps[0],)), LENGTHS, CONFIG)


@pytest.mark.parametrize(("schedule", "least"), [("1f1b", 2), ("gpipe", 1)])
def test_the_loader_never_plans_fewer_microbatches_than_torch_runs(schedule: str,
                                                                     least: int) -> None:
    from bubblecast.runtime.document_loader import DocumentLoader

    loader = DocumentLoader(budget=64, vocab=8, seed=0, replicas=2, microbatches=3, stages=2,
                            schedule=schedule)
    assert loader.config.min_microbatches == least


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    return launch_scenarios(tmp_path_factory.mktemp("live"), 2, HERE / "dist_live_plan.py")


def _lead(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    return next(r for r in per_rank if r["rank"] == 0)


@pytest.mark.dist
@pytest.mark.parametrize("pair", [("static", "tokens"), ("static_dp", "tokens_dp")])
def test_planned_steps_train_the_same_documents(results: dict, pair: tuple[str, str]) -> None:
    static, tokens = (_lead(results[name]) for name in pair)
    assert len(tokens["decisions"]) == STEPS and not static["decisions"]
    for d in tokens["decisions"]:
        assert d["action"]["action"] == "plan_work" and d["latency_s"] >= 0
        assert "fallback" not in d
    # the planner repacks (other micro-batches than the loader's) ...
    assert any(d["action"]["microbatches"] != [] for d in tokens["decisions"])
    # ... and the losses are the loader's order's, step by step (float64)
    a, b = static["losses"], tokens["losses"]
    assert sorted(a) == sorted(b) == list(range(STEPS))
    assert max(abs(a[s] - b[s]) for s in a) < 1e-9
    # and so are the weights after the last step
    for s_rank, t_rank in zip(results[pair[0]], results[pair[1]], strict=True):
        if "state" in s_rank:
            diff = max(float((s_rank["state"][i][k] - t_rank["state"][i][k]).abs().max())
                       for i in s_rank["state"] for k in s_rank["state"][i])
            assert diff < 1e-9


@pytest.mark.dist
def test_a_plan_that_cannot_run_falls_back_to_the_loader_with_the_reason(results: dict) -> None:
    broken, static = _lead(results["broken"]), _lead(results["static"])
    by_step = {d["step"]: d for d in broken["decisions"]}
    assert sorted(by_step) == list(range(STEPS))
    assert "planner broke on purpose" in by_step[RAISES]["fallback"]
    assert "exactly once" in by_step[DROPS]["fallback"]
    gone = set(range(DIES, STEPS))  # the worker process exited: never waited for, named
    assert gone and all("exit code 3" in by_step[s]["fallback"] for s in gone)
    for step in {RAISES, DROPS} | gone:
        assert by_step[step]["reason"].startswith("fall-back to the data loader's order")
    assert all("fallback" not in by_step[s] for s in set(range(STEPS)) - {RAISES, DROPS} - gone)
    assert max(abs(broken["losses"][s] - static["losses"][s]) for s in range(STEPS)) < 1e-9


BASE = ["--arch", "packed", "--layers", "4", "--hidden", "16", "--heads", "2", "--seq-len",
        "128", "--vocab", "32", "--stages", "2", "--microbatches", "2", "--steps", "4",
        "--layer-cost-every", "0"]


@pytest.fixture(scope="module")
def cost_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A linear cost model fitted to a simulated packed-document run (the mechanics only need
    one trained with tokens_sq)."""
    from bubblecast.cli import main
    from bubblecast.forecast.cost_model import CostModel
    from bubblecast.forecast.cost_modeldir import save_cost_model
    from bubblecast.telemetry import read_events

    root = tmp_path_factory.mktemp("cost")
    assert main(["simulate", "--schedule", "1f1b", "--stages", "2", "--microbatches", "2",
                 "--steps", "60", "--documents", "lognormal", "--token-budget", "128",
                 "--seed", "3", "--out", str(root / "sim.parquet")]) == 0
    model = CostModel(learner="linear", holdout=0.0).fit(read_events(root / "sim.parquet"))
    save_cost_model(model, root / "model")
    return root / "model"


@pytest.mark.parametrize(("extra", "message"), [
    (["--policy", "balance"], "--policy balance: needs --model DIR"),
    (["--policy", "reactive"], "--policy reactive: moves layers"),
    (["--policy", "tokens", "--model", "x"], "--model: only --policy balance reads a model"),
    (["--policy", "tokens", "--service", "http://h:1"], "--service: packed-document"),
])
def test_planned_run_refusals_exit_2_before_launch(
        extra: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import bubblecast.runtime.launch as launch_mod
    from bubblecast.cli import main

    monkeypatch.setattr(launch_mod, "launch", lambda *a, **k: pytest.fail("launched"))
    code = main(["run", *BASE, *extra, "--out", str(tmp_path / "r.parquet")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert list(tmp_path.iterdir()) == []


def test_balance_on_another_architecture_is_refused(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture) -> None:
    from bubblecast.cli import main

    args = ["run", *BASE, "--policy", "balance", "--out", str(tmp_path / "r.parquet")]
    args[args.index("packed")] = "gpt"
    assert main(args) == 2
    assert "needs --arch packed" in capsys.readouterr().err


@pytest.mark.dist
def test_run_policy_balance_plans_every_step_and_records_documents(
        tmp_path: Path, cost_model: Path, capsys: pytest.CaptureFixture) -> None:
    from bubblecast.cli import main
    from bubblecast.telemetry import read_events

    out = tmp_path / "r.parquet"
    code = main(["run", *BASE, "--policy", "balance", "--model", str(cost_model),
                 "--out", str(out), "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert result["decisions"] == 4 and result["fallbacks"] == 0
    actions = json.loads(Path(result["actions_file"]).read_text())
    assert [d["step"] for d in actions["decisions"]] == [0, 1, 2, 3]
    assert all(d["action"]["action"] == "plan_work" for d in actions["decisions"])
    assert actions["decisions"][-1]["predicted_step_with_action_s"] is not None
    ev = read_events(out)
    f = ev.frame[ev.frame["op"] == "F"]
    assert f["tokens_sq"].notna().all() and (f["documents"] >= 1).all()
    assert ev.runs[result["run_id"]].extra["documents"]["planner"] == "balance"


def test_a_cost_model_of_another_model_shape_is_refused_before_launch(
        tmp_path: Path, cost_model: Path, capsys: pytest.CaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A cost model records the model its runs trained; ``run`` refuses one of another
    shape in one line naming the fields (the fixture's simulated runs record none)."""
    import shutil

    import bubblecast.runtime.launch as launch_mod
    from bubblecast.cli import main

    other = tmp_path / "other"
    shutil.copytree(cost_model, other)
    doc = json.loads((other / "model.json").read_text())
    doc["training"]["model_shape"] = {"kind": "packed", "layers": 4, "hidden": 64, "heads": 2,
                                      "seq_len": 128, "vocab": 32}
    (other / "model.json").write_text(json.dumps(doc))
    monkeypatch.setattr(launch_mod, "launch", lambda *a, **k: pytest.fail("launched"))
    code = main(["run", *BASE, "--policy", "balance", "--model", str(other),
                 "--out", str(tmp_path / "r.parquet")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "another model shape: hidden 64 (model) vs 16 (this run)" in err[0], err
    assert not (tmp_path / "r.parquet").exists()


def test_the_live_planner_falls_back_to_tokens_on_a_model_of_another_shape(
        cost_model: Path) -> None:
    from bubblecast.forecast.cost_modeldir import load_cost_model
    from bubblecast.policy.work_plan import TOKENS
    from bubblecast.runtime.live_plan import load_work_cost

    model = load_cost_model(str(cost_model))
    model.training_["model_shape"] = {"kind": "packed", "seq_len": 256}
    work, _, problem = load_work_cost(model, "balance", {"kind": "packed", "seq_len": 128})
    assert work == TOKENS and "seq_len 256 (model) vs 128 (this run)" in problem
    work, _, problem = load_work_cost(model, "balance", {"kind": "packed", "seq_len": 256})
    assert problem is None and work != TOKENS
