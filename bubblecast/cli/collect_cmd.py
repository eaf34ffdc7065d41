"""``bubblecast collect``: run the pipeline trainer under torchrun here and record telemetry.

Everything is validated before any process starts (exit 2 and one line on a bad request);
the events file (SPEC §1, with the ``layers`` and ``tokens`` columns and the run metadata) is
written atomically by rank 0 at the end.
"""

from __future__ import annotations

from pathlib import Path

import typer

from bubblecast.cli import app
from bubblecast.cli.common import emit_json, parse_int_list
from bubblecast.errors import BubblecastError


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
def collect(
    out: Path = typer.Option(..., "--out", help="Events Parquet file to write."),
    model: str = typer.Option("mlp", "--model", help="Example model: mlp or gpt."),
    layers: int = typer.Option(8, "--layers", help="Layers of the model."),
    stages: int = typer.Option(2, "--stages", help="Pipeline stages (one process each)."),
    microbatches: int = typer.Option(4, "--microbatches", help="Micro-batches per step."),
    steps: int = typer.Option(50, "--steps", help="Optimizer steps to run."),
    schedule: str = typer.Option("1f1b", "--schedule",
                                 help="gpipe, 1f1b, interleaved, zb-h1, zb-interleaved, zbv, "
                                      "dualpipev (or a torch schedule class name)."),
    chunks: int | None = typer.Option(None, "--chunks", help="Model chunks per rank."),
    partition: str | None = typer.Option(None, "--partition",
                                         help="Layers per (virtual) stage, e.g. 3,5."),
    inject: str | None = typer.Option(None, "--inject",
                                      help="Emulated slowdown, e.g. rank=1,factor=2.0,start=100,"
                                           "ramp=50,end=400 or rank=0,every=50,extra=0.2."),
    action: list[str] | None = typer.Option(None, "--action",
                                            help="Scripted action before a step, repeatable: "
                                                 "20:repartition=3,5 | 30:microbatches=8 | "
                                                 "40:schedule=interleaved."),
    seed: int = typer.Option(0, "--seed", help="Seed of the model and the data."),
    batch_size: int | None = typer.Option(None, "--batch-size",
                                          help="Samples per step (default 4 x micro-batches)."),
    hidden: int = typer.Option(64, "--hidden", help="Hidden width."),
    seq_len: int = typer.Option(32, "--seq-len", help="Sequence length (gpt)."),
    vocab: int = typer.Option(256, "--vocab", help="Vocabulary size (gpt)."),
    heads: int = typer.Option(4, "--heads", help="Attention heads (gpt)."),
    dtype: str = typer.Option("float32", "--dtype", help="float32 or float64."),
    optimizer: str = typer.Option("adam", "--optimizer", help="sgd, adam or adamw."),
    lr: float = typer.Option(1e-3, "--lr", help="Learning rate."),
    flush_every: int = typer.Option(50, "--flush-every", help="Steps between Parquet writes."),
    layer_cost_every: int = typer.Option(10, "--layer-cost-every",
                                         help="Steps between per-layer cost samples (0 = off)."),
    profile: Path | None = typer.Option(None, "--profile",
                                        help="Directory for torch.profiler (Kineto) traces."),
    run_id: str | None = typer.Option(None, "--run-id", help="Run id (default: file stem)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Train a pipeline under torchrun on this machine and write its events file."""
    import json
    import shutil
    import tempfile

    from bubblecast.runtime.config import ModelSpec, TrainConfig
    from bubblecast.runtime.launch import failure_message, launch, write_job

    spec = ModelSpec(kind=model, layers=layers, hidden=hidden, seq_len=seq_len, vocab=vocab,
                     heads=heads, dtype=dtype)
    parts = parse_int_list(partition, "--partition")
    config = TrainConfig(
        model=spec, stages=stages, microbatches=microbatches, schedule=schedule, chunks=chunks,
        partition=tuple(parts) if parts else None, steps=steps,
        batch_size=batch_size if batch_size is not None else 4 * max(microbatches, 1),
        seed=seed, optimizer=optimizer, lr=lr, inject=inject,
        run_id=run_id or out.stem or "run", flush_every=flush_every,
        layer_cost_every=layer_cost_every, profile_dir=str(profile) if profile else None)
    actions = parse_actions(action)
    if out.exists() and out.is_dir():
        raise BubblecastError(f"--out: {out} is a directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    job_dir = Path(tempfile.mkdtemp(prefix=f".{out.name}.collect-", dir=out.parent))
    try:
        write_job(job_dir, config, out=str(out.resolve()), actions=actions, progress=True)
        code = _run_with_progress(job_dir, config, launch)
        if code != 0:
            raise RuntimeError(f"training failed ({failure_message(job_dir)})")
        summary = json.loads((job_dir / "summary.json").read_text())
    finally:
        shutil.rmtree(job_dir, ignore_errors=True)
    losses = list(summary["losses"].values())
    result = {
        "out": str(out), "run_id": config.run_id, "rows": summary["rows"], "steps": steps,
        "stages": stages, "schedule": config.plan.schedule,
        "microbatches": summary["microbatches"], "partition": summary["partition"],
        "wall_s": summary["wall_s"], "step_time_s": summary["step_time_s"],
        "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None,
        "actions": summary["actions"], "emulated_slowdown": inject,
    }
    if json_out:
        emit_json(result)
    else:
        typer.echo(f"wrote {out}: {result['rows']} rows, {steps} steps x {stages} stages "
                   f"({config.plan.schedule}), {1e3 * result['step_time_s']:.2f} ms/step, "
                   f"loss {result['first_loss']:.4g} -> {result['last_loss']:.4g}")


def _run_with_progress(job_dir: Path, config: object, launch: object) -> int:
    """Launch the job; draw rank 0's progress as a rich bar on stderr when it is a terminal."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    console = Console(stderr=True)
    steps, stages = config.steps, config.stages  # type: ignore[attr-defined]
    with Progress(TextColumn("[bold]collect"), BarColumn(), MofNCompleteColumn(),
                  TimeRemainingColumn(), TextColumn("{task.fields[loss]}"), console=console,
                  disable=not console.is_terminal, transient=False) as bar:
        task = bar.add_task("collect", total=steps, loss="")

        def update(step: int, total: int, loss: float | None) -> None:
            bar.update(task, completed=step, loss="" if loss is None else f"loss {loss:.4g}")

        return launch(job_dir, stages, on_progress=update)  # type: ignore[operator]
