"""``bubblecast simulate``: write a simulated ``events`` file (SPEC §3)."""

from __future__ import annotations

import typer

from bubblecast.cli import app
from bubblecast.cli.common import emit_json, parse_int_list
from bubblecast.sim.schedule_table import schedule_help


@app.command()
def simulate(
    schedule: str = typer.Option(..., "--schedule",
                                 help=schedule_help()),
    stages: int = typer.Option(..., "--stages", help="Pipeline stages P."),
    microbatches: int = typer.Option(..., "--microbatches", help="Microbatches M per step."),
    chunks: int = typer.Option(1, "--chunks", help="Model chunks V per rank "
                        "(multi-chunk schedules; V-shape ones hold 2)."),
    f: float | None = typer.Option(None, "--f", help="Forward ms per microbatch and stage [1]."),
    b: float | None = typer.Option(None, "--b", help="Backward (B) ms [1]."),
    w: float | None = typer.Option(None, "--w", help="Weight-gradient (W) ms [1]."),
    comm: float = typer.Option(0.0, "--comm", help="Communication ms between stages."),
    steps: int = typer.Option(1, "--steps", help="Optimizer steps."),
    replicas: int = typer.Option(1, "--replicas", help="Data-parallel replicas D."),
    scenario: str = typer.Option("none", "--scenario",
                                 help="none, jitter, throttle, thermal, failslow, periodic, "
                                      "seqlen, imbalance, slow-replica (needs --replicas >= 2) "
                                      "or mixed."),
    seed: int = typer.Option(0, "--seed", help="Random seed."),
    out: str = typer.Option(..., "--out", help="Events Parquet file to write; a directory "
                             "(DIR/) writes a fleet: one run_id=<id>/ per run."),
    model: str | None = typer.Option(None, "--model",
                                     help="uniform:L, a JSON layer-cost file or a PipeDream "
                                          "graph.txt profile."),
    partition: str | None = typer.Option(None, "--partition",
                                         help="Layers per stage, e.g. 3,5,4,4 "
                                              "(default: an even split)."),
    runs: int = typer.Option(1, "--runs", help="Independent runs (seeds derived from --seed)."),
    run_id: str = typer.Option("sim", "--run-id", help="Run id prefix (runs are PREFIX-k)."),
    documents: str | None = typer.Option(
        None, "--documents", help="Packed documents: lognormal (each at most a quarter of the "
        "token budget), long-tail (up to the whole budget) or a JSON file of lengths "
        "(a list, or {\"lengths\": [...]}); each micro-batch's cost follows its documents."),
    token_budget: int | None = typer.Option(
        None, "--token-budget", help="Tokens per packed micro-batch (with --documents) [4096]."),
    attention_share: float | None = typer.Option(
        None, "--attention-share", help="Attention's share of a micro-batch's cost at the mean "
        "document length, in [0, 1) (with --documents) [0.5]."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON summary object."),
) -> None:
    """Simulate a pipeline schedule and write its events."""
    from bubblecast.errors import BubblecastError
    from bubblecast.sim.documents import DEFAULT_ATTENTION_SHARE, DEFAULT_TOKEN_BUDGET
    from bubblecast.sim.simulator import SimConfig, write_simulation

    given = {name: value for name, value in (("--f", f), ("--b", b), ("--w", w))
             if value is not None}
    if model is not None and not model.startswith("uniform:") and given:
        raise BubblecastError(f"{', '.join(given)}: per-stage times cannot be combined with "
                              f"--model FILE (the file gives per-layer costs)")
    if documents is None and (token_budget is not None or attention_share is not None):
        option = "--token-budget" if token_budget is not None else "--attention-share"
        raise BubblecastError(f"{option}: needs --documents (it sets packed micro-batches)")
    config = SimConfig(
        schedule=schedule, stages=stages, microbatches=microbatches, chunks=chunks,
        f=1.0 if f is None else f, b=1.0 if b is None else b, w=1.0 if w is None else w,
        comm=comm, model=model, partition=parse_int_list(partition, "--partition"),
        steps=steps, replicas=replicas, scenario=scenario, seed=seed, runs=runs, run_id=run_id,
        documents=documents,
        token_budget=DEFAULT_TOKEN_BUDGET if token_budget is None else token_budget,
        attention_share=DEFAULT_ATTENTION_SHARE if attention_share is None else attention_share,
    )
    # events (a fleet directory: a run at a time), then device metrics beside them when any;
    # no pandas unless a scenario draws device metrics
    run_ids, n_events = write_simulation(config, out)
    if json_out:
        emit_json({"out": str(out), "runs": len(run_ids), "run_ids": run_ids,
                   "events": n_events})
    else:
        typer.echo(f"wrote {n_events} events of {len(run_ids)} run(s) to {out}")
