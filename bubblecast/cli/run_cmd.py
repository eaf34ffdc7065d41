"""``bubblecast run``: ``collect`` plus the closed-loop controller (policy, forecaster).

Same options as ``collect`` (validated the same way, before any process starts) plus the
policy, the forecaster (``--model`` in process or ``--service``) and the decision interval;
``collect``'s ``--model mlp|gpt`` (the example network) is ``--arch`` here, since ``--model``
names the forecaster as everywhere else (``serve``, ``policy-eval``).
Writes the events file and an actions JSON (every decision, NoOps included, and every action
applied), both atomically.

The packed model (``--arch packed``) and replicated pipelines (``--replicas D``) move no
layers: their policies plan each step's documents instead (``static``: the data loader's
order; ``tokens``; ``balance`` with the cost model ``--model DIR`` and the replicas' forecast
speeds), in a data-loader worker process, one Decision per step
(:mod:`bubblecast.runtime.live_plan`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from bubblecast.cli import app
from bubblecast.cli.collect_cmd import (
    checkpoint_options,
    node_options,
    parse_actions,
    train_config,
    training_failed,
    with_train_options,
)
from bubblecast.cli.common import emit_json
from bubblecast.errors import BubblecastError

if TYPE_CHECKING:
    from bubblecast.runtime.train_config import TrainConfig

#: What ``--service`` is asked through, injected into the runtime by import path (runtime never
#: imports serve): the workers import it.
SERVICE_DECIDER = "bubblecast.serve.decider:ServiceDecider"


#: Policies that plan the packed model's documents every step (no layer moved).
WORK_POLICIES = ("tokens", "balance")


def default_actions_path(out: Path) -> Path:
    """``run.parquet`` -> ``run.actions.json`` beside it."""
    return out.with_name(f"{out.stem}.actions.json")


@app.command()
@with_train_options(
    schedule="gpipe, 1f1b, interleaved, zb-h1 (controllable); others run under --policy "
             "static.",
    action="Scripted action before a step, repeatable: 20:repartition=3,5 | "
           "30:microbatches=8.",
    layer_cost_every="Steps between per-layer cost samples (0 = off: the controller "
                     "assumes equal layers).")
def run(
    out: Path = typer.Option(..., "--out", help="Events Parquet file to write."),
    policy: str = typer.Option("static", "--policy", help="static, reactive, predictive; "
                               "tokens or balance (--arch packed: documents planned)."),
    model_uri: str | None = typer.Option(None, "--model", help="Predictive's forecaster or "
                                         "balance's cost model: a directory or models:/ URI."),
    service: str | None = typer.Option(
        None, "--service", help="URL of a running `bubblecast serve` to ask for actions "
        "(/v1/recommend) instead; fail-open: no answer in time keeps the current plan."),
    every: int = typer.Option(10, "--every", help="Steps between decisions."),
    forecast_timeout: float = typer.Option(
        0.5, "--forecast-timeout",
        help="Seconds a decision (its forecast or service call included) may take."),
    lead_rise: float = typer.Option(
        0.1, "--lead-rise", help="Forecast rise (farthest over nearest horizon) with which a "
        "model with device covariates announces a slowdown not yet seen; calibrate it with "
        "bubblecast.runtime.control.learned_lead.calibrate_rise."),
    decide_in: str = typer.Option(
        "process", "--decide-in", help="Where rank 0 decides while a step trains: process (a "
        "worker process at the lowest CPU priority) or thread (shares the training process's "
        "interpreter lock)."),
    actions_file: Path | None = typer.Option(
        None, "--actions", help="Actions JSON to write (default: OUT's stem + .actions.json)."),
    arch: str = typer.Option("mlp", "--arch",
                             help="Example model: mlp, gpt or packed (collect's --model; here "
                                  "--model names the forecaster or cost model)."),
    **options: Any,
) -> None:
    """Train a pipeline here with a policy acting live; write events and actions."""
    if policy in WORK_POLICIES or arch == "packed" or options["replicas"] > 1:
        _run_planned(out, policy, model_uri, service, arch, actions_file, options)
        return
    from bubblecast.runtime.control.control_config import ControllerConfig, check_controllable
    from bubblecast.runtime.control.job import launch_controlled, write_actions

    config = train_config(out, arch, options)
    scripted = parse_actions(options["action"])
    control = ControllerConfig(policy=policy, every=every, model=model_uri, service=service,
                               timeout_s=forecast_timeout, lead_rise=lead_rise,
                               decide_in=decide_in,
                               layer_costs="measured" if config.layer_cost_every else "uniform")
    plan = config.plan
    check_controllable(plan.schedule, plan.stages, plan.microbatches, plan.chunks, control)
    actions_path = _output_paths(out, actions_file)
    forecaster = None
    if model_uri is not None:
        from bubblecast.runtime.control.forecasters import check_model_source

        forecaster = check_model_source(model_uri)
    decider = SERVICE_DECIDER if service is not None else None
    checkpoints = checkpoint_options(options)
    nodes = node_options(config, options)
    from bubblecast.runtime.jobdir import TrainingFailed
    from bubblecast.runtime.launch import on_nodes

    try:
        with on_nodes(nodes):  # launch_controlled runs the job through run_out_job
            summary = _launch_with_progress(config, lambda update: launch_controlled(
                config, control, out, scripted=scripted, on_progress=update, decider=decider,
                checkpoints=checkpoints))
    except TrainingFailed as exc:
        raise training_failed(exc) from None
    write_actions(actions_path, summary, control, config.run_id)
    result = _controlled_result(out, actions_path, config, policy, every, summary,
                                forecaster)
    if options["json_out"]:
        emit_json(result)
        return
    typer.echo(f"wrote {out} and {actions_path}: {config.steps} steps x {config.stages} "
               f"stages ({plan.schedule}), policy {policy}, "
               f"{1e3 * result['mean_step_s']:.2f} ms/step, "
               f"{result['throughput_samples_s']:.1f} samples/s, {result['actions_taken']} "
               f"action(s), partition {result['initial_partition']} -> {result['partition']}")


def _controlled_result(out: Path, actions_path: Path, config: Any, policy: str, every: int,
                       summary: dict[str, Any], forecaster: str | None) -> dict[str, Any]:
    """The ``run --json`` object of a controlled run (SPEC keys) from its summary."""
    plan = config.plan
    losses = list(summary["losses"].values())
    return {
        "out": str(out), "actions_file": str(actions_path), "run_id": config.run_id,
        "policy": policy, "every": every, "forecaster": summary.get("forecaster") or forecaster,
        "steps": config.steps, "stages": config.stages, "schedule": plan.schedule,
        "initial_partition": list(plan.partition), "partition": summary["partition"],
        "rows": summary["rows"], "wall_s": summary["wall_s"],
        "mean_step_s": summary["mean_step_s"],
        "throughput_samples_s": summary["throughput_samples_s"],
        "throughput_steps_s": summary["throughput_steps_s"],
        "actions_taken": summary["actions_taken"],
        "first_action_step": summary["first_action_step"],
        "decisions": summary["decisions_made"],
        "decision_latency_s": summary["decision_latency_s"],
        "control_pct_of_wall": summary["control_pct_of_wall"],
        "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None,
        "emulated_slowdown": config.inject, "first_step": summary["first_step"],
    }


def _check_planned(policy: str, model_uri: str | None, service: str | None, arch: str) -> None:
    """Refuse (one line) what a planned run cannot do, before anything starts."""
    if policy not in ("static", *WORK_POLICIES):
        raise BubblecastError(f"--policy {policy}: moves layers; packed-document and replicated "
                              f"runs plan each step's documents instead (static, "
                              f"{', '.join(WORK_POLICIES)})")
    if policy in WORK_POLICIES and arch != "packed":
        raise BubblecastError(f"--policy {policy}: plans packed documents; needs --arch packed, "
                              f"got '{arch}'")
    if service is not None:
        raise BubblecastError("--service: packed-document and replicated runs plan in process")
    if policy == "balance" and model_uri is None:
        raise BubblecastError("--policy balance: needs --model DIR, a cost model (`bubblecast "
                              "train EVENTS --model cost`) of an earlier collect")
    if policy != "balance" and model_uri is not None:
        raise BubblecastError(f"--model: only --policy balance reads a model here (a cost "
                              f"model); --policy {policy} plans without one")


def _run_planned(out: Path, policy: str, model_uri: str | None, service: str | None,
                 arch: str, actions_file: Path | None, options: dict[str, Any]) -> None:
    """``run`` of the packed model or replicated pipelines: every step planned live."""
    from bubblecast.runtime.jobdir import TrainingFailed
    from bubblecast.runtime.launch import run_out_job
    from bubblecast.telemetry.io import atomic_write_text

    _check_planned(policy, model_uri, service, arch)
    source = model_uri
    cost = None
    if model_uri is not None:
        from bubblecast.policy.plan_api import load_cost

        cost = load_cost(model_uri)  # refuses a forecaster, a model without tokens_sq
        if not model_uri.startswith(("models:/", "runs:/")):
            source = str(Path(model_uri).resolve())
    config = train_config(out, arch, options, planner=policy if arch == "packed" else "static",
                          cost_model=source)
    if cost is not None:
        from dataclasses import asdict

        from bubblecast.forecast.cost_model import shape_mismatch

        why = shape_mismatch(cost, asdict(config.model))
        if why:
            raise BubblecastError(f"--model {model_uri}: a cost model of another model shape: "
                                  f"{why}")
    checkpoints = checkpoint_options(options)
    nodes = node_options(config, options)
    actions_path = _output_paths(out, actions_file)
    try:
        summary = _launch_with_progress(config, lambda update: run_out_job(
            out, config, checkpoints=checkpoints, on_progress=update, nodes=nodes))
    except TrainingFailed as exc:
        raise training_failed(exc) from None
    decisions = summary.get("decisions", [])
    doc = {"run_id": config.run_id, "policy": policy, "cost_model": model_uri,
           "decisions": decisions, "applied": [], "final_partition": summary["partition"]}
    atomic_write_text(actions_path, json.dumps(doc, indent=1, default=float))
    result = planned_result(out, actions_path, policy, model_uri, config, summary)
    if options["json_out"]:
        emit_json(result)
        return
    typer.echo(f"wrote {out} and {actions_path}: {config.steps} steps x {config.replicas} "
               f"replica(s) x {config.stages} stages ({config.plan.schedule}), policy {policy}, "
               f"{1e3 * result['mean_step_s']:.2f} ms/step, "
               f"{result['throughput_samples_s']:.1f} samples/s, "
               f"{result['fallbacks']} fall-back(s)")


def planned_result(out: Path, actions_path: Path, policy: str, model_uri: str | None,
                   config: TrainConfig, summary: dict[str, Any]) -> dict[str, Any]:
    """The ``--json`` object of a planned run (samples: documents for the packed model)."""
    wall, steps = float(summary["wall_s"]), int(summary["steps"])
    decisions = summary.get("decisions", [])
    lat = [float(d["latency_s"]) for d in decisions if d.get("latency_s") is not None]
    samples = summary.get("documents_trained", steps * config.batch_size)
    losses = list(summary["losses"].values())
    return {
        "out": str(out), "actions_file": str(actions_path), "run_id": config.run_id,
        "policy": policy, "cost_model": model_uri, "steps": config.steps,
        "stages": config.stages, "replicas": config.replicas, "schedule": config.plan.schedule,
        "partition": summary["partition"], "rows": summary["rows"], "wall_s": wall,
        "mean_step_s": wall / max(steps, 1),
        "throughput_samples_s": samples / wall if wall > 0 else None,
        "throughput_tokens_s": summary["tokens_trained"] / wall
        if wall > 0 and "tokens_trained" in summary else None,
        "throughput_steps_s": steps / wall if wall > 0 else None,
        "actions_taken": 0, "decisions": len(decisions),
        "fallbacks": sum(1 for d in decisions if d.get("fallback")),
        "decision_latency_s": {"mean": sum(lat) / len(lat) if lat else None,
                               "max": max(lat) if lat else None},
        "counts": summary.get("counts"), "losses": summary["losses"],
        "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None,
        "emulated_slowdown": config.inject, "first_step": summary["first_step"],
    }


def _output_paths(out: Path, actions_file: Path | None) -> Path:
    """The actions file's path; one-line errors for a directory or a clash with ``--out``."""
    actions_path = actions_file or default_actions_path(out)
    for option, path in (("--out", out), ("--actions", actions_path)):
        if path.exists() and path.is_dir():
            raise BubblecastError(f"{option}: {path} is a directory")
    if actions_path.resolve() == out.resolve():
        raise BubblecastError("--actions: must differ from --out")
    return actions_path


def _launch_with_progress(config: TrainConfig, run: Callable[[Any], dict]) -> dict:
    """``run(update)`` the job; rank 0's progress as a rich bar on stderr when it is a
    terminal."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    console = Console(stderr=True)
    with Progress(TextColumn("[bold]run"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[loss]}"), console=console,
                  disable=not console.is_terminal) as bar:
        task = bar.add_task("run", total=config.steps, loss="")

        def update(step: int, total: int, loss: float | None) -> None:
            bar.update(task, completed=config.steps - total + step,
                       loss="" if loss is None else f"loss {loss:.4g}")

        return run(update)
