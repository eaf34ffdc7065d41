"""The demo's balanced-work stage: plan every step's documents live on a real CPU pipeline.

What a user does with their own packed-document training, in three launches of the packed GPT
(1 replica x 2 stages, 1F1B, gloo):

1. ``collect``: a static run (the data loader's packing) records telemetry with each
   micro-batch's ``tokens``, ``tokens_sq`` and ``documents``;
2. ``train --model cost``: the learned cost model is fitted to it (saved under
   ``balanced/cost``);
3. ``run --policy balance --model balanced/cost`` and a static run of the same documents
   (another seed than the collect's): step times, the plan each step (Decision records in
   ``balance-actions.json``), fall-backs, and identical losses.

Beside the measured ratio, ``policy-eval`` on the static run's recorded documents gives what
the planner predicts for them (:mod:`bubblecast.policy.work_truth`): on one short CPU run the
measured ratio is noisy, so both are shown.
"""

from __future__ import annotations

import json
from typing import Any

#: The packed GPT of the stage and its step shape.
MODEL = {"kind": "packed", "layers": 4, "hidden": 64, "heads": 4, "seq_len": 2048,
         "vocab": 128}
STAGES, MICROBATCHES = 2, 4


def _config(steps: int, seed: int, run_id: str, planner: str = "static",
            cost_model: str | None = None) -> Any:
    from bubblecast.runtime.train_config import ModelSpec, TrainConfig

    return TrainConfig(model=ModelSpec(**MODEL), stages=STAGES, microbatches=MICROBATCHES,
                       schedule="1f1b", steps=steps, optimizer="adamw", lr=1e-3, seed=seed,
                       run_id=run_id, planner=planner, cost_model=cost_model,
                       layer_cost_every=0)


def _timing(events: Any, summary: dict[str, Any], warm: int) -> dict[str, Any]:
    """Mean step seconds after ``warm`` steps (from the recorded ``events``) and documents per
    second of the whole run."""
    from bubblecast.sim.steptime import observed_step_times

    steps = observed_step_times(events.frame).to_numpy()[warm:]
    wall = float(summary["wall_s"])
    return {"mean_step_s": float(steps.mean()),
            "documents_s": summary.get("documents_trained", 0) / wall if wall > 0 else None}


def balanced(demo: Any, steps: int, seed: int) -> dict[str, Any]:
    """The stage (see the module doc) into ``demo.dir("balanced")``: its JSON record."""
    from bubblecast.forecast.cost_model import CostModel
    from bubblecast.forecast.cost_modeldir import save_cost_model
    from bubblecast.policy.policy_evaluation import EvalConfig, evaluate_events
    from bubblecast.runtime.launch import run_out_job
    from bubblecast.telemetry import read_events

    where = demo.dir("balanced")
    collect = where / "collect.parquet"
    run_out_job(collect, _config(steps, seed + 1, "balanced-collect"), timeout=900)
    model = CostModel(learner="linear", holdout=0.0, seed=seed).fit(read_events(collect))
    save_cost_model(model, where / "cost")
    cost = str(where / "cost")
    runs: dict[str, dict[str, Any]] = {}
    recorded: dict[str, Any] = {}
    warm = max(1, steps // 8)
    for policy in ("static", "balance"):
        out = where / f"{policy}.parquet"
        summary = run_out_job(out, _config(steps, seed, f"balanced-{policy}", policy,
                                           cost if policy == "balance" else None),
                              timeout=900)
        decisions = summary.get("decisions", [])
        (where / f"{policy}-actions.json").write_text(json.dumps(
            {"policy": policy, "cost_model": cost if policy == "balance" else None,
             "decisions": decisions}, indent=1, default=float))
        recorded[policy] = read_events(out)
        runs[policy] = {"events": f"balanced/{policy}.parquet",
                        **_timing(recorded[policy], summary, warm),
                        "decisions": len(decisions),
                        "fallbacks": sum(1 for d in decisions if d.get("fallback")),
                        "losses": list(summary["losses"].values())}
    static, planned = runs["static"], runs["balance"]
    planned["speedup_vs_static"] = static["mean_step_s"] / planned["mean_step_s"]
    losses = zip(static.pop("losses"), planned.pop("losses"), strict=True)
    worst = max(abs(a - b) / max(abs(a), 1e-12) for a, b in losses)
    predicted, _ = evaluate_events(recorded["static"],
                                   ["static", "tokens", "balance", "oracle"],
                                   EvalConfig(cost_model=cost))
    return {"model": MODEL, "stages": STAGES, "microbatches": MICROBATCHES, "steps": steps,
            "warm_steps": warm, "cost_model": "balanced/cost",
            "cost_model_p90_rel_error_in_sample":
                model.metrics_["learners"]["linear"].get("p90_rel_error"),
            "policies": runs, "loss_max_rel_diff": worst,
            "predicted_speedup": {n: float(p["speedup_vs_static"])
                                  for n, p in predicted["policies"].items()}}


def report_section(r: dict[str, Any], table: Any) -> list[str]:
    """The report's paragraphs for the stage's record ``r`` (``table``: the report's table
    helper)."""
    m = r["model"]
    rows = [(n, p["mean_step_s"] * 1e3, p["documents_s"], p.get("speedup_vs_static"),
             p["decisions"], p["fallbacks"]) for n, p in r["policies"].items()]
    pred = r["predicted_speedup"]
    return [f"The packed GPT ({m['layers']} layers, hidden {m['hidden']}, a {m['seq_len']}-token "
            f"budget, attention within each document) on {r['stages']} CPU processes, "
            f"{r['microbatches']} micro-batches a step, {r['steps']} steps: a static run "
            "recorded the telemetry, `train --model cost` fitted the cost model "
            f"(`{r['cost_model']}`), and `run --policy balance --model {r['cost_model']}` "
            "planned every step's packing and order from it in a data-loader worker process. "
            f"Losses agree with static to {r['loss_max_rel_diff']:.1e} (relative).",
            table(["policy", "mean step after warm-up (ms)", "documents/s (whole run)",
                   "speed-up vs static (steps)", "decisions", "fall-backs"], rows),
            "What `policy-eval` predicts for the documents the static run saw (timed against "
            "the run's own fitted costs): " + ", ".join(f"{n} {v:.3f}x" for n, v in pred.items())
            + ". One short run on a shared CPU is noisy; benchmarks/bench_live_balance.py "
            "measures it with the policies interleaved."]

