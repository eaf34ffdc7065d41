"""``train --model lgbm --cluster ...``: the quantile boosters fitted with ``lightgbm.dask``.

The features stay partitioned by run on the workers: each part's inputs and targets are built
where it is read (the same scale-free inputs and log targets as :class:`LGBMForecaster`), the
boosters are trained by ``DaskLGBMRegressor`` over all workers, and only the calibration rows'
three raw scores, targets and groups come back for the conformal shifts. The runs' split into
train / validation / calibration is the in-process one (same runs). Differences from the
in-process fit: every training row is used (no ``max_train_rows`` sample), and early stopping
is applied after the fact (``lightgbm.dask`` has none): all ``n_estimators`` rounds are
trained, the validation runs' pinball loss after each round is computed here from the leaves
of a sample of their rows, and the booster is cut at the iteration LightGBM's early-stopping
rule would have kept. The result is an ordinary
:class:`LGBMForecaster`: saved, registered and served exactly as one trained in process.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bubblecast.errors import BubblecastError
from bubblecast.forecast.base import QUANTILES, fit_splits, log_target
from bubblecast.forecast.conformal import frame_regimes, regime_shifts, regime_window
from bubblecast.forecast.lgbm import LGBMForecaster

#: Validation rows (a seeded sample) scored to choose each booster's iteration count.
VALIDATION_ROWS = 20_000


def _read_part(path: str) -> pd.DataFrame:
    from bubblecast.dataset.store import read_features_table

    return read_features_table(path).to_pandas()


def _part_xy(path: str, model: LGBMForecaster, splits: dict[str, set[str]], split: str
             ) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """On a worker: one part's ``(inputs, log target)`` per horizon, rows of ``split`` runs
    with a known target only."""
    frame = _read_part(path)
    frame = frame.loc[frame["run_id"].astype(str).isin(splits[split])].reset_index(drop=True)
    out = {}
    for h in model.horizons_:
        z = log_target(frame, h, model.anchor)
        keep = np.isfinite(z)
        sub = frame.loc[keep]
        out[h] = (np.asarray(model.booster_inputs(sub, h), dtype=np.float32), z[keep])
    return out


def _part_cal(path: str, model: LGBMForecaster, runs: set[str], h: int, window: int | None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """On a worker: a calibration part's sorted raw scores, targets and volatility regime
    values (:func:`~bubblecast.forecast.conformal.frame_regimes` of ``window``)."""
    frame = _read_part(path)
    frame = frame.loc[frame["run_id"].astype(str).isin(runs)].reset_index(drop=True)
    z = log_target(frame, h, model.anchor)
    keep = np.isfinite(z)
    sub = frame.loc[keep].reset_index(drop=True)
    x = np.asarray(model.booster_inputs(sub, h), dtype=np.float32)
    raw = np.sort(model.raw_scores(x, h), axis=1)
    return raw, z[keep], frame_regimes(sub, window)


def best_iteration(curve: list[float], rounds: int) -> int:
    """The iteration (1-based) ``lgb.early_stopping(rounds)`` keeps on validation ``curve``."""
    best, best_i = np.inf, 0
    for i, value in enumerate(curve):
        if value < best:
            best, best_i = value, i
        elif i - best_i >= rounds:
            break
    return best_i + 1


def validation_curve(booster: Any, x: np.ndarray, z: np.ndarray, alpha: float) -> np.ndarray:
    """Mean pinball loss of ``booster`` on ``(x, z)`` after each iteration (what LightGBM's
    ``quantile`` metric on an ``eval_set`` reports), from the leaves each row falls in."""
    leaves = booster.predict(x, pred_leaf=True)
    leaves = leaves.reshape(len(x), -1)
    trees = booster.trees_to_dataframe()
    trees = trees[trees["left_child"].isna()]
    tree = trees["tree_index"].to_numpy()
    leaf = trees["node_index"].str.split("-L").str[1].astype(int).to_numpy()
    values = np.zeros((int(tree.max()) + 1, int(leaf.max()) + 1))
    values[tree, leaf] = trees["value"].to_numpy()
    pred = np.cumsum(values[np.arange(leaves.shape[1]), leaves], axis=1)
    r = z[:, None] - pred
    return np.mean(np.maximum(alpha * r, (alpha - 1) * r), axis=0)


def _validation_rows(client: Any, futures: list[Any], h: int, cap: int, seed: int
                     ) -> tuple[np.ndarray, np.ndarray]:
    """The validation runs' rows at horizon ``h`` in this process (a seeded sample of ``cap``
    rows at most: they only pick the iteration count)."""
    parts = client.gather(client.map(lambda d, h=h: d[h], futures, pure=False))
    x = np.concatenate([p[0] for p in parts])
    z = np.concatenate([p[1] for p in parts])
    if len(z) > cap:
        keep = np.sort(np.random.default_rng(seed).choice(len(z), cap, replace=False))
        x, z = x[keep], z[keep]
    return x, z


def _stack(client: Any, futures: list[Any], h: int, width: int) -> tuple[Any, Any]:
    """Dask arrays of the parts' ``(x, z)`` at horizon ``h`` (parts stay on the workers)."""
    import dask
    import dask.array as da

    sizes = client.gather(client.map(lambda d, h=h: len(d[h][1]), futures, pure=False))
    xs, zs = [], []
    for fut, n in zip(futures, sizes, strict=True):
        if n == 0:
            continue
        item = dask.delayed(lambda d, h=h: d[h])(fut)
        xs.append(da.from_delayed(item[0], shape=(n, width), dtype=np.float32))
        zs.append(da.from_delayed(item[1], shape=(n,), dtype=np.float64))
    if not xs:
        raise BubblecastError(f"no training rows with a known target at horizon {h}")
    return da.concatenate(xs), da.concatenate(zs)


def fit_dask(model: LGBMForecaster, files: list[Path], runs_frame: pd.DataFrame,
             schema_frame: pd.DataFrame, client: Any) -> LGBMForecaster:
    """Fit ``model``'s boosters with ``lightgbm.dask`` on the parts ``files`` (the fit runs,
    ``runs_frame``: one row per run with ``run_id`` and ``scenario``)."""
    from lightgbm.dask import DaskLGBMRegressor

    model.prepare(schema_frame)
    window = regime_window(schema_frame.columns)
    masks = fit_splits(runs_frame, model.val_fraction, model.cal_fraction, model.seed)
    ids = runs_frame["run_id"].astype(str).to_numpy()
    splits = {k: set(ids[m]) for k, m in masks.items()}
    paths = [str(f) for f in files]
    names = model.features_ + model.horizon_features_
    parts = {s: client.map(_part_xy, paths, model=model, splits=splits, split=s, pure=False)
             for s in ("train", "val")}
    for h in model.horizons_:
        x, z = _stack(client, parts["train"], h, len(names))
        xv, zv = _validation_rows(client, parts["val"], h, VALIDATION_ROWS, model.seed)
        if len(zv) == 0:
            raise BubblecastError(f"no validation rows with a known target at horizon {h}")
        for q in QUANTILES:
            params = {k: v for k, v in model.booster_params(q).items() if k != "num_threads"}
            reg = DaskLGBMRegressor(client=client, n_estimators=model.n_estimators, **params)
            reg.fit(x, z, feature_name=names)
            booster = reg.booster_
            curve = validation_curve(booster, xv, zv, q)
            booster.best_iteration = best_iteration(curve, model.early_stopping_rounds)
            model.boosters_[(h, q)] = booster
            model.best_iterations_[f"h{h}_q{round(q * 100)}"] = int(booster.best_iteration)
        shared = client.scatter(model, broadcast=True)  # the boosters, sent once per worker
        cal = client.gather(client.map(_part_cal, paths, model=shared, runs=splits["cal"], h=h,
                                       window=window, pure=False))
        raw = np.concatenate([c[0] for c in cal])
        zc = np.concatenate([c[1] for c in cal])
        regimes = np.concatenate([c[2] for c in cal])
        model.shifts_[h] = regime_shifts(raw[:, 0], raw[:, 2], zc, regimes, model.coverage,
                                         window=window)
    model.calibration_ = "interval"  # as LGBMForecaster.fit calibrates
    client.cancel(parts["train"] + parts["val"])
    return model


def train_dask(features: Path, model: LGBMForecaster, meta: Any, holdout: float, seed: int,
               cluster: str) -> tuple[LGBMForecaster, pd.DataFrame | None, dict[str, Any]]:
    """Split a partitioned features dataset's runs as ``train`` does, fit on the fit runs with
    Dask; the held-out runs' frame (read into this process to score them) and dataset info."""
    import pyarrow.parquet as pq

    from bubblecast.dataset.splits import split_runs
    from bubblecast.dataset.store import (
        features_part_schema,
        partition_files,
        read_features_meta,
        read_features_table,
    )
    from bubblecast.execution import executor

    files = [f.absolute() for f in partition_files(features, meta)]
    schema = features_part_schema(files[0])
    cols = ["run_id", "scenario"] if "scenario" in schema.names else ["run_id"]
    runs_frame = pd.concat([read_features_table(f, cols).to_pandas().head(1) for f in files],
                           ignore_index=True)
    runs_frame["run_id"] = runs_frame["run_id"].astype(str)
    fit_runs, test_runs = set(runs_frame["run_id"]), set()
    if holdout > 0 and len(runs_frame) >= 4:
        masks = split_runs(runs_frame, {"fit": 1.0 - holdout, "test": holdout}, seed=seed)
        test_runs = set(runs_frame.loc[masks["test"], "run_id"])
        fit_runs -= test_runs
    schema_frame = schema.empty_table().to_pandas()
    schema_frame.attrs["bubblecast_features"] = read_features_meta(features).to_json()
    run_of = {f: f.parent for f in files}
    from bubblecast.telemetry.fleet import run_id_of

    fit_files = [f for f in files if run_id_of(run_of[f]) in fit_runs]
    test_files = [f for f in files if run_id_of(run_of[f]) in test_runs]
    with executor(cluster) as ex:
        fit_dask(model, fit_files, runs_frame[runs_frame["run_id"].isin(fit_runs)]
                 .reset_index(drop=True), schema_frame, ex.client)
    test_frame = None
    if test_files:
        test_frame = pd.concat([_read_part(str(f)) for f in test_files], ignore_index=True)
        for col in ("run_id", "scenario"):
            if col in test_frame.columns:
                test_frame[col] = test_frame[col].astype(str).astype("category")
        test_frame.attrs = dict(schema_frame.attrs)
    rows = sum(pq.read_metadata(f).num_rows for f in fit_files)
    return model, test_frame, {"fit_rows": rows, "fit_runs": len(fit_runs),
                               "rows": rows + (len(test_frame) if test_frame is not None else 0),
                               "runs": len(runs_frame), "sample": _read_part(str(fit_files[0]))
                               .head(5)}


@functools.lru_cache(maxsize=8)
def _loaded(ref: str, tracking_uri: str | None) -> Any:
    from bubblecast.forecast.modeldir import load_model

    return load_model(ref, tracking_uri=tracking_uri)


def _part_predictions(path: str, refs: dict[str, str], tracking_uri: str | None,
                      horizons: dict[str, list[int]]) -> dict[str, dict[int, np.ndarray]]:
    """On a worker: each model's forecasts for one features part (models loaded once per
    worker process)."""
    frame = _read_part(path)
    for col in ("run_id", "scenario"):
        if col in frame.columns:
            frame[col] = frame[col].astype(str).astype("category")
    return {name: _loaded(ref, tracking_uri).predict_signal(frame, horizons[name])
            for name, ref in refs.items()}


def predictions_on_cluster(features: Path, meta: Any, refs: dict[str, str],
                           horizons: dict[str, list[int]], tracking_uri: str | None,
                           cluster: str) -> dict[str, dict[int, np.ndarray]]:
    """``evaluate --cluster``: every model's forecasts computed part by part on Dask, in the
    row order of :func:`bubblecast.dataset.store.read_features` on the same dataset."""
    from bubblecast.dataset.store import partition_files
    from bubblecast.execution import executor

    files = [str(f.absolute()) for f in partition_files(features, meta)]
    with executor(cluster) as ex:
        parts = ex.map(_part_predictions, files, refs, tracking_uri, horizons, label="forecasts")
    return {name: {h: np.concatenate([p[name][h] for p in parts]) for h in horizons[name]}
            for name in refs}


__all__ = ["VALIDATION_ROWS", "best_iteration", "fit_dask", "predictions_on_cluster",
           "train_dask", "validation_curve"]
