"""Work balancing on the command line: ``policy-eval --policies static,tokens,balance,oracle``
on the committed packed-document samples, ``--cost-model`` refusals, and ``whatif``'s
``balanced_work`` (null without tokens_sq or without the documents, a number with them)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from bubblecast.cli import main
from bubblecast.policy.policy_evaluation import REQUIRED_KEYS
from bubblecast.policy.work_whatif import NO_LENGTHS, NO_TOKENS_SQ, BubbleAnalysis
from bubblecast.sim.simulator import SimConfig, simulate_events
from bubblecast.telemetry import read_events, write_events
from bubblecast.telemetry.events import Events

DATA = Path(__file__).resolve().parents[2] / "data" / "documents"
SAMPLES = [DATA / "lognormal.parquet", DATA / "longtail.parquet"]
POLICIES = "static,tokens,balance,oracle"


def _json(capsys: pytest.CaptureFixture[str], args: list[str]) -> dict:
    code = main(args)
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


def _error(capsys: pytest.CaptureFixture[str], args: list[str]) -> str:
    code = main(args)
    out = capsys.readouterr()
    assert code == 2 and out.out == ""
    assert out.err.startswith("bubblecast: error: ") and out.err.count("\n") == 1
    return out.err


def test_policy_eval_json_on_the_committed_samples(capsys):
    doc = _json(capsys, ["policy-eval", *map(str, SAMPLES), "--policies", POLICIES, "--json"])
    assert list(doc["policies"]) == POLICIES.split(",")
    assert doc["mode"] == "work-plan" and len(doc["runs"]) == 4
    for name, row in doc["policies"].items():
        assert set(REQUIRED_KEYS) | {"imbalance_degree", "bound_step_s", "decision_ms"} \
            <= set(row), name
        assert row["runs"] == 4
    p = doc["policies"]
    assert p["balance"]["cost_model"] == "online fit from the run's own telemetry"
    assert p["oracle"]["step_s"] < p["static"]["step_s"]
    assert p["balance"]["speedup_vs_static"] > p["tokens"]["speedup_vs_static"] > 1.0
    # the samples slow one replica from a step on: balance gives it fewer micro-batches
    assert p["balance"]["microbatch_counts"]["rebalanced_steps"] > 0
    for run in doc["runs"].values():
        assert run["policies"]["balance"]["microbatch_counts"]["min"] < 8


def test_policy_eval_refuses_partition_policies_on_document_runs(capsys):
    err = _error(capsys, ["policy-eval", str(SAMPLES[0]), "--json"])
    assert "packs documents: policy 'reactive'" in err


def test_a_cost_model_without_tokens_sq_is_refused_on_document_runs(capsys, tmp_path):
    from bubblecast.forecast.cost_model import CostModel
    from bubblecast.forecast.cost_modeldir import save_cost_model

    seqlen = simulate_events(SimConfig(stages=2, microbatches=4, steps=12, scenario="seqlen",
                                       seed=1))
    model = CostModel(learner="linear", holdout=0.0).fit(seqlen)
    assert not model.has_tokens_sq
    save_cost_model(model, tmp_path / "cost")
    err = _error(capsys, ["policy-eval", str(SAMPLES[0]), "--policies", "static,balance",
                          "--cost-model", str(tmp_path / "cost"), "--json"])
    assert "trained without tokens_sq" in err and str(tmp_path / "cost") in err


def test_whatif_balanced_work_on_a_document_run(capsys):
    doc = _json(capsys, ["whatif", str(SAMPLES[0]), "--run", "documents-lognormal-0",
                         "--json"])
    work = doc["scenarios"]["balanced_work"]
    assert set(work) == {"step_s", "speedup"} and "balanced_work_note" not in doc
    assert work["speedup"] > 1.05
    assert work["step_s"] == pytest.approx(doc["replayed_step_s"] / work["speedup"])
    assert set(doc["scenarios"]) == {"ideal", "fix_bottleneck", "no_slow_ranks", "balanced",
                                     "balanced_work"}


def test_whatif_balanced_work_is_null_without_tokens_sq(capsys):
    doc = _json(capsys, ["whatif", str(DATA.parent / "sim" / "jitter.parquet"), "--run",
                         read_events(DATA.parent / "sim" / "jitter.parquet").run_ids[0], "--json"])
    assert doc["scenarios"]["balanced_work"] is None
    assert doc["balanced_work_note"] == NO_TOKENS_SQ
    assert doc["scenarios"]["ideal"]["speedup"] > 0  # the other scenarios are unchanged


def test_whatif_balanced_work_is_null_without_the_documents(tmp_path, capsys):
    events = read_events(SAMPLES[0])
    rid = events.run_ids[0]
    one = events.run(rid)
    meta = copy.deepcopy(one.runs)
    del meta[rid].extra["documents"]["lengths"]
    path = tmp_path / "no-lengths.parquet"
    write_events(Events(one.frame, meta), path)
    doc = _json(capsys, ["whatif", str(path), "--json"])
    assert doc["scenarios"]["balanced_work"] is None
    assert doc["balanced_work_note"] == NO_LENGTHS
    with_lengths = BubbleAnalysis(one).whatif()  # the same run with them: a number
    assert with_lengths["scenarios"]["balanced_work"]["speedup"] > 1.0


def test_whatif_balanced_work_estimates_speeds_without_the_speed_column():
    events = read_events(SAMPLES[0])
    one = events.run(events.run_ids[0])
    truthful = BubbleAnalysis(one).whatif()["scenarios"]["balanced_work"]
    blind = Events(one.frame.drop(columns=["speed"]), one.runs)
    measured = BubbleAnalysis(blind).whatif()["scenarios"]["balanced_work"]
    # speeds estimated from the durations alone give nearly the same counterfactual
    assert measured["speedup"] == pytest.approx(truthful["speedup"], rel=0.03)


def test_policy_eval_optimum_bounds_every_policy_on_one_replica(capsys, tmp_path):
    """``--optimum``: each step's best plan solved exactly; its proven bound is below every
    policy's step, the best plan found above the bound, and the keys stay null without the
    flag or with several replicas."""
    one = tmp_path / "one.parquet"
    write_events(simulate_events(SimConfig(stages=2, microbatches=4, replicas=1, steps=6,
                                           documents="lognormal", attention_share=0.5,
                                           seed=3)), one)
    doc = _json(capsys, ["policy-eval", str(one), "--policies", POLICIES, "--optimum", "5",
                         "--json"])
    p = doc["policies"]
    bound, best = p["static"]["optimum_step_s"], p["static"]["optimum_best_s"]
    assert bound <= best * (1 + 1e-12) and best <= bound * 1.01
    for name in POLICIES.split(","):
        assert p[name]["optimum_step_s"] == bound  # one number per run, beside every policy
        assert bound <= p[name]["step_s"] * (1 + 1e-9), name
    assert best < p["static"]["step_s"]
    plain = _json(capsys, ["policy-eval", str(one), "--policies", POLICIES, "--json"])
    assert plain["policies"]["static"].get("optimum_step_s") is None
    many = _json(capsys, ["policy-eval", str(SAMPLES[0]), "--policies", "static,oracle",
                          "--optimum", "1", "--json"])
    assert many["policies"]["static"].get("optimum_step_s") is None  # several replicas
    err = _error(capsys, ["policy-eval", str(one), "--optimum", "-1"])
    assert "--optimum: seconds per step must be > 0" in err


def test_a_step_without_a_best_plan_in_time_leaves_only_the_bound(capsys, tmp_path, monkeypatch):
    """A MILP stopped by its time limit before any plan (here: every step with an odd number
    of documents): the bound still holds, the best plans' mean is null (never NaN in the
    JSON), and the text report says so with a dash."""
    import dataclasses

    from bubblecast.policy import work_optimum

    real = work_optimum.optimal_step

    def odd_steps_unsolved(*args, **kwargs):
        got = real(*args, **kwargs)
        return dataclasses.replace(got, best_s=float("nan")) if len(args[0]) % 2 else got

    monkeypatch.setattr(work_optimum, "optimal_step", odd_steps_unsolved)
    one = tmp_path / "one.parquet"
    write_events(simulate_events(SimConfig(stages=2, microbatches=4, replicas=1, steps=6,
                                           documents="lognormal", attention_share=0.5,
                                           seed=3)), one)
    doc = _json(capsys, ["policy-eval", str(one), "--policies", "static,oracle", "--optimum",
                         "5", "--json"])
    row = doc["policies"]["static"]
    assert row["optimum_step_s"] > 0 and row.get("optimum_best_s") is None
    assert main(["policy-eval", str(one), "--policies", "static,oracle", "--optimum", "5"]) == 0
    assert "the best plan found - s" in capsys.readouterr().out
