"""What ``bubblecast evaluate`` does: load models, evaluate with the baselines, log to MLflow;
for a micro-batch cost model, its error on events (:func:`run_cost_evaluation`)."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from bubblecast.dataset.fleet_build import read_features_skipping
from bubblecast.errors import BubblecastError
from bubblecast.forecast.baselines import BASELINES
from bubblecast.forecast.cost_model import CostModel
from bubblecast.forecast.forecast_evaluation import Evaluation, evaluate, unique_names
from bubblecast.forecast.modeldir import COST_KIND, load_model
from bubblecast.telemetry.events import Events


def check_fleet_options(cluster: str | None, skip_bad: bool) -> None:
    """``--skip-bad-runs`` and ``--cluster`` exclude each other for ``evaluate``: one-line
    BubblecastError (checked before any model is loaded)."""
    if skip_bad and cluster is not None:
        raise BubblecastError("--skip-bad-runs: not with --cluster for evaluate (drop one)")


def run_evaluation(features: str | os.PathLike[str], model_refs: list[str], seed: int = 0,
                   track: bool = True, tracking_uri: str | None = None,
                   plot_dir: str | os.PathLike[str] | None = None,
                   progress: Callable[[str], None] | None = None,
                   cluster: str | None = None, skip_bad: bool = False,
                   loaded: list[Any] | None = None) -> Evaluation:
    """Evaluate the models at ``model_refs`` (directories or ``models:/`` URIs; ``loaded``:
    the forecasters already loaded from them) on a file; with ``cluster`` the forecasts of a
    dataset partitioned by run are made on Dask. Of such a dataset, an unreadable part fails
    naming its run and file, or with ``skip_bad`` (not with ``cluster``) its run is left out
    and listed in the result's ``skipped_runs``."""
    note = progress or (lambda _msg: None)
    check_fleet_options(cluster, skip_bad)
    note(f"reading {features}")
    frame, meta, skipped = read_features_skipping(features, skip_bad)
    if loaded is None:
        loaded = []
        for ref in model_refs:
            note(f"loading {ref}")
            loaded.append(load_model(ref, tracking_uri=tracking_uri))
    names = model_names([m.kind for m in loaded])
    models = dict(zip(names, loaded, strict=True))
    preds = None
    if cluster is not None:
        from bubblecast.forecast.dask_train import predictions_on_cluster

        if not Path(features).is_dir():
            raise BubblecastError(f"{features}: --cluster needs a features dataset "
                                  "partitioned by run (`bubblecast dataset ... --out DIR/`)")
        note(f"forecasting {len(frame)} rows")
        preds = predictions_on_cluster(Path(features), meta, dict(zip(names, model_refs,
                                       strict=True)), _wanted(frame, models), tracking_uri,
                                       cluster)
    result, preds = score_models(frame, meta, models, seed=seed, predictions=preds,
                                 progress=note)
    pngs = []
    if plot_dir is not None:
        from bubblecast.forecast.plots import plot_forecasts

        note("plotting")
        for name, p in preds.items():
            pngs.append(plot_forecasts(frame, p, Path(plot_dir) / f"{name}.png", title=name))
    if track:
        note("logging to MLflow")
        _log_evaluation(result, meta.fingerprint, model_refs, names, seed, tracking_uri, frame,
                        preds, pngs)
    if skip_bad:
        result.skipped_runs = skipped  # type: ignore[attr-defined]
    return result


def run_cost_evaluation(events: Events, model: CostModel, ref: str, where: str = "events",
                        track: bool = True, tracking_uri: str | None = None,
                        progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """``evaluate EVENTS... --model DIR`` of a cost model: its error on the events' compute ops
    (:meth:`CostModel.score`: ``mae_s``, ``p50_rel_error``, ``p90_rel_error``,
    ``coverage_p10_p90``, ``rows``, ``learner``, ``runs``) with ``model`` ("cost"); logged to
    MLflow (``cost.*`` metrics) when ``track``."""
    note = progress or (lambda _msg: None)
    note(f"scoring {ref} on {len(events.run_ids)} runs")
    result = {"model": COST_KIND, **model.score(events, where)}
    if track:
        from bubblecast.forecast.tracking import mlflow_run

        note("logging to MLflow")
        tags = {"bubblecast.command": "evaluate", "bubblecast.kind": COST_KIND}
        with mlflow_run(tracking_uri, run_name="evaluate", tags=tags) as mlflow:
            mlflow.log_params({"model.cost": str(ref)[:500], "learner": model.learner_,
                               "runs": result["runs"], "events": where[:500]})
            mlflow.log_metrics({f"cost.{k}": float(v) for k, v in result.items()
                                if isinstance(v, (int, float)) and v == v})
    return result


def model_names(kinds: list[str]) -> list[str]:
    """The names ``evaluate`` reports models under: their kinds, numbered on repeats and
    where a baseline has the name (``ewma-2`` beside the ``ewma`` baseline)."""
    return unique_names(kinds, taken=list(BASELINES))


def _wanted(frame: pd.DataFrame, models: dict[str, Any]) -> dict[str, list[int]]:
    """Per model, the horizons it forecasts that the features have targets for."""
    return {name: [h for h in m.horizons_ if f"y_h{h}" in frame.columns]
            for name, m in models.items()}


def score_models(frame: pd.DataFrame, meta: Any, models: dict[str, Any], seed: int = 0,
                 predictions: dict[str, dict[int, Any]] | None = None,
                 progress: Callable[[str], None] | None = None
                 ) -> tuple[Evaluation, dict[str, dict[int, Any]]]:
    """Score fitted ``models`` (name -> forecaster) with the baselines on an in-memory features
    ``frame`` and its ``meta`` (as :func:`~bubblecast.dataset.store.read_features` returns):
    the evaluation (with covariate ablation and bubble replay when the data allow) and the
    forecasts ``{name: {h: (n, 3)}}`` (``predictions`` when given, else made here)."""
    note = progress or (lambda _msg: None)
    if predictions is None:
        note(f"forecasting {len(frame)} rows")
        wanted = _wanted(frame, models)
        predictions = {name: m.predict_signal(frame, wanted[name]) for name, m in models.items()}
    note("scoring")
    result = evaluate(frame, models, seed=seed, predictions=predictions)
    from bubblecast.dataset.covariates import covariate_columns

    if covariate_columns(frame.columns):
        note("skill with and without covariates")
        result.covariates = covariate_ablation(frame, seed=seed)  # type: ignore[attr-defined]
    if meta.run_info:
        note("replaying forecasts through the schedule")
        result.bubbles = bubbles_per_model(frame, predictions, meta.run_info)
    return result, predictions


def bubbles_per_model(frame: object, preds: dict, run_info: dict) -> pd.DataFrame:
    """Predicted vs actual bubble fraction per model and horizon (see forecast.bubbles)."""
    from bubblecast.forecast.bubbles import bubble_metrics, bubble_table

    parts = [bubble_metrics(bubble_table(frame, p, run_info)).assign(model=name)
             for name, p in preds.items()]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def _log_evaluation(result: Evaluation, fingerprint: str, refs: list[str], names: list[str],
                    seed: int, tracking_uri: str | None, frame: object, preds: dict,
                    pngs: list[Path]) -> None:
    from bubblecast.forecast.tracking import metric_dict, mlflow_run

    tags = {"bubblecast.command": "evaluate", "dataset_fingerprint": fingerprint}
    with mlflow_run(tracking_uri, run_name="evaluate", tags=tags) as mlflow:
        mlflow.log_params({"dataset_fingerprint": fingerprint, "seed": seed,
                           "baseline": result.baseline,
                           **{f"model.{n}": str(r)[:500] for n, r in zip(names, refs,
                                                                       strict=True)}})
        mlflow.log_metrics(metric_dict(result.table))
        if result.bubbles is not None:
            mlflow.log_metrics({f"bubble.{r.model}.h{r.horizon}.mae": float(r.mae)
                                for r in result.bubbles.itertuples()})
        with tempfile.TemporaryDirectory() as tmp:
            table = Path(tmp) / "evaluation.csv"
            result.table.to_csv(table, index=False)
            summary = Path(tmp) / "summary.json"
            summary.write_text(json.dumps(result.summary(), indent=1, default=float))
            mlflow.log_artifact(str(table))
            mlflow.log_artifact(str(summary))
            if pngs:
                for png in pngs:
                    mlflow.log_artifact(str(png))
            elif preds:
                from bubblecast.forecast.plots import plot_forecasts

                for name, p in preds.items():
                    mlflow.log_artifact(str(plot_forecasts(frame, p, Path(tmp) / f"{name}.png",
                                                           title=name)))


def covariate_ablation(frame: pd.DataFrame, seed: int = 0) -> dict[str, Any]:
    """Skill with and without covariates, measured the same way for both: a small LightGBM
    median model per horizon (target ``log(y_h / level)``, scale-free inputs) fitted on half
    the runs (the first 60% of steps with a single run) and scored on the rest against the
    last value. ``{"columns": [...], "rows": [{horizon, n, mae_last, mae_without, mae_with,
    skill_without, skill_with}]}``."""
    import lightgbm as lgb
    import numpy as np

    from bubblecast.dataset.covariates import covariate_columns
    from bubblecast.dataset.features import (
        feature_columns,
        horizon_columns,
        horizons_of,
        is_scaled,
    )

    covs = set(covariate_columns(frame.columns))
    runs = sorted(str(r) for r in frame["run_id"].unique())
    if len(runs) >= 2:
        order = np.random.default_rng(seed).permutation(len(runs))
        held = {runs[i] for i in order[: len(runs) // 2]}
        test = frame["run_id"].astype(str).isin(held).to_numpy()
    else:
        cut = frame["step"].quantile(0.6)
        test = (frame["step"] > cut).to_numpy()
    level = frame["level"].to_numpy(dtype=np.float64)
    rows = []
    for h in horizons_of(frame.columns):
        y = frame[f"y_h{h}"].to_numpy(dtype=np.float64)
        ok = np.isfinite(y) & (y > 0)
        cols = feature_columns(frame.columns) + horizon_columns(frame.columns, h)
        x_all = np.column_stack([frame[c].to_numpy(dtype=np.float64) / (level if is_scaled(c)
                                                                        else 1.0)
                                 for c in cols])
        target = np.log(np.where(ok, y, 1.0) / level)
        last = frame["f_u_lag0"].to_numpy(dtype=np.float64)
        mae: dict[str, float] = {"last": float(np.mean(np.abs(last - y)[ok & test]))}
        for label, keep in (("without", [i for i, c in enumerate(cols) if c not in covs]),
                            ("with", list(range(len(cols))))):
            model = lgb.LGBMRegressor(objective="l1", n_estimators=150, learning_rate=0.05,
                                      num_leaves=15, random_state=seed, deterministic=True,
                                      verbose=-1, n_jobs=1)
            model.fit(x_all[ok & ~test][:, keep], target[ok & ~test])
            pred = level[ok & test] * np.exp(model.predict(x_all[ok & test][:, keep]))
            mae[label] = float(np.mean(np.abs(pred - y[ok & test])))
        rows.append({"horizon": h, "n": int((ok & test).sum()), "mae_last": mae["last"],
                     "mae_without": mae["without"], "mae_with": mae["with"],
                     "skill_without": 1.0 - mae["without"] / mae["last"],
                     "skill_with": 1.0 - mae["with"] / mae["last"]})
    return {"columns": sorted(covs), "rows": rows}
