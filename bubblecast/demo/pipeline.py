"""The demo's data and forecasting stages, one function each: simulate, dataset, train, evaluate.

Each stage function takes the :class:`DemoConfig`, the :class:`Workspace` (to read the
outputs of finished stages), the running stage's :class:`StageContext` (to write into) and a
:class:`Progress`; it writes its files into ``ctx.dir`` and its figures (JSON-able, paths
relative to the output folder) into ``ctx.result``. Library calls only, no subprocesses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from bubblecast.demo.config import DemoConfig
from bubblecast.demo.mlstore import MODEL_NAME, DemoStore, sqlite_uri
from bubblecast.demo.progress import Progress
from bubblecast.demo.stages import StageContext, Workspace

SPLITS: tuple[str, ...] = ("train", "heldout")
MODELS: tuple[str, ...] = ("lgbm", "seq")


def suite_seed(config: DemoConfig, split: str) -> int:
    """Suite seed of a split: training and held-out runs never share a seed."""
    return 2 * config.seed + SPLITS.index(split)


def suite_runs(config: DemoConfig, split: str) -> list[Any]:
    """The simulator configs of a split: the forecast suite's shapes and seeds
    (``bubblecast.forecast.suite``), ``runs`` (or ``heldout_runs``) per scenario."""
    from bubblecast.forecast.suite import SHAPES
    from bubblecast.sim.simulator import SimConfig

    seed = suite_seed(config, split)
    n = config.runs if split == "train" else config.heldout_runs
    out = []
    for i, scenario in enumerate(config.scenarios):
        base = int(np.random.SeedSequence([seed, i]).generate_state(1)[0] % (2**31))
        for j in range(n):
            schedule, stages, m, chunks, model = SHAPES[j % len(SHAPES)]
            out.append(SimConfig(schedule=schedule, stages=stages, microbatches=m, chunks=chunks,
                                 model=model, steps=config.steps, replicas=config.replicas,
                                 scenario=scenario, seed=base + j, runs=1,
                                 run_id=f"{scenario}-s{seed}-{j}"))
    return out


def simulate_stage(config: DemoConfig, ws: Workspace, ctx: StageContext,
                   progress: Progress) -> None:
    """Simulate the training and held-out suites: one events file per run, per split folder
    (one file per run keeps each file's optional columns uniform)."""
    from bubblecast.demo.plots import plot_scenarios
    from bubblecast.sim.accounting import bubble_fraction, rank_step_table
    from bubblecast.sim.simulator import simulate_events
    from bubblecast.telemetry.io import write_events

    per_run: list[dict[str, Any]] = []
    examples = {}
    for split in SPLITS:
        sims = suite_runs(config, split)
        progress.note(f"{split} runs")
        for k, sim in enumerate(sims):
            events = simulate_events(sim)
            run_id = events.run_ids[0]
            write_events(events, ctx.dir / split / f"{run_id}.parquet")
            scenario = sim.scenario if isinstance(sim.scenario, str) else sim.scenario.name
            per_run.append({"split": split, "run_id": run_id, "scenario": scenario,
                            "schedule": sim.schedule,
                            "bubble_fraction": bubble_fraction(rank_step_table(events.frame))})
            if split == "train" and scenario not in examples:
                examples[scenario] = events
            progress.advance(k + 1, len(sims))
    progress.note("plotting")
    plot_scenarios(examples, ctx.dir / "scenarios.png")
    scen = {}
    for s in config.scenarios:
        rows = [r for r in per_run if r["scenario"] == s]
        scen[s] = {"runs": len(rows),
                   "bubble_fraction": float(np.mean([r["bubble_fraction"] for r in rows]))}
    ctx.result.update({
        "train": "simulate/train", "heldout": "simulate/heldout",
        "runs": {s: sum(r["split"] == s for r in per_run) for s in SPLITS},
        "steps": config.steps, "scenarios": scen, "per_run": per_run,
        "figure": "simulate/scenarios.png",
    })


def dataset_stage(config: DemoConfig, ws: Workspace, ctx: StageContext,
                  progress: Progress) -> None:
    """Features and per-horizon targets of both splits (``bubblecast dataset``)."""
    from bubblecast.dataset import build_dataset, write_features
    from bubblecast.telemetry.io import read_events

    out: dict[str, Any] = {"horizons": list(config.horizons), "windows": list(config.windows),
                           "lags": config.lags}
    for k, split in enumerate(SPLITS):
        progress.note(f"{split} features")
        events = read_events(ws.path("simulate", split))
        frame, meta = build_dataset(events, config.dataset_config(),
                                    sources=[f"simulate/{split}"])
        write_features(frame, meta, ctx.dir / f"{split}.parquet")
        out[split] = {"file": f"dataset/{split}.parquet", "rows": len(frame),
                      "runs": len(meta.runs), "fingerprint": meta.fingerprint,
                      "features": sum(c.startswith(("f_", "x")) for c in frame.columns)}
        progress.advance(k + 1, len(SPLITS))
    ctx.result.update(out)


def _model_params(config: DemoConfig, kind: str) -> dict[str, Any]:
    if kind == "lgbm":
        return {"seed": config.seed, "n_estimators": config.lgbm_estimators,
                "num_leaves": config.lgbm_leaves, "max_train_rows": config.max_train_rows}
    return {"seed": config.seed, "epochs": config.seq_epochs, "hidden": config.seq_hidden,
            "max_train_rows": config.max_train_rows}


def mean_skill(metrics: dict[str, dict[str, Any]]) -> float:
    """Mean over horizons of held-out skill (NaN when none)."""
    values = [m.get("skill") for m in metrics.values()]
    values = [float(v) for v in values if v is not None and np.isfinite(v)]
    return float(np.mean(values)) if values else float("nan")


def train_stage(config: DemoConfig, ws: Workspace, ctx: StageContext,
                progress: Progress) -> None:
    """Train LightGBM and the sequence model on the training suite (``bubblecast train``);
    log and register both in a fresh MLflow store, alias the better one ``champion``."""
    from bubblecast.forecast.training import train_model

    features = ws.path("dataset", "train.parquet")
    store = DemoStore(ws.out)
    db = uri = root = None
    if config.track:
        progress.note("creating the MLflow store")
        db, root = store.fresh(ctx.dir)
        uri = sqlite_uri(db)
    models: dict[str, Any] = {}
    for kind in MODELS:
        result = train_model(features, kind, ctx.dir / kind, params=_model_params(config, kind),
                             holdout=config.holdout, seed=config.seed, track=config.track,
                             tracking_uri=uri, register=MODEL_NAME if config.track else None,
                             alias=kind if config.track else None,
                             progress=lambda msg, k=kind: progress.note(f"{k}: {msg}"))
        models[kind] = {"dir": f"train/{kind}", "metrics": result["metrics"],
                        "rows": result["rows"], "runs": result["runs"],
                        "skill": mean_skill(result["metrics"]),
                        "mlflow_run_id": result.get("mlflow_run_id"),
                        "uri": result.get("registered", {}).get("uri")}
    skills = {k: m["skill"] for k, m in models.items()}
    champion = max(MODELS, key=lambda k: skills[k] if np.isfinite(skills[k]) else -np.inf)
    ctx.result.update({"models": models, "champion": champion, "tracked": config.track})
    if config.track:
        _alias_champion(uri, models[champion])
        ctx.result.update({"tracking_uri": store.uri, "artifact_root": root,
                           "champion_uri": f"models:/{MODEL_NAME}@champion",
                           "registered_model": MODEL_NAME})
        ctx.promote(db, store.db)


def _alias_champion(uri: str | None, model: dict[str, Any]) -> None:
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=uri)
    version = client.get_model_version_by_alias(MODEL_NAME, model["uri"].rsplit("@", 1)[1])
    client.set_registered_model_alias(MODEL_NAME, "champion", version.version)
    model["version"] = int(version.version)


def model_refs(ws: Workspace) -> dict[str, str]:
    """Where the trained models are: registry URIs when tracked, else their directories."""
    rec = ws.record("train") or {}
    models = rec.get("result", {}).get("models", {})
    return {k: (m["uri"] or str(ws.out / m["dir"])) for k, m in models.items()}


def champion_dir(ws: Workspace) -> Path:
    rec = (ws.record("train") or {}).get("result", {})
    return ws.out / rec["models"][rec["champion"]]["dir"]


def forecast_eval_stage(config: DemoConfig, ws: Workspace, ctx: StageContext,
                        progress: Progress) -> None:
    """Score both models and the baselines on the held-out suite (``bubblecast evaluate``):
    skill and interval coverage per horizon, per scenario; models loaded from the registry."""
    from bubblecast.demo.plots import plot_skill
    from bubblecast.forecast.evaluation_run import run_evaluation

    store = DemoStore(ws.out)
    db = store.working_copy(ctx.dir) if config.track else None
    uri = sqlite_uri(db) if db is not None else None
    refs = model_refs(ws)
    result = run_evaluation(ws.path("dataset", "heldout.parquet"), list(refs.values()),
                            seed=config.seed, track=config.track, tracking_uri=uri,
                            plot_dir=ctx.dir / "forecasts", progress=progress.note)
    table = result.table
    table.to_csv(ctx.dir / "evaluation.csv", index=False)
    progress.note("plotting")
    plot_skill(table, result.models, list(result.baselines), ctx.dir / "skill.png")
    overall = table[table["scenario"] == "all"]
    learnt = [m for m in result.models if m not in result.baselines]
    rows = [{k: getattr(r, k) for k in ("model", "horizon", "n", "mae", "coverage_80", "skill",
                                        "best_baseline")}
            for r in overall[overall["model"].isin(learnt)].sort_values(
                ["model", "horizon"]).itertuples()]
    per_scen = table[(table["scenario"] != "all") & table["model"].isin(learnt)]
    scen = {f"{r.model}/{r.scenario}/h{r.horizon}": r.skill for r in per_scen.itertuples()}
    bubbles = [] if result.bubbles is None else [
        {k: getattr(r, k) for k in ("model", "horizon", "n", "mae", "predicted", "actual")}
        for r in result.bubbles.itertuples()]
    ctx.result.update({
        "models": {name: ref for name, ref in zip(learnt, refs.values(), strict=False)},
        "baseline": result.baseline, "table": rows, "skill_per_scenario": scen,
        "bubbles": bubbles, "csv": "forecast_eval/evaluation.csv",
        "figure": "forecast_eval/skill.png",
        "forecast_figures": {m: f"forecast_eval/forecasts/{m}.png" for m in learnt},
    })
    if db is not None:
        ctx.promote(db, store.db)
