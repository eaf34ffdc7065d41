"""``bubblecast run``: ``collect`` plus the closed-loop controller (policy, forecaster).

Same options as ``collect`` (validated the same way, before any process starts) plus the
policy, the forecaster (``--model`` in process or ``--service``) and the decision interval;
``collect``'s ``--model mlp|gpt`` (the example network) is ``--arch`` here, since ``--model``
names the forecaster as everywhere else (``serve``, ``policy-eval``).
Writes the events file and an actions JSON (every decision, NoOps included, and every action
applied), both atomically.
"""

from __future__ import annotations

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
    from bubblecast.runtime.config import TrainConfig

#: What ``--service`` is asked through, injected into the runtime by import path (runtime never
#: imports serve): the workers import it.
SERVICE_DECIDER = "bubblecast.serve.decider:ServiceDecider"


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
    policy: str = typer.Option("static", "--policy", help="static, reactive or predictive."),
    model_uri: str | None = typer.Option(
        None, "--model",
        help="Forecaster of the predictive policy, served in process: a model directory or a "
        "models:/ URI. Default: the policy's built-in trend forecaster."),
    service: str | None = typer.Option(
        None, "--service", help="URL of a running `bubblecast serve` to ask for actions "
        "(/v1/recommend) instead; fail-open: no answer in time keeps the current plan."),
    every: int = typer.Option(10, "--every", help="Steps between decisions."),
    forecast_timeout: float = typer.Option(
        0.5, "--forecast-timeout", help="Seconds a forecast or service call may take."),
    actions_file: Path | None = typer.Option(
        None, "--actions", help="Actions JSON to write (default: OUT's stem + .actions.json)."),
    arch: str = typer.Option("mlp", "--arch",
                             help="Example model: mlp or gpt (collect's --model; here --model "
                                  "names the forecaster)."),
    **options: Any,
) -> None:
    """Train a pipeline here with a policy repartitioning it live; write events and actions."""
    from bubblecast.runtime.control.config import ControllerConfig, check_controllable
    from bubblecast.runtime.control.job import launch_controlled, write_actions

    config = train_config(out, arch, options)
    scripted = parse_actions(options["action"])
    control = ControllerConfig(policy=policy, every=every, model=model_uri, service=service,
                               timeout_s=forecast_timeout,
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
    losses = list(summary["losses"].values())
    result = {
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
    if options["json_out"]:
        emit_json(result)
        return
    typer.echo(f"wrote {out} and {actions_path}: {config.steps} steps x {config.stages} "
               f"stages ({plan.schedule}), policy {policy}, "
               f"{1e3 * result['mean_step_s']:.2f} ms/step, "
               f"{result['throughput_samples_s']:.1f} samples/s, {result['actions_taken']} "
               f"action(s), partition {result['initial_partition']} -> {result['partition']}")


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
