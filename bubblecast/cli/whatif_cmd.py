"""``bubblecast whatif FILE``: replay a run and answer the SPEC §3 counterfactuals."""

from __future__ import annotations

from pathlib import Path

import typer

from bubblecast.cli import app
from bubblecast.cli.common import emit_json, format_option
from bubblecast.cli.fleet_options import (
    cluster_option,
    local_analysis,
    skip_bad_runs_option,
    skipped_into,
)


@app.command()
def whatif(
    file: Path = typer.Argument(..., help="Events file or directory (or another format)."),
    format: str = format_option(),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
    run: str | None = typer.Option(None, "--run", help="Run id, when the file holds several."),
    launch_delays: bool = typer.Option(
        False, "--launch-delays",
        help="Keep each op's observed unexplained start delay (host launch gaps) in the replay."),
    cluster: str | None = cluster_option(),
    skip_bad_runs: bool = skip_bad_runs_option(),
) -> None:
    """Replay error, and step time when ideal, bottleneck fixed, slow ranks fixed, balanced."""
    if cluster is not None:  # the replay as one task on a Dask worker
        from bubblecast.cli.fleet_options import analyse

        result = analyse(cluster, file, format, run, "whatif",
                         {"launch_delays": launch_delays}, skip_bad=skip_bad_runs)
    else:
        analysis, skipped = local_analysis(file, format, run, skip_bad_runs)
        result = skipped_into(analysis.whatif(launch_delays=launch_delays), skipped)
    if json_out:
        emit_json(result)
    else:
        from bubblecast.cli.render import print_whatif

        print_whatif(result)
