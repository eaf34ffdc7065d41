"""``bubblecast inspect FILE``: bubble accounting of a telemetry file (SPEC §3).

For a run imported from an external format, ``--json`` carries ``input_fixes``: what the
importer normalised in it (``{"negative_durations_clamped": N}``), from the run metadata; the
importer said it on stderr when N > 0. Bubblecast events are never fixed and carry none unless
their metadata records an earlier import's fixes.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from bubblecast.cli import app
from bubblecast.cli.common import emit_json, format_option, parse_int_list
from bubblecast.cli.fleet_options import (
    cluster_option,
    local_analysis,
    skip_bad_runs_option,
    skipped_into,
)

if TYPE_CHECKING:
    pass


@app.command()
def inspect(
    file: Path = typer.Argument(..., help="Events file or directory (or another format)."),
    format: str = format_option(),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
    plot: Path | None = typer.Option(
        None, "--plot", help="Write a PNG: schedule timeline of --steps and a stage x step "
                             "idle heatmap."),
    perfetto: Path | None = typer.Option(
        None, "--perfetto", help="Write a Chrome/Perfetto trace JSON (one process per rank)."),
    steps: str | None = typer.Option(
        None, "--steps", help="Logged steps for --plot (default: the first) and --perfetto "
                              "(default: all), comma-separated."),
    run: str | None = typer.Option(None, "--run", help="Run id, when the file holds several."),
    cluster: str | None = cluster_option(),
    skip_bad_runs: bool = skip_bad_runs_option(),
) -> None:
    """Bubble fraction, structural vs dynamic bubbles, bottleneck stage and slow ranks."""
    chosen = parse_int_list(steps, "--steps")
    if cluster is not None:  # the analysis as one task on a Dask worker
        from bubblecast.cli.fleet_options import analyse

        outputs = [(name, str(path), chosen) for name, path in
                   (("plot", plot), ("to_perfetto", perfetto)) if path is not None]
        summary = analyse(cluster, file, format, run, "summary", outputs=outputs,
                          skip_bad=skip_bad_runs)
    else:
        analysis, skipped = local_analysis(file, format, run, skip_bad_runs)
        summary = skipped_into(analysis.summary(), skipped)
        if plot is not None:
            analysis.plot(plot, steps=chosen)
        if perfetto is not None:
            analysis.to_perfetto(perfetto, steps=chosen)
    if json_out:
        emit_json(summary)
    else:
        from bubblecast.cli.render import print_summary

        print_summary(summary)
