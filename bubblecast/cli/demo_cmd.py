"""``bubblecast demo``: simulate, train, evaluate, inspect, run live; write a report."""

from __future__ import annotations

from pathlib import Path

import typer

from bubblecast.cli import app
from bubblecast.cli.common import emit_json


@app.command()
def demo(
    out: Path = typer.Option(Path("bubblecast-demo"), "--out",
                             help="Output folder (report, stage folders, MLflow store); an "
                                  "earlier demo there is replaced."),
    quick: bool = typer.Option(False, "--quick", help="A smaller suite and shorter runs."),
    seed: int = typer.Option(0, "--seed", help="Seed of every random choice."),
    no_live: bool = typer.Option(False, "--no-live", help="Skip the live closed loop."),
    megatron: Path | None = typer.Option(
        None, "--megatron", help="Megatron-LM trace to inspect (default: "
                                 "data/megatron-ops/trace-ST.parquet of the working directory, "
                                 "else the copy installed with bubblecast)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
    preset_name: str | None = typer.Option(None, "--preset", hidden=True,
                                           help="default, quick or tiny (smoke tests)."),
) -> None:
    """The end-to-end example on embedded defaults; prints where the report is."""
    import sys

    from rich.console import Console
    from rich.markup import escape

    from bubblecast.app.demo import preset, run_demo

    overrides: dict[str, object] = {"seed": seed}
    if no_live:
        overrides["live"] = False
    if megatron is not None:
        overrides["megatron"] = str(megatron)
    config = preset(preset_name or ("quick" if quick else "default"), **overrides)
    command = "bubblecast " + " ".join(sys.argv[1:]) if sys.argv[1:2] == ["demo"] else None
    console = Console(stderr=True, highlight=False)
    doc = run_demo(config, out, command=command, say=None if json_out else (
        lambda line: console.print(f"[green]✓[/green] {escape(line)}", soft_wrap=True)))
    if json_out:
        emit_json(doc)
        return
    lines = [f"report: {doc['report']}  ({doc['seconds']:.0f} s)"]
    if doc["mlflow_ui"]:
        lines.append(f"MLflow UI: {doc['mlflow_ui']}")
    lines.append(f"serve the champion: {doc['serve']}")
    typer.echo("\n".join(lines))
