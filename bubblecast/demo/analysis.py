"""The demo's offline analysis stages: policies on held-out runs, and the real Megatron trace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bubblecast.demo.config import MEGATRON_RELATIVE, DemoConfig
from bubblecast.demo.pipeline import champion_dir
from bubblecast.demo.progress import Progress
from bubblecast.demo.stages import StageContext, Workspace, dumps

#: Runs shown in the policy figure (those where the oracle gains most).
PLOTTED_RUNS = 4


def policy_eval_stage(config: DemoConfig, ws: Workspace, ctx: StageContext,
                      progress: Progress) -> None:
    """Replay held-out runs under each policy (what ``bubblecast policy-eval`` does, run by
    run for progress); the predictive policy forecasts with the champion model."""
    from bubblecast.forecast.modeldir import load_model
    from bubblecast.policy.evaluate import EvalConfig, aggregate, evaluate_run, plot_traces
    from bubblecast.policy.rundata import load_run
    from bubblecast.telemetry.io import read_events

    progress.note("reading held-out runs")
    events = read_events(ws.path("simulate", "heldout"))
    run_ids = events.run_ids
    if config.policy_runs:
        run_ids = run_ids[: config.policy_runs]
    model = load_model(champion_dir(ws))
    eval_config = EvalConfig()
    reports, traces = [], {}
    names = list(config.policies)
    progress.note(f"replaying {len(run_ids)} runs under {', '.join(names)}")
    for k, run_id in enumerate(run_ids):
        run = load_run(events, run_id, eval_config.layers_per_stage)
        report, tr = evaluate_run(run, names, eval_config, model, events)
        reports.append(report)
        traces[run_id] = tr
        progress.advance(k + 1, len(run_ids))
    summary = aggregate(reports, names)
    best = sorted(reports, key=lambda r: -(r["oracle_gain"] or 0.0))[:PLOTTED_RUNS]
    progress.note("plotting")
    plot_traces({r["run_id"]: traces[r["run_id"]] for r in best}, ctx.dir / "policies.png")
    full = {"mode": reports[0]["mode"] if reports else None, "policies": summary,
            "runs": {r["run_id"]: r for r in reports}}
    (ctx.dir / "policy_eval.json").write_text(dumps(full))
    per_run = [{"run_id": r["run_id"], "oracle_gain": r["oracle_gain"],
                "forecaster": r["forecaster"],
                **{f"{n}_speedup": r["policies"][n]["speedup_vs_static"] for n in names},
                **{f"{n}_actions": r["policies"][n]["actions"] for n in names}}
               for r in reports]
    ctx.result.update({"policies": summary, "names": names, "runs": len(reports),
                       "per_run": per_run, "model": str(champion_dir(ws).name),
                       "figure": "policy_eval/policies.png",
                       "json": "policy_eval/policy_eval.json"})


def _reference(trace: Path) -> dict[str, Any] | None:
    """The trace authors' own what-if numbers (``ms-ST.json`` beside the trace), if present."""
    path = trace.with_name(trace.name.replace("trace-", "ms-").replace(".parquet", ".json"))
    try:
        doc = json.loads(path.read_text())
        return {"replayed_step_s": float(doc["tori"]), "fix_bottleneck": float(doc["trem"]),
                "ideal": float(doc["tideal"]), "source": path.name}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def megatron_stage(config: DemoConfig, ws: Workspace, ctx: StageContext,
                   progress: Progress) -> None:
    """Import the real Megatron-LM trace, account its bubbles and answer the what-ifs."""
    from bubblecast.sim.accounting import inspect_summary
    from bubblecast.sim.plots import plot_inspect
    from bubblecast.sim.whatif import whatif
    from bubblecast.telemetry.importers import load_events

    trace = Path(config.megatron) if config.megatron else None
    if trace is None or not trace.is_file():
        where = trace if trace is not None else MEGATRON_RELATIVE
        ctx.result["skipped"] = f"no Megatron-LM trace at {where}"
        return
    progress.note("importing")
    events = load_events(trace)
    progress.note("bubble accounting")
    summary = inspect_summary(events)
    progress.note("what-if replay")
    answers = whatif(events)
    progress.note("plotting")
    plot_inspect(events, summary, ctx.dir / "inspect.png")
    (ctx.dir / "inspect.json").write_text(dumps(summary))
    (ctx.dir / "whatif.json").write_text(dumps(answers))
    keep = ("run_id", "steps", "stages", "replicas", "bubble_fraction",
            "structural_bubble_fraction", "dynamic_bubble_fraction", "step_time_s",
            "bottleneck_stage", "slow_ranks", "per_stage")
    ctx.result.update({"trace": str(trace), "inspect": {k: summary.get(k) for k in keep},
                       "whatif": {k: answers[k] for k in ("observed_step_s", "replayed_step_s",
                                                          "replay_error", "scenarios")},
                       "reference": _reference(trace), "figure": "megatron/inspect.png"})

