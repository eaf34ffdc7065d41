"""What ``bubblecast train`` does: fit on some runs, score on held-out runs, save, log.

The held-out runs (``holdout`` share, whole runs) are never seen by the model; their metrics
(and skill against the best baseline on the same rows) go into ``model.json`` and MLflow.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bubblecast.dataset.fleet_build import read_features_skipping
from bubblecast.dataset.splits import split_runs
from bubblecast.errors import BubblecastError
from bubblecast.forecast.modeldir import make_model, save_model

#: Runs a learnt model needs (train, validation and calibration runs, plus a held-out one).
MIN_RUNS = {"lgbm": 3, "seq": 3}


def holdout_metrics(evaluation: Any, name: str) -> dict[str, dict[str, Any]]:
    """Per-horizon metrics of model ``name`` from an :class:`Evaluation`."""
    rows = evaluation.table[(evaluation.table["scenario"] == "all")
                            & (evaluation.table["model"] == name)]
    out = {}
    for r in rows.itertuples():
        out[f"h{r.horizon}"] = {"mae": r.mae, "rmse": r.rmse, "mape": r.mape,
                                "pinball": r.pinball, "coverage_80": r.coverage_80,
                                "skill": r.skill, "baseline": r.best_baseline, "n": r.n}
    return out


def train_model(features: str | os.PathLike[str], kind: str, out: str | os.PathLike[str],
                params: dict[str, Any] | None = None, holdout: float = 0.2, seed: int = 0,
                track: bool = True, tracking_uri: str | None = None,
                register: str | None = None, alias: str | None = None,
                progress: Callable[[str], None] | None = None,
                cluster: str | None = None, skip_bad: bool = False) -> dict[str, Any]:
    """Train ``kind`` on ``features``; save to ``out``; log to MLflow when ``track``.

    With ``cluster`` (``local:N`` or ``tcp://HOST:PORT``) an ``lgbm`` model is fitted with
    ``lightgbm.dask`` on a features dataset partitioned by run (:mod:`.dask_train`). Of a
    dataset partitioned by run, an unreadable part fails naming its run and file, or with
    ``skip_bad`` (not with ``cluster``) its run is left out and listed (``skipped_runs``).
    A ``seq`` model on such a dataset is fitted from its parts, never reading the dataset
    whole (:func:`_train_seq_streamed`)."""
    note = progress or (lambda _msg: None)
    if cluster is not None:
        if skip_bad:
            raise BubblecastError("--skip-bad-runs: not with --cluster for train (drop one)")
        return _train_on_cluster(features, kind, out, params, holdout, seed, track,
                                 tracking_uri, register, alias, note, cluster)
    if kind == "seq" and Path(features).is_dir():
        return _train_seq_streamed(features, out, params, holdout, seed, track, tracking_uri,
                                   register, alias, note, skip_bad)
    note(f"reading {features}")
    frame, meta, skipped = read_features_skipping(features, skip_bad)
    model = make_model(kind, **(params or {}))
    runs = frame["run_id"].nunique()
    fit_mask, test_mask = _split(frame, kind, holdout, seed, features)
    fit_frame, test_frame = frame, None
    if test_mask is not None:
        fit_frame = frame.loc[fit_mask].reset_index(drop=True)
        test_frame = frame.loc[test_mask].reset_index(drop=True)
        fit_frame.attrs = dict(frame.attrs)  # keeps the dataset config with the model
    note(f"fitting {kind} on {len(fit_frame)} rows")
    model.fit(fit_frame)
    evaluation, preds, metrics = _score_holdout(model, kind, test_frame, seed, note)
    fit = {"fit_rows": len(fit_frame), "fit_runs": int(fit_frame["run_id"].nunique()),
           "rows": len(frame), "runs": runs, "sample": fit_frame.head(5),
           "holdout_note": _holdout_note(kind, runs, holdout, test_frame)}
    result = _finish(model, features, out, meta, test_frame, evaluation, preds, metrics, fit,
                     holdout, seed, track, tracking_uri, register, alias, note)
    if skip_bad:
        result["skipped_runs"] = skipped
    return result


def _split(frame: Any, kind: str, holdout: float, seed: int, features: Any
           ) -> tuple[Any, Any]:
    """``(fit, test)`` row masks of whole runs (test None: no held-out runs); refuses too
    few runs to fit ``kind``."""
    runs = frame["run_id"].nunique()
    need = MIN_RUNS.get(kind, 1)
    fit, test = None, None
    if holdout > 0 and runs >= need + 1 and runs >= 2:
        masks = split_runs(frame, {"fit": 1.0 - holdout, "test": holdout}, seed=seed)
        if masks["test"].any():
            fit, test = masks["fit"], masks["test"]
    fit_runs = runs if fit is None else frame.loc[fit, "run_id"].nunique()
    if fit_runs < need:
        raise BubblecastError(f"{features}: {kind} needs at least {need} runs to train, the "
                              f"file has {runs}")
    return fit, test


def _holdout_note(kind: str, runs: int, holdout: float, test_frame: Any) -> str | None:
    """Why no run was held out (None when some were): ``train`` reports it on stderr and as
    ``holdout_note`` in its JSON, beside the empty ``metrics``."""
    if test_frame is not None:
        return None
    if holdout <= 0:
        return "no run held out (--holdout 0): no held-out metrics"
    need = MIN_RUNS.get(kind, 1)
    return (f"no run held out: --holdout {holdout:g} of {runs} runs rounds to none "
            f"({kind} fits on at least {need}), so there are no held-out metrics; give more "
            f"runs or a larger --holdout (one run in {runs}: --holdout "
            f"{math.ceil(100 / runs) / 100:.2f})"
            if runs > need else
            f"no run held out: {kind} needs all {runs} runs to fit ({need} at least), so "
            f"there are no held-out metrics; give at least {need + 1} runs")


def _train_seq_streamed(features: Any, out: Any, params: dict[str, Any] | None,
                        holdout: float, seed: int, track: bool, tracking_uri: str | None,
                        register: str | None, alias: str | None,
                        note: Callable[[str], None], skip_bad: bool) -> dict[str, Any]:
    """``train --model seq`` on a features dataset partitioned by run, never holding it
    whole: the parts are scanned (checked; one row per run), the runs split as on the whole
    frame, the model fitted from the fit runs' parts (``fit_partitioned``) and scored on the
    held-out runs, the only rows read into one frame."""
    from bubblecast.dataset.partread import read_runs, scan_runs

    note(f"scanning {features}")
    scan = scan_runs(features, skip_bad)
    runs = scan.runs
    fit_mask, test_mask = _split(runs, "seq", holdout, seed, features)
    fit_runs = runs if fit_mask is None else runs.loc[fit_mask]
    test_frame = None if test_mask is None else \
        read_runs(scan, runs.loc[test_mask, "run_id"].tolist())
    model = make_model("seq", **(params or {}))
    note(f"fitting seq on {int(fit_runs['rows'].sum())} rows, streamed from their parts")
    model.fit_partitioned(features, sorted(fit_runs["run_id"].astype(str)))
    evaluation, preds, metrics = _score_holdout(model, "seq", test_frame, seed, note)
    sample = read_runs(scan, fit_runs["run_id"].head(1).tolist()).head(5)
    fit = {"fit_rows": int(fit_runs["rows"].sum()), "fit_runs": len(fit_runs),
           "rows": int(runs["rows"].sum()), "runs": len(runs), "sample": sample,
           "holdout_note": _holdout_note("seq", len(runs), holdout, test_frame)}
    result = _finish(model, features, out, scan.meta, test_frame, evaluation, preds, metrics,
                     fit, holdout, seed, track, tracking_uri, register, alias, note)
    if skip_bad:
        result["skipped_runs"] = scan.skipped
    return result


def _score_holdout(model: Any, kind: str, test_frame: Any, seed: int,
                   note: Callable[[str], None]) -> tuple[Any, Any, dict[str, Any]]:
    """``(evaluation, forecasts, metrics)`` of the fitted ``model`` on the held-out runs;
    ``(None, None, {})`` without any."""
    if test_frame is None:
        return None, None, {}
    from bubblecast.forecast.forecast_evaluation import evaluate

    note(f"scoring {test_frame['run_id'].nunique()} held-out runs")
    preds = model.predict_signal(test_frame, list(model.horizons_))
    evaluation = evaluate(test_frame, {kind: model}, seed=seed, predictions={kind: preds})
    return evaluation, preds, holdout_metrics(evaluation, kind)


def _finish(model: Any, features: Any, out: Any, meta: Any, test_frame: Any, evaluation: Any,
            preds: Any, metrics: dict[str, Any], fit: dict[str, Any], holdout: float,
            seed: int, track: bool, tracking_uri: str | None, register: str | None,
            alias: str | None, note: Callable[[str], None]) -> dict[str, Any]:
    """Save the model directory, log to MLflow; the ``train --json`` object."""
    note(f"saving {out}")
    dataset = {"fingerprint": meta.fingerprint, "path": str(features), "rows": fit["rows"],
               "runs": fit["runs"],
               "holdout_runs": sorted(test_frame["run_id"].astype(str).unique())
               if test_frame is not None else []}
    save_model(model, out, metrics=metrics, extra={"dataset": dataset})
    result: dict[str, Any] = {"kind": model.kind, "out": str(out), "rows": fit["fit_rows"],
                              "runs": fit["fit_runs"],
                              "horizons": list(model.horizons_), "metrics": metrics,
                              "fingerprint": meta.fingerprint}
    if fit.get("holdout_note"):
        result["holdout_note"] = fit["holdout_note"]
    if track:
        note("logging to MLflow")
        result.update(_log_training(model, out, fit, test_frame, evaluation, preds, meta,
                                    holdout, seed, tracking_uri, register, alias))
    return result


def _train_on_cluster(features: Any, kind: str, out: Any, params: dict[str, Any] | None,
                      holdout: float, seed: int, track: bool, tracking_uri: str | None,
                      register: str | None, alias: str | None, note: Callable[[str], None],
                      cluster: str) -> dict[str, Any]:
    """``train --cluster``: lgbm through ``lightgbm.dask`` on a dataset partitioned by run."""
    from bubblecast.dataset.store import read_features_meta
    from bubblecast.forecast.dask_train import train_dask

    if kind != "lgbm":
        raise BubblecastError(f"--cluster: only --model lgbm trains on Dask; {kind} trains in "
                              "one process (drop --cluster)")
    if not Path(features).is_dir():
        raise BubblecastError(f"{features}: --cluster needs a features dataset partitioned "
                              "by run (`bubblecast dataset ... --out DIR/` or --cluster)")
    meta = read_features_meta(features)
    model = make_model(kind, **(params or {}))
    note(f"fitting {kind} on Dask ({cluster})")
    model, test_frame, fit = train_dask(Path(features), model, meta, holdout, seed, cluster)
    fit["holdout_note"] = _holdout_note(kind, int(fit["runs"]), holdout, test_frame)
    evaluation, preds, metrics = _score_holdout(model, kind, test_frame, seed, note)
    return _finish(model, features, out, meta, test_frame, evaluation, preds, metrics, fit,
                   holdout, seed, track, tracking_uri, register, alias, note)


def _log_training(model: Any, out: str | os.PathLike[str], fit: dict[str, Any], test_frame: Any,
                  evaluation: Any, preds: Any, meta: Any, holdout: float, seed: int,
                  tracking_uri: str | None, register: str | None, alias: str | None
                  ) -> dict[str, Any]:
    from bubblecast.dataset.config import FEATURES_VERSION
    from bubblecast.forecast.modeldir import log_model
    from bubblecast.forecast.tracking import metric_dict, mlflow_run

    tags = {"bubblecast.command": "train", "bubblecast.kind": model.kind,
            "dataset_fingerprint": meta.fingerprint}
    with mlflow_run(tracking_uri, run_name=f"train-{model.kind}", tags=tags) as mlflow:
        params = {f"model.{k}": v for k, v in model.get_params().items()}
        params.update({"kind": model.kind, "seed": seed, "holdout": holdout,
                       "dataset_fingerprint": meta.fingerprint,
                       "features_version": FEATURES_VERSION, "rows": fit["fit_rows"],
                       "runs": fit["fit_runs"],
                       "horizons": ",".join(map(str, model.horizons_))})
        mlflow.log_params({k: str(v)[:500] for k, v in params.items()})
        if evaluation is not None:
            mlflow.log_metrics(metric_dict(evaluation.table, "holdout."))
        mlflow.log_artifact(str(Path(out) / "model.json"))
        if test_frame is not None and preds is not None:
            from bubblecast.forecast.plots import plot_forecasts

            with tempfile.TemporaryDirectory() as tmp:
                png = plot_forecasts(test_frame, preds, Path(tmp) / "forecast_vs_actual.png",
                                     title=f"{model.kind}: held-out runs")
                mlflow.log_artifact(str(png))
        sample_rows = (test_frame if test_frame is not None else fit["sample"]).head(5)
        logged = log_model(mlflow, out, sample_rows, register, alias)
        run_id = mlflow.active_run().info.run_id
    out_info: dict[str, Any] = {"mlflow_run_id": run_id, "model_uri": logged["model_uri"]}
    if register:
        out_info["registered"] = {k: logged[k] for k in ("name", "version", "uri")}
    return out_info
