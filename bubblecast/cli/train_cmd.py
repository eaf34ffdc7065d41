"""``bubblecast train FEATURES --model KIND``: fit a forecaster, save it, log it to MLflow;
``bubblecast train EVENTS... --model cost``: the same for the micro-batch cost model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from bubblecast.cli import app
from bubblecast.cli.common import emit_json
from bubblecast.cli.fleet_options import FEATURES_ONLY, cluster_option, skip_bad_runs_option


@app.command()
def train(
    features: list[Path] = typer.Argument(
        ..., metavar="FEATURES|EVENTS...",
        help="Features file from `bubblecast dataset`; with --model cost, events files or "
             "directories (any number)."),
    model: str = typer.Option(..., "--model",
                              help="lgbm, seq, or a baseline: last, ewma, rolling_median, "
                                   "seasonal_naive; or cost (the micro-batch cost model, "
                                   "trained on events)."),
    out: Path | None = typer.Option(None, "--out", help="Model directory to write."),
    register: str | None = typer.Option(None, "--register",
                                        help="Register the model under this MLflow name."),
    alias: str | None = typer.Option(None, "--alias",
                                     help="Point this registry alias (e.g. champion) at it."),
    tracking_uri: str | None = typer.Option(
        None, "--tracking-uri", help="MLflow store (default: $MLFLOW_TRACKING_URI, else "
                                     "sqlite:///mlflow.db in the working directory)."),
    no_track: bool = typer.Option(False, "--no-track", help="Do not log to MLflow."),
    seed: int = typer.Option(0, "--seed", help="Seed of every random choice."),
    holdout: float = typer.Option(0.2, "--holdout",
                                  help="Share of runs held out to report metrics (0: none)."),
    max_rows: int | None = typer.Option(None, "--max-rows",
                                        help="Cap on training rows (a seeded sample)."),
    epochs: int | None = typer.Option(None, "--epochs", help="Epochs (seq only)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
    cluster: str | None = cluster_option(),
    skip_bad_runs: bool = skip_bad_runs_option(FEATURES_ONLY),
) -> None:
    """Train a forecaster on a features file (or the cost model on events); report metrics on
    held-out runs."""
    import tempfile

    from bubblecast.cli.dataset_cmd import progress_notes
    from bubblecast.errors import BubblecastError
    from bubblecast.execution import note_skipped
    from bubblecast.forecast.modeldir import COST_KIND
    from bubblecast.forecast.training import train_model

    if alias and not register:
        raise BubblecastError("--alias needs --register NAME")
    if out is None and no_track:
        raise BubblecastError("nothing would be kept: give --out DIR, or drop --no-track")
    if not 0.0 <= holdout < 1.0:
        raise BubblecastError(f"--holdout: must be in [0, 1), got {holdout}")
    if model == COST_KIND:
        return _train_cost(features, out, max_rows, json_out, epochs, cluster, skip_bad_runs,
                           dict(register=register, alias=alias, seed=seed, holdout=holdout,
                                tracking_uri=tracking_uri, track=not no_track))
    if len(features) != 1:
        raise BubblecastError(f"--model {model} trains on one features file, got "
                              f"{len(features)} paths")
    params: dict[str, object] = {"seed": seed}
    if max_rows is not None:
        params["max_train_rows"] = max_rows
    if epochs is not None:
        params["epochs"] = epochs
    with progress_notes(not json_out) as note, tempfile.TemporaryDirectory() as tmp:
        target = out if out is not None else Path(tmp) / "model"
        result = train_model(features[0], model, target, params=params, holdout=holdout,
                             seed=seed, track=not no_track, tracking_uri=tracking_uri,
                             register=register, alias=alias, progress=note, cluster=cluster,
                             skip_bad=skip_bad_runs)
    note_skipped(result.get("skipped_runs", []))
    if result.get("holdout_note") and holdout > 0:
        typer.echo(f"warning: {result['holdout_note']}", err=True)
    if out is None:
        result.pop("out", None)
    if json_out:
        emit_json(result)
        return
    _echo_forecaster(result)


def _echo_forecaster(result: dict[str, Any]) -> None:
    """The text summary of ``train --model lgbm|seq|<baseline>`` (without --json)."""
    lines = [f"trained {result['kind']} on {result['rows']} rows ({result['runs']} runs)"]
    if "out" in result:
        lines.append(f"model directory: {result['out']}")
    for h, m in result.get("metrics", {}).items():
        lines.append(f"  {h}: mae {m['mae']:.4g}  coverage_80 {m['coverage_80']:.3f}  "
                     f"skill {m['skill']:.3f} (held-out runs, vs {m['baseline']})")
    if result.get("mlflow_run_id"):
        lines.append(f"MLflow run {result['mlflow_run_id']}")
    if result.get("registered"):
        lines.append(f"registered {result['registered']['uri']}")
    typer.echo("\n".join(lines))


def _train_cost(paths: list[Path], out: Path | None, max_rows: int | None, json_out: bool,
                epochs: int | None, cluster: str | None, skip_bad: bool,
                options: dict[str, object]) -> None:
    """``train EVENTS... --model cost``: read the events as ``policy-eval`` does, fit, save,
    log; print the result (``--json``: ``model``, ``learner``, ``out``, ``heldout``, ``rows``,
    ``runs``, and the MLflow keys when logged). ``epochs``, ``cluster`` and ``skip_bad`` are
    refused (they do not apply)."""
    import tempfile

    from bubblecast.cli.dataset_cmd import progress_notes
    from bubblecast.errors import BubblecastError
    from bubblecast.forecast.cost_training import train_cost_model
    from bubblecast.policy.api import load_runs

    for given, name in ((epochs is not None, "--epochs"), (cluster is not None, "--cluster"),
                        (skip_bad, "--skip-bad-runs")):
        if given:
            raise BubblecastError(f"{name}: not with --model cost")

    listed = ", ".join(map(str, paths))
    where = listed if len(listed) <= 160 else f"{paths[0]} and {len(paths) - 1} more"
    params = {} if max_rows is None else {"max_train_rows": max_rows}
    with progress_notes(not json_out) as note, tempfile.TemporaryDirectory() as tmp:
        note(f"reading {where}")
        events = load_runs([str(p) for p in paths], command="train --model cost")
        target = out if out is not None else Path(tmp) / "model"
        result = train_cost_model(events, target, where=where, params=params,
                                  progress=note, sources=paths,
                                  **options)  # type: ignore[arg-type]
    if out is None:
        result.pop("out", None)
    if json_out:
        emit_json(result)
        return
    lines = [f"trained cost model ({result['learner']}) on {result['rows']} rows "
             f"({result['runs']} runs)"]
    if "out" in result:
        lines.append(f"model directory: {result['out']}")
    held = result.get("heldout")
    if held:
        lines.append(f"  held-out runs: p50 relative error {held['p50_rel_error']:.4f}  p90 "
                     f"{held['p90_rel_error']:.4f}  mae {held['mae_s']:.4g} s  coverage "
                     f"p10-p90 {held['coverage_p10_p90']:.3f} ({held['rows']} ops)")
    if result.get("mlflow_run_id"):
        lines.append(f"MLflow run {result['mlflow_run_id']}")
    if result.get("registered"):
        lines.append(f"registered {result['registered']['uri']}")
    typer.echo("\n".join(lines))
