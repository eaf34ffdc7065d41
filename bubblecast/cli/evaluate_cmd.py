"""``bubblecast evaluate FEATURES --model URI|DIR ...``: models against the baselines;
``bubblecast evaluate EVENTS... --model DIR`` of a micro-batch cost model: its error."""

from __future__ import annotations

from pathlib import Path

import typer

from bubblecast.cli import app
from bubblecast.cli.common import emit_json
from bubblecast.cli.fleet_options import (
    FEATURES_ONLY,
    cluster_option,
    skip_bad_runs_option,
    skipped_into,
)


@app.command()
def evaluate(
    features: list[Path] = typer.Argument(
        ..., metavar="FEATURES|EVENTS...",
        help="Features file from `bubblecast dataset`; for a cost model, events files or "
             "directories (any number)."),
    model: list[str] = typer.Option([], "--model",
                                    help="Model directory or models:/NAME@ALIAS (repeatable)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
    tracking_uri: str | None = typer.Option(
        None, "--tracking-uri", help="MLflow store (default: $MLFLOW_TRACKING_URI, else "
                                     "sqlite:///mlflow.db in the working directory)."),
    no_track: bool = typer.Option(False, "--no-track", help="Do not log to MLflow."),
    plot: Path | None = typer.Option(None, "--plot",
                                     help="Write forecast-vs-actual PNGs into this directory."),
    seed: int = typer.Option(0, "--seed", help="Seed of the baselines' cross-fitting."),
    cluster: str | None = cluster_option(),
    skip_bad_runs: bool = skip_bad_runs_option(FEATURES_ONLY),
) -> None:
    """MAE, RMSE, MAPE, pinball, coverage and skill per horizon and scenario, with baselines;
    for a cost model, its error on events' compute ops."""
    from bubblecast.cli.dataset_cmd import progress_notes
    from bubblecast.errors import BubblecastError
    from bubblecast.execution import note_skipped
    from bubblecast.forecast.cost_model import CostModel
    from bubblecast.forecast.cost_modeldir import load_any_model
    from bubblecast.forecast.evaluation_run import check_fleet_options, run_evaluation

    check_fleet_options(cluster, skip_bad_runs)
    with progress_notes(not json_out) as note:
        loaded = []
        for ref in model:
            note(f"loading {ref}")
            loaded.append(load_any_model(ref, tracking_uri=tracking_uri))
        if any(isinstance(m, CostModel) for m in loaded):
            extra = [name for given, name in ((len(loaded) > 1, "a second --model"),
                                              (plot is not None, "--plot"),
                                              (cluster is not None, "--cluster"),
                                              (skip_bad_runs, "--skip-bad-runs")) if given]
            if extra:
                raise BubblecastError(f"--model: a cost model is evaluated on events on its "
                                      f"own, without {extra[0]}")
            _evaluate_cost(features, loaded[0], model[0], not no_track, tracking_uri,
                           json_out, note)
            return
        if len(features) != 1:
            raise BubblecastError(f"evaluate: forecasters are evaluated on one features file, "
                                  f"got {len(features)} paths")
        result = run_evaluation(features[0], model, seed=seed, track=not no_track,
                                tracking_uri=tracking_uri, plot_dir=plot, progress=note,
                                cluster=cluster, skip_bad=skip_bad_runs, loaded=loaded)
    skipped = getattr(result, "skipped_runs", None)
    note_skipped(skipped or [])
    if json_out:
        summary = skipped_into(result.summary(), skipped)
        if getattr(result, "covariates", None) is not None:
            summary["covariates"] = result.covariates  # type: ignore[attr-defined]
        emit_json(summary)
        return
    _print_evaluation(result)


def _evaluate_cost(paths: list[Path], model: object, ref: str, track: bool,
                   tracking_uri: str | None, json_out: bool, note: object) -> None:
    """A cost model's error on events read as ``policy-eval`` reads them; ``--json``: the
    score keys with ``model`` and ``runs``."""
    from bubblecast.forecast.evaluation_run import run_cost_evaluation
    from bubblecast.policy.api import load_runs

    listed = ", ".join(map(str, paths))
    where = listed if len(listed) <= 160 else f"{paths[0]} and {len(paths) - 1} more"
    note(f"reading {where}")  # type: ignore[operator]
    events = load_runs([str(p) for p in paths], command="evaluate")
    result = run_cost_evaluation(events, model, ref, where, track=track,  # type: ignore[arg-type]
                                 tracking_uri=tracking_uri, progress=note)  # type: ignore[arg-type]
    if json_out:
        emit_json(result)
        return
    typer.echo(f"cost model {ref} ({result['learner']}) on {result['rows']} ops "
               f"({result['runs']} runs): p50 relative error {result['p50_rel_error']:.4f}  "
               f"p90 {result['p90_rel_error']:.4f}  mae {result['mae_s']:.4g} s  coverage "
               f"p10-p90 {result['coverage_p10_p90']:.3f}")


def _print_evaluation(result: object) -> None:
    """Rich tables: every model per horizon, then the learnt models per scenario."""
    from rich.console import Console
    from rich.table import Table

    table = result.table  # type: ignore[attr-defined]
    console = Console()
    if not console.is_terminal:
        console = Console(width=140)
    for title, rows in (("all rows", table[table["scenario"] == "all"]),
                        ("per scenario", table[(table["scenario"] != "all")
                                               & ~table["model"].isin(result.baselines)])):
        if rows.empty:
            continue
        out = Table(title=title)
        cols = ["model", "scenario", "horizon", "n", "mae", "mae_s", "rmse", "mape",
                "pinball", "coverage_80", "skill", "best_baseline"]
        for col in cols:
            out.add_column(col, justify="left" if col in ("model", "scenario") else "right")
        for r in rows.sort_values(["model", "scenario", "horizon"]).itertuples():
            out.add_row(*[f"{getattr(r, c):.4g}" if isinstance(getattr(r, c), float)
                          else str(getattr(r, c)) for c in cols])
        console.print(out)
    console.print(f"best baseline: {result.baseline}")  # type: ignore[attr-defined]
    bubbles = getattr(result, "bubbles", None)
    if bubbles is not None and not bubbles.empty:
        out = Table(title="bubble fraction at step t+h: replayed with forecast vs actual "
                          "stage times")
        for col in ("model", "horizon", "n", "mae", "predicted", "actual"):
            out.add_column(col, justify="left" if col == "model" else "right")
        for r in bubbles.itertuples():
            out.add_row(r.model, str(r.horizon), str(r.n), f"{r.mae:.4f}",
                        f"{r.predicted:.4f}", f"{r.actual:.4f}")
        console.print(out)
    ablation = getattr(result, "covariates", None)
    if ablation is not None:
        out = Table(title=f"skill with and without covariates ({len(ablation['columns'])} "
                          "columns; same small LightGBM, half the runs held out)")
        for col in ("horizon", "n", "mae_last", "mae_without", "mae_with", "skill_without",
                    "skill_with"):
            out.add_column(col, justify="right")
        for r in ablation["rows"]:
            out.add_row(*[f"{v:.4g}" if isinstance(v, float) else str(v) for v in r.values()])
        console.print(out)
    for line in getattr(result, "notes", []):
        console.print(line)
