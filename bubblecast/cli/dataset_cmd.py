"""``bubblecast dataset RUNS... --out FEATURES``: events files -> a features file."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import typer

from bubblecast.cli import app
from bubblecast.cli.common import emit_json, format_option, parse_int_list
from bubblecast.cli.fleet_options import cluster_option, skip_bad_runs_option


@contextmanager
def progress_notes(enabled: bool = True) -> Iterator[Callable[[str], None]]:
    """A rich progress display on stderr; yields ``note(message)`` that starts a new phase."""
    if not enabled:
        yield lambda _msg: None
        return
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=console, transient=True, disable=not console.is_terminal) as bar:
        state: dict[str, int] = {}

        def note(message: str) -> None:
            if "task" in state:
                bar.update(state["task"], completed=1, total=1)
            state["task"] = bar.add_task(message, total=None)

        yield note


@app.command()
def dataset(
    runs: list[Path] = typer.Argument(..., help="Events files or directories (one or more)."),
    out: str = typer.Option(..., "--out", help="Features file to write (Parquet); DIR/ (and "
                            "always with --cluster) a dataset partitioned by run."),
    horizons: str = typer.Option("1,5,10", "--horizons", help="Steps ahead, comma-separated."),
    windows: str = typer.Option("5,20,60", "--windows",
                                help="Rolling windows in steps; the longest is the history."),
    lags: int = typer.Option(32, "--lags", help="Lagged values kept (sequence length)."),
    format: str = format_option(),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
    cluster: str | None = cluster_option(),
    skip_bad_runs: bool = skip_bad_runs_option(),
    covariates: str = typer.Option("none", "--covariates",
                                   help="none, or auto: covariate features from the device "
                                        "metrics (*.metrics beside the events) and run "
                                        "calendar present."),
    threads: int | None = typer.Option(None, "--threads",
                                       help="Threads for the features: N, or -1 (the default) "
                                            "every core, -2 all but one; the values are the "
                                            "same for any number."),
) -> None:
    """Build features and per-horizon targets (one row per run, replica, stage and step)."""
    from bubblecast.dataset import DatasetConfig
    from bubblecast.dataset.threads import resolve_jobs
    from bubblecast.errors import BubblecastError
    from bubblecast.telemetry.fleet import is_directory_target

    hz = parse_int_list(horizons, "--horizons")
    ws = parse_int_list(windows, "--windows")
    try:
        config = DatasetConfig(horizons=tuple(hz or ()), windows=tuple(ws or ()), lags=lags,
                               max_period=min(30, max(2, max(ws or [2]) // 2)),
                               covariates=covariates)
        jobs = resolve_jobs(threads)
    except ValueError as exc:
        raise BubblecastError(str(exc).replace("n_jobs", "--threads")) from None
    if cluster is not None or is_directory_target(out):
        summary = _partitioned(runs, out, config, format, cluster, skip_bad_runs, json_out, jobs)
    else:
        summary = _in_process(runs, out, config, format, skip_bad_runs, json_out, jobs)
    if config.covariates != "none":
        summary["covariates"] = config.covariates
    if json_out:
        emit_json(summary)
    else:
        typer.echo(f"wrote {summary['rows']} rows ({summary['runs']} runs, "
                   f"{summary['features']} features, horizons {horizons}) to {out}")


def _partitioned(runs: list[Path], out: str, config: object, format: str, cluster: str | None,
                 skip_bad: bool, json_out: bool, jobs: int) -> dict:
    """Features built run by run (on Dask with ``cluster``) into a dataset partitioned by run."""
    from bubblecast.dataset.fleet_build import build_partitioned
    from bubblecast.execution import executor, note_skipped

    with executor(cluster, progress=not json_out) as ex:
        summary = build_partitioned(runs, out, config, ex, format=format, skip_bad=skip_bad,
                                    sources=[str(p) for p in runs], n_jobs=jobs)
    note_skipped(summary.get("skipped_runs", []))
    return summary


def _in_process(runs: list[Path], out: str, config: object, format: str, skip_bad: bool,
                json_out: bool, jobs: int) -> dict:
    """Today's path: every input read into this process, one features file written."""
    from bubblecast.dataset import build_dataset, write_features
    from bubblecast.dataset.builder import load_for_dataset
    from bubblecast.errors import BubblecastError
    from bubblecast.execution import load_runs
    from bubblecast.telemetry.events import Events
    from bubblecast.telemetry.importers import require_per_op, timing_of

    with progress_notes(not json_out) as note:
        parts, skipped = [], []
        for path in runs:
            note(f"reading {path}")
            if skip_bad:
                ev, bad = load_runs([path], format, skip_bad=True, command="dataset")
                parts.append(ev)
                skipped += bad
                continue
            parts.append(load_for_dataset(path, format))  # only the columns it uses
            require_per_op(parts[-1], "dataset", path)
        events = parts[0] if len(parts) == 1 else Events.concat(parts)
        dupes = len(events.run_ids) != sum(len(p.run_ids) for p in parts)
        if dupes:
            raise BubblecastError("the inputs share run ids; each run must come from one file")
        metrics = None
        if config.covariates != "none":
            import pandas as pd

            from bubblecast.telemetry.metrics import read_metrics

            metrics = pd.concat([read_metrics(p) for p in runs], ignore_index=True)
        frame, meta = build_dataset(events, config, progress=note,
                                    sources=[str(p) for p in runs], metrics=metrics,
                                    n_jobs=jobs)
        note(f"writing {out}")
        write_features(frame, meta, out)
    summary = {"out": str(out), "rows": len(frame), "runs": len(meta.runs),
               "horizons": list(config.horizons),
               "features": sum(c.startswith(("f_", "x")) for c in frame.columns),
               "fingerprint": meta.fingerprint, "timing": timing_of(events)}
    if skip_bad:
        summary["skipped_runs"] = skipped
    return summary
