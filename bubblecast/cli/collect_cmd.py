"""``bubblecast collect``: run the pipeline trainer under torchrun here and record telemetry.

Everything is validated before any process starts (exit 2 and one line on a bad request);
the events file (SPEC §1, with the ``layers`` and ``tokens`` columns and the run metadata) is
written atomically by rank 0 at the end. When training fails or the command is killed, the
telemetry recorded so far stays in ``OUT.partial`` beside it, and the error (one line, exit 1)
names the failed rank, the signal that killed it and that folder. ``--checkpoint-dir``,
``--checkpoint-every`` and ``--resume`` checkpoint and resume the run. The training options
and the config built from them are shared with ``bubblecast run`` (:func:`with_train_options`,
:func:`train_config`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from copy import copy
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import typer

from bubblecast.cli import app
from bubblecast.cli.common import emit_json, parse_int_list
from bubblecast.errors import BubblecastError

if TYPE_CHECKING:
    from bubblecast.runtime.checkpoint import CheckpointOptions
    from bubblecast.runtime.jobdir import TrainingFailed
    from bubblecast.runtime.launch import Nodes
    from bubblecast.runtime.train_config import TrainConfig

F = TypeVar("F", bound=Callable[..., Any])

#: The training options after a command's own, in ``--help`` order: name -> (type, option).
TRAIN_OPTIONS: dict[str, tuple[Any, Any]] = {
    "layers": (int, typer.Option(8, "--layers", help="Layers of the model.")),
    "stages": (int, typer.Option(2, "--stages", help="Pipeline stages (one process each).")),
    "replicas": (int, typer.Option(1, "--replicas",
                                   help="Data-parallel pipeline copies (replicas x stages "
                                        "processes; gradients all-reduced).")),
    "microbatches": (int, typer.Option(4, "--microbatches", help="Micro-batches per step.")),
    "steps": (int, typer.Option(50, "--steps", help="Optimizer steps to run.")),
    "schedule": (str, typer.Option("1f1b", "--schedule",
                                   help="gpipe, 1f1b, interleaved, zb-h1, zb-interleaved, zbv, "
                                        "dualpipev (or a torch schedule class name).")),
    "chunks": (int | None, typer.Option(None, "--chunks", help="Model chunks per rank.")),
    "partition": (str | None, typer.Option(None, "--partition",
                                           help="Layers per (virtual) stage, e.g. 3,5.")),
    "inject": (str | None, typer.Option(None, "--inject",
                                        help="Emulated slowdown, e.g. rank=1,factor=2.0,"
                                             "start=100,ramp=50,end=400 or rank=0,every=50,"
                                             "extra=0.2.")),
    "action": (list[str] | None, typer.Option(None, "--action",
                                              help="Scripted action before a step, repeatable: "
                                                   "20:repartition=3,5 | 30:microbatches=8 | "
                                                   "40:schedule=interleaved.")),
    "seed": (int, typer.Option(0, "--seed", help="Seed of the model and the data.")),
    "batch_size": (int | None, typer.Option(None, "--batch-size",
                                            help="Samples per step (default 4 x micro-batches).")),
    "hidden": (int, typer.Option(64, "--hidden", help="Hidden width.")),
    "seq_len": (int | None, typer.Option(
        None, "--seq-len", help="Sequence length (gpt; default 32), or the token budget of a "
        "packed micro-batch (packed; default 512).")),
    "documents": (str | None, typer.Option(
        None, "--documents", help="Packed model: the document lengths, a preset (lognormal, "
        "long-tail) or a JSON file of lengths (default lognormal).")),
    "vocab": (int, typer.Option(256, "--vocab", help="Vocabulary size (gpt).")),
    "heads": (int, typer.Option(4, "--heads", help="Attention heads (gpt).")),
    "dtype": (str, typer.Option("float32", "--dtype", help="float32 or float64.")),
    "optimizer": (str, typer.Option("adam", "--optimizer", help="sgd, adam or adamw.")),
    "lr": (float, typer.Option(1e-3, "--lr", help="Learning rate.")),
    "flush_every": (int, typer.Option(50, "--flush-every",
                                      help="Steps between Parquet writes.")),
    "layer_cost_every": (int, typer.Option(10, "--layer-cost-every",
                                           help="Steps between per-layer cost samples "
                                                "(0 = off).")),
    "profile": (Path | None, typer.Option(None, "--profile",
                                          help="Directory for torch.profiler (Kineto) traces.")),
    "run_id": (str | None, typer.Option(None, "--run-id", help="Run id (default: file stem).")),
    "checkpoint_dir": (Path | None, typer.Option(
        None, "--checkpoint-dir", help="Folder of checkpoints (step-K subfolders): written "
        "with --checkpoint-every, read by --resume.")),
    "checkpoint_every": (int | None, typer.Option(
        None, "--checkpoint-every", help="Save a checkpoint every N steps.")),
    "resume": (bool, typer.Option(
        False, "--resume", help="Continue from the latest checkpoint in --checkpoint-dir up to "
        "--steps (bit-identical losses); an earlier attempt's telemetry before it is kept.")),
    "nnodes": (int, typer.Option(
        1, "--nnodes", help="Nodes the stages are spread over (run the same command on each, "
        "same --out on a shared filesystem); > 1 needs --rdzv-endpoint.")),
    "rdzv_endpoint": (str | None, typer.Option(
        None, "--rdzv-endpoint", help="HOST:PORT of the c10d rendezvous (with --nnodes > 1).")),
    "rdzv_id": (str | None, typer.Option(
        None, "--rdzv-id", help="Rendezvous id, the same on every node (default: the run id).")),
    "json_out": (bool, typer.Option(False, "--json", help="Print one JSON object.")),
}
_MODEL_FIELDS = ("layers", "hidden", "vocab", "heads", "dtype")
_TRAIN_FIELDS = ("stages", "microbatches", "schedule", "chunks", "steps", "seed", "optimizer",
                 "lr", "inject", "flush_every", "layer_cost_every", "replicas", "documents")
#: ``--seq-len`` when not given: the GPT's sequence, the packed model's token budget.
DEFAULT_SEQ_LEN = {"packed": 512}


def with_train_options(**help_text: str) -> Callable[[F], F]:
    """Give a command :data:`TRAIN_OPTIONS` after its own options, passed in its ``**options``.

    ``help_text``: option name -> the help to show instead of collect's. Typer reads the
    command's ``__signature__``, so the options are declared once for ``collect`` and ``run``.
    """
    def decorate(func: F) -> F:
        sig = inspect.signature(func, eval_str=True)
        own = [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
        added = []
        for name, (kind, option) in TRAIN_OPTIONS.items():
            if name in help_text:
                option = copy(option)
                option.help = help_text[name]
            added.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY,
                                           default=option, annotation=kind))
        func.__signature__ = sig.replace(parameters=[*own, *added])  # type: ignore[attr-defined]
        return func

    return decorate


def train_config(out: Path, model: str, options: Mapping[str, Any],
                 **more: Any) -> TrainConfig:
    """The validated :class:`TrainConfig` of the events file ``out``, the example ``model``
    (``--model`` in ``collect``, ``--arch`` in ``run``) and the :data:`TRAIN_OPTIONS` values;
    ``more``: further config fields (``run``'s planner and cost model)."""
    from bubblecast.runtime.train_config import ModelSpec, TrainConfig

    seq_len = options["seq_len"] if options["seq_len"] is not None else \
        DEFAULT_SEQ_LEN.get(model, 32)
    spec = ModelSpec(kind=model, seq_len=seq_len,
                     **{name: options[name] for name in _MODEL_FIELDS})
    parts = parse_int_list(options["partition"], "--partition")
    batch_size, profile = options["batch_size"], options["profile"]
    return TrainConfig(
        model=spec, **{name: options[name] for name in _TRAIN_FIELDS},
        partition=tuple(parts) if parts else None,
        batch_size=batch_size if batch_size is not None else
        4 * max(options["microbatches"], 1) * max(options["replicas"], 1),
        run_id=options["run_id"] or out.stem or "run",
        profile_dir=str(profile) if profile else None, **more)


def node_options(config: TrainConfig, options: Mapping[str, Any]) -> Nodes:
    """The validated ``--nnodes/--rdzv-endpoint/--rdzv-id`` (one node by default); refuses
    ranks that do not split over the nodes or that the machine cannot start, and what
    replicated or packed runs do not support (scripted actions, checkpoints)."""
    from bubblecast.runtime.launch import Nodes, check_machine

    nodes = Nodes(options["nnodes"], options["rdzv_endpoint"], options["rdzv_id"])
    check_machine(config, nodes)
    if nodes.multi and (options["checkpoint_dir"] or options["resume"]):
        raise BubblecastError("--checkpoint-dir: checkpoints are not supported with --nnodes "
                              "> 1")
    fixed = config.replicas > 1 or config.model.packed
    what = f"--replicas {config.replicas}" if config.replicas > 1 else "--model packed"
    if fixed and options["action"]:
        raise BubblecastError(f"--action: {what} runs keep their plan (no scripted actions)")
    if fixed and (options["checkpoint_dir"] or options["resume"]):
        raise BubblecastError(f"--checkpoint-dir: checkpoints are not supported with {what}")
    return nodes


def checkpoint_options(options: Mapping[str, Any]) -> CheckpointOptions | None:
    """The validated ``--checkpoint-dir/--checkpoint-every/--resume`` (None when unused)."""
    from bubblecast.runtime.checkpoint import CheckpointOptions

    directory, every, resume = (options["checkpoint_dir"], options["checkpoint_every"],
                                options["resume"])
    if directory is None and every is None and not resume:
        return None
    return CheckpointOptions(directory=str(directory) if directory else None, every=every,
                             resume=resume)


def training_failed(exc: TrainingFailed) -> typer.Exit:
    """Print a failed job's one line (why, which rank, which signal, where the telemetry
    is) as the CLI prints errors; the exit to raise (1, or 130 when interrupted)."""
    line = " ".join(str(exc).split())
    typer.echo(f"bubblecast: error: {line}", err=True)
    return typer.Exit(exc.exit_code)


def parse_actions(items: list[str] | None) -> list[dict]:
    """``STEP:repartition=3,5``, ``STEP:microbatches=8``, ``STEP:schedule=NAME`` -> job actions."""
    from bubblecast.policy.actions import Repartition, SetMicrobatches, SetSchedule, action_to_json

    out = []
    for item in items or []:
        head, _, body = item.partition(":")
        kind, _, value = body.partition("=")
        try:
            step = int(head)
            if step < 0 or not value:
                raise ValueError
            if kind == "repartition":
                action = Repartition(tuple(int(x) for x in value.split(",")))
            elif kind == "microbatches":
                action = SetMicrobatches(int(value))
            elif kind == "schedule":
                action = SetSchedule(value)
            else:
                raise ValueError
        except ValueError:
            raise BubblecastError(f"--action: expected STEP:repartition=3,5, STEP:microbatches=N "
                                  f"or STEP:schedule=NAME, got '{item}'") from None
        out.append({"step": step, "action": action_to_json(action)})
    return out


@app.command()
@with_train_options()
def collect(
    out: Path = typer.Option(..., "--out", help="Events Parquet file to write."),
    model: str = typer.Option("mlp", "--model", help="Example model: mlp, gpt or packed (a "
                              "small GPT on packed documents, attention per document)."),
    **options: Any,
) -> None:
    """Train a pipeline under torchrun on this machine and write its events file."""
    from bubblecast.runtime.jobdir import TrainingFailed
    from bubblecast.runtime.launch import run_out_job

    config = train_config(out, model, options)
    actions = parse_actions(options["action"])
    checkpoints = checkpoint_options(options)
    nodes = node_options(config, options)
    if out.exists() and out.is_dir():
        raise BubblecastError(f"--out: {out} is a directory")
    try:
        summary = _run_with_progress(config, lambda update: run_out_job(
            out, config, actions=actions, checkpoints=checkpoints, on_progress=update,
            nodes=nodes))
    except TrainingFailed as exc:
        raise training_failed(exc) from None
    losses = list(summary["losses"].values())
    result = {
        "out": str(out), "run_id": config.run_id, "rows": summary["rows"],
        "steps": config.steps, "stages": config.stages, "schedule": config.plan.schedule,
        "microbatches": summary["microbatches"], "partition": summary["partition"],
        "wall_s": summary["wall_s"], "step_time_s": summary["step_time_s"],
        "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None,
        "actions": summary["actions"], "emulated_slowdown": config.inject,
        "first_step": summary["first_step"], "losses": summary["losses"],
        "replicas": config.replicas,
    }
    if config.model.packed:
        result.update(documents=config.documents or "lognormal", planner=summary["planner"],
                      documents_trained=summary["documents_trained"], counts=summary["counts"])
    if options["json_out"]:
        emit_json(result)
        return
    resumed = f", resumed at step {summary['first_step']}" if summary["first_step"] else ""
    typer.echo(f"wrote {out}: {result['rows']} rows, {config.steps} steps x "
               f"{config.stages} stages ({config.plan.schedule}{resumed}), "
               f"{1e3 * result['step_time_s']:.2f} ms/step, "
               f"loss {result['first_loss']:.4g} -> {result['last_loss']:.4g}")


def _run_with_progress(config: TrainConfig, run: Callable[[Any], dict]) -> dict:
    """``run(update)`` the job; draw rank 0's progress (``update(step, total, loss)``) as a
    rich bar on stderr when it is a terminal."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    console = Console(stderr=True)
    with Progress(TextColumn("[bold]collect"), BarColumn(), MofNCompleteColumn(),
                  TimeRemainingColumn(), TextColumn("{task.fields[loss]}"), console=console,
                  disable=not console.is_terminal, transient=False) as bar:
        task = bar.add_task("collect", total=config.steps, loss="")

        def update(step: int, total: int, loss: float | None) -> None:
            bar.update(task, completed=config.steps - total + step,
                       loss="" if loss is None else f"loss {loss:.4g}")

        return run(update)
