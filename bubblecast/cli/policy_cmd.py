"""``bubblecast policy-eval RUNS...``: offline evaluation of repartitioning policies, and of
work-balancing policies on packed-document runs (SPEC §3 "Work balancing")."""

from __future__ import annotations

from pathlib import Path

import typer

from bubblecast.cli import app
from bubblecast.cli.common import emit_json, format_option
from bubblecast.cli.fleet_options import cluster_option, skip_bad_runs_option


@app.command("policy-eval")
def policy_eval(
    runs: list[Path] = typer.Argument(..., help="Events files or directories (any --format)."),
    policies: str = typer.Option(
        "static,reactive,predictive,oracle", "--policies",
        help="Comma-separated: static, reactive, predictive, oracle; on packed-document runs "
        "static, tokens, balance, oracle (plans of each step's documents)."),
    model: str | None = typer.Option(
        None, "--model", help="Forecaster for the predictive policy and for balance's replica "
        "speeds: a model directory or a models:/ URI. Default: the built-in robust trend "
        "extrapolation."),
    cost_model: str | None = typer.Option(
        None, "--cost-model", help="The balance policy's micro-batch cost model (`train "
        "--model cost`): a model directory or a models:/ URI. Default: fitted online to each "
        "run's own earlier steps."),
    fallback: str | None = typer.Option(
        None, "--fallback", help="Where the --model cannot forecast a run (a device metric "
        "or the calendar it reads missing, a run too short): 'trend' evaluates that run with "
        "the built-in trend forecaster, said on stderr and in the JSON ('fallback'). Default: "
        "exit 2 naming the missing input."),
    optimum: float | None = typer.Option(
        None, "--optimum", help="Packed-document runs of one replica: also solve each step's "
        "best plan exactly (MILP, HiGHS) within SECONDS a step; reports optimum_step_s (no "
        "plan is faster, proven) and optimum_best_s (the best plan found).",
        metavar="SECONDS"),
    migration: Path | None = typer.Option(
        None, "--migration", help="JSON of migration constants (bandwidth_Bps, fixed_pause_s, "
        "optimizer_factor) or of measured migrations {\"migrations\": [{seconds, bytes}]} "
        "(also 'rows' or 'actions'). Default: fitted to the migrations a run records, else "
        "built-in constants."),
    param_bytes: float = typer.Option(
        0.0, "--param-bytes", help="Parameter bytes per layer when the run gives none."),
    memory_cap: float | None = typer.Option(
        None, "--memory-cap", help="Bytes a rank may hold (parameters, optimizer state and "
        "in-flight activations); partitions that exceed it are never chosen."),
    layers_per_stage: int = typer.Option(
        8, "--layers-per-stage", help="Layers assumed per stage for logged runs that say "
        "nothing about layers."),
    format: str = format_option(),
    run: list[str] | None = typer.Option(None, "--run", help="Only these run ids (repeatable)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
    plot: Path | None = typer.Option(
        None, "--plot", help="PNG of step time over steps per policy, actions marked."),
    cluster: str | None = cluster_option(),
    skip_bad_runs: bool = skip_bad_runs_option(),
) -> None:
    """Replay runs step by step under each policy and compare step times (counterfactual)."""
    from bubblecast.policy.cost import MigrationConstants
    from bubblecast.policy.policy_evaluation import EvalConfig, plot_traces

    names = [p.strip() for p in policies.split(",") if p.strip()]
    constants = MigrationConstants.from_json(migration) if migration is not None \
        else MigrationConstants()
    config = EvalConfig(migration=constants, param_bytes=param_bytes,
                        layers_per_stage=layers_per_stage, memory_cap=memory_cap,
                        migration_from_runs=migration is None, cost_model=cost_model,
                        fallback=fallback, optimum_s=optimum)
    if cluster is not None or skip_bad_runs:
        result, traces = _mapped(runs, names, config, format, model, run, cluster,
                                 skip_bad_runs, json_out)
    else:
        result, traces = _in_process(runs, names, config, format, model, run)
    if plot is not None:
        plot_traces(traces, plot)
    _note_fallback(result)
    if json_out:
        emit_json(result)
    else:
        _print(result, names)


def _in_process(runs: list[Path], names: list[str], config: object, format: str,
                model: str | None, run: list[str] | None) -> tuple[dict, dict]:
    """policy-eval over every input read into this process; a model reading covariates gets
    them from the device metrics beside the inputs."""
    from bubblecast.errors import BubblecastError
    from bubblecast.policy.api import load_runs
    from bubblecast.policy.policy_evaluation import evaluate_events
    from bubblecast.telemetry.importers import timing_of

    events = load_runs(runs, format, "policy-eval")
    seen = set(events.run_ids)
    missing = [r for r in run or [] if r not in seen]
    if missing:
        raise BubblecastError(f"--run: no run '{missing[0]}' (runs: "
                              f"{', '.join(sorted(seen)[:10])})")
    fc, metrics = None, None
    if model is not None and {"predictive", "balance"} & set(names):
        import pandas as pd

        from bubblecast.forecast.modeldir import load_model
        from bubblecast.telemetry.metrics import read_metrics

        fc = load_model(model)
        metrics = pd.concat([read_metrics(p) for p in runs], ignore_index=True)
    result, traces = evaluate_events(events, names, config, fc, run_ids=run or None,
                                     metrics=metrics)
    return {**result, "timing": timing_of(events)}, traces


def _note_fallback(result: dict) -> None:
    """One line on stderr when ``--fallback`` replaced the model on some runs."""
    fb = result.get("fallback")
    if fb:
        runs = fb["runs"]
        first = next(iter(runs))
        typer.echo(f"bubblecast: warning: --model could not forecast {len(runs)} run(s); "
                   f"fell back to the built-in {fb['forecaster']} forecaster there; "
                   f"{runs[first]}", err=True)


def _print(result: dict, names: list[str]) -> None:
    from bubblecast.cli.render import policy_rows

    typer.echo(f"mode: {result['mode']}  ({len(result['runs'])} runs)")
    typer.echo(f"note: {result['note']}")
    if result.get("forecaster"):
        typer.echo(f"forecaster: {result['forecaster']}")
    for line in policy_rows(result, names):
        typer.echo(line)


def _mapped(runs: list[Path], names: list[str], config: object, format: str,
            model: str | None, run: list[str] | None, cluster: str | None, skip_bad: bool,
            json_out: bool) -> tuple[dict, dict]:
    """policy-eval unit by unit (a fleet run by run; on Dask with ``cluster``), reduced here:
    the same report as the in-process path, plus ``skipped_runs`` with ``--skip-bad-runs``."""
    from bubblecast.errors import BubblecastError
    from bubblecast.execution import executor, note_skipped
    from bubblecast.policy.policy_evaluation import KNOWN, combine, evaluate_unit
    from bubblecast.telemetry.fleet import units_of

    bad = [n for n in names if n not in KNOWN]
    if bad or not names:
        raise BubblecastError(f"--policies: unknown policy '{bad[0]}' (known: "
                              f"{', '.join(KNOWN)})" if bad else
                              "--policies: name at least one policy")
    with executor(cluster, progress=not json_out) as ex:
        units = units_of([p.absolute() for p in runs] if ex.client is not None else runs)
        parts = ex.map(evaluate_unit, units, format, names, config, model, run, skip_bad,
                       label="policy-eval")
    seen = [r for p in parts for r in p["run_ids"]]
    if len(set(seen)) != len(seen):
        raise BubblecastError("the inputs share run ids; give each run once")
    missing = [r for r in run or [] if r not in seen]
    if missing:
        raise BubblecastError(f"--run: no run '{missing[0]}' (runs: "
                              f"{', '.join(sorted(seen)[:10])})")
    reports = [r for p in parts for r in p["reports"]]
    if run:
        reports.sort(key=lambda r: run.index(r["run_id"]))
    traces = {k: v for p in parts for k, v in p["traces"].items()}
    if not reports:
        raise BubblecastError("no run could be evaluated")
    timings = {p["timing"] for p in parts if "timing" in p}
    result = {**combine(reports, names, config),
              "timing": timings.pop() if len(timings) == 1 else "mixed"}
    skipped = [s for p in parts for s in p["skipped"]]
    note_skipped(skipped)
    if skip_bad:
        result["skipped_runs"] = skipped
    return result, traces
