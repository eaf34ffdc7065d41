"""What ``bubblecast evaluate`` does: load models, evaluate with the baselines, log to MLflow."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from bubblecast.dataset.store import read_features
from bubblecast.errors import BubblecastError
from bubblecast.forecast.baselines import BASELINES
from bubblecast.forecast.evaluate import Evaluation, evaluate, unique_names
from bubblecast.forecast.modeldir import load_model


def run_evaluation(features: str | os.PathLike[str], model_refs: list[str], seed: int = 0,
                   track: bool = True, tracking_uri: str | None = None,
                   plot_dir: str | os.PathLike[str] | None = None,
                   progress: Callable[[str], None] | None = None,
                   cluster: str | None = None) -> Evaluation:
    """Evaluate the models at ``model_refs`` (directories or ``models:/`` URIs) on a file;
    with ``cluster`` the forecasts of a dataset partitioned by run are made on Dask."""
    note = progress or (lambda _msg: None)
    note(f"reading {features}")
    frame, meta = read_features(features)
    loaded = []
    for ref in model_refs:
        note(f"loading {ref}")
        loaded.append(load_model(ref, tracking_uri=tracking_uri))
    names = unique_names([m.kind for m in loaded], taken=list(BASELINES))
    models = dict(zip(names, loaded, strict=True))
    note(f"forecasting {len(frame)} rows")
    wanted = {name: [h for h in m.horizons_ if f"y_h{h}" in frame.columns]
              for name, m in models.items()}
    if cluster is not None:
        from bubblecast.forecast.dask_train import predictions_on_cluster

        if not Path(features).is_dir():
            raise BubblecastError(f"{features}: --cluster needs a features dataset "
                                  "partitioned by run (`bubblecast dataset ... --out DIR/`)")
        preds = predictions_on_cluster(Path(features), meta, dict(zip(names, model_refs,
                                       strict=True)), wanted, tracking_uri, cluster)
    else:
        preds = {name: m.predict_signal(frame, wanted[name]) for name, m in models.items()}
    note("scoring")
    result = evaluate(frame, models, seed=seed, predictions=preds)
    if meta.run_info:
        note("replaying forecasts through the schedule")
        result.bubbles = bubbles_per_model(frame, preds, meta.run_info)
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
    return result


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
