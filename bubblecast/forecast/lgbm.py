"""LightGBM forecaster: one quantile booster per (horizon, quantile), conformal intervals.

Training runs are split by run into train / validation (early stopping) / calibration; the
conformal shifts of p10 and p90 are fitted on the calibration runs alone, by volatility regime
(:func:`~bubblecast.forecast.conformal.regime_shifts`), never on a run the boosters learnt or
early-stopped on. Inputs are scale-free
(unit-bearing features over ``level``) and the target is ``log(y_h / level)``. Boosters are
saved in LightGBM's native text format; the rest of the state is JSON (no pickle).
"""

from __future__ import annotations

import os
import re
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from bubblecast.errors import BubblecastError
from bubblecast.forecast.base import (
    ANCHORS,
    QUANTILES,
    Forecaster,
    dataset_config_of,
    fit_splits,
    frame_horizons,
    generic,
    horizon_inputs,
    level_of,
    log_target,
    relative_inputs,
)
from bubblecast.forecast.conformal import (
    apply_bounds,
    apply_grouped,
    frame_regimes,
    group_bounds,
    matrix_groups,
    regime_columns,
    regime_shifts,
    regime_window,
    row_groups,
)
from bubblecast.forecast.lgbm_rows import MAX_ROWS, RowScorer

_LONG_LAG = re.compile(r"^f_u_(peer_)?lag(\d+)$")


def tabular_features(columns: list[str] | pd.Index, max_lag: int = 8) -> list[str]:
    """Shared inputs for tree models: every ``f_*`` except long lag lists (rolling stats cover
    them) and the constant ``level`` column itself."""
    out = []
    for c in columns:
        if not c.startswith("f_"):
            continue
        m = _LONG_LAG.match(c)
        if m and (int(m.group(2)) >= max_lag or (m.group(1) and int(m.group(2)) >= 1)):
            continue
        out.append(c)
    return out


class LGBMForecaster(Forecaster):
    """Gradient-boosted quantile regression on the tabular features."""

    kind: ClassVar[str] = "lgbm"

    def __init__(self, n_estimators: int = 400, learning_rate: float = 0.08,
                 num_leaves: int = 63, min_child_samples: int = 20,
                 feature_fraction: float = 0.8, early_stopping_rounds: int = 30,
                 val_fraction: float = 0.2, cal_fraction: float = 0.3, coverage: float = 0.8,
                 max_train_rows: int | None = 200_000, anchor: str = "level",
                 linear_tree: bool = False, seed: int = 0, n_jobs: int = 1) -> None:
        self.n_estimators = n_estimators
        self.learning_rate = learning_rate
        self.num_leaves = num_leaves
        self.min_child_samples = min_child_samples
        self.feature_fraction = feature_fraction
        self.early_stopping_rounds = early_stopping_rounds
        self.val_fraction = val_fraction
        self.cal_fraction = cal_fraction
        self.coverage = coverage
        self.max_train_rows = max_train_rows
        self.anchor = anchor
        self.linear_tree = linear_tree
        self.seed = seed
        self.n_jobs = n_jobs

    def booster_params(self, alpha: float) -> dict[str, Any]:
        """The LightGBM parameters of the ``alpha`` quantile's boosters (``lgb.train``'s;
        a distributed fit drops ``num_threads``)."""
        return {"objective": "quantile", "alpha": alpha, "learning_rate": self.learning_rate,
                "num_leaves": self.num_leaves, "min_data_in_leaf": self.min_child_samples,
                "feature_fraction": self.feature_fraction, "bagging_fraction": 0.8,
                "bagging_freq": 1, "lambda_l2": 1.0, "max_bin": 63, "seed": self.seed,
                "deterministic": True, "force_col_wise": True, "num_threads": self.n_jobs,
                "verbosity": -1, "linear_tree": self.linear_tree}

    def booster_inputs(self, frame: pd.DataFrame, h: int) -> np.ndarray:
        """The inputs of horizon ``h``'s boosters for ``frame``'s rows: the shared features,
        then horizon ``h``'s, unit-bearing ones divided by the anchor (float64, NaN kept)."""
        cols = self.features_ + [f"x{h}_{g[2:]}" for g in self.horizon_features_]
        return relative_inputs(frame, cols, anchor=self.anchor)

    def prepare(self, frame: pd.DataFrame) -> None:
        """Start a fit: forget an earlier one (boosters, shifts, cached input plans and row
        scorer) and take the horizons, dataset config and input columns from ``frame``'s
        columns and attrs (its rows may be none). :meth:`fit` starts with it, and so does the
        distributed fit of :mod:`bubblecast.forecast.dask_train`."""
        self._forget_caches()
        self.horizons_ = frame_horizons(frame)
        self.dataset_config_ = dataset_config_of(frame)
        self.features_ = tabular_features(frame.columns)
        self.horizon_features_ = [generic(c) for c in horizon_inputs(frame.columns,
                                                                     self.horizons_[0])]
        self.boosters_: dict[tuple[int, float], Any] = {}
        self.best_iterations_: dict[str, int] = {}
        self.shifts_: dict[int, dict[str, tuple[float, float]]] = {}
        self.validation_: dict[str, float] = {}

    def _forget_caches(self) -> None:
        """Drop the input plans and the row scorer built for the boosters held until now."""
        self.__dict__.pop("_plans", None)
        self.__dict__.pop("_rows", None)

    def fit(self, frame: pd.DataFrame) -> LGBMForecaster:
        import lightgbm as lgb

        self.prepare(frame)
        masks = fit_splits(frame, self.val_fraction, self.cal_fraction, self.seed)
        rng = np.random.default_rng(self.seed)
        names = self.features_ + self.horizon_features_
        window = regime_window(frame.columns)
        for h in self.horizons_:
            z = log_target(frame, h, self.anchor)
            parts = {}
            for split in ("train", "val", "cal"):
                rows = np.flatnonzero(masks[split] & np.isfinite(z))
                if split == "train" and self.max_train_rows and len(rows) > self.max_train_rows:
                    rows = np.sort(rng.choice(rows, self.max_train_rows, replace=False))
                parts[split] = rows
            if len(parts["train"]) == 0 or len(parts["val"]) == 0:
                raise BubblecastError(f"no training rows with a known target at horizon {h}")
            sub = {k: frame.iloc[v] for k, v in parts.items()}
            x = {k: self.booster_inputs(s, h) for k, s in sub.items()}
            train_set = lgb.Dataset(x["train"], z[parts["train"]], feature_name=names,
                                    free_raw_data=True)
            val_set = lgb.Dataset(x["val"], z[parts["val"]], reference=train_set)
            for q in QUANTILES:
                booster = lgb.train(
                    self.booster_params(q), train_set, num_boost_round=self.n_estimators,
                    valid_sets=[val_set],
                    callbacks=[lgb.early_stopping(self.early_stopping_rounds, verbose=False)])
                self.boosters_[(h, q)] = booster
                self.best_iterations_[f"h{h}_q{round(q * 100)}"] = int(booster.best_iteration)
            cal = np.sort(self.raw_scores(x["cal"], h), axis=1)
            self.shifts_[h] = regime_shifts(cal[:, 0], cal[:, 2], z[parts["cal"]],
                                            frame_regimes(sub["cal"], window), self.coverage,
                                            window=window)
        self.calibration_ = "interval"
        return self

    @property
    def calibration(self) -> str:
        """How ``shifts_`` apply: ``interval`` (fitted now) or ``shift`` (models saved before,
        or trained by :mod:`bubblecast.forecast.dask_train`)."""
        return str(getattr(self, "calibration_", "shift"))

    def raw_scores(self, x: np.ndarray, h: int) -> np.ndarray:
        """``(n, 3)`` raw scores (``log(y_h / anchor)`` per quantile, before sorting and the
        conformal shifts) of horizon ``h``'s boosters on inputs ``x``
        (:meth:`booster_inputs`)."""
        if 0 < len(x) <= MAX_ROWS and x.dtype == np.float32 and x.flags.c_contiguous:
            rows = self._row_scorer()
            if rows is not None:
                return rows.raw(x, h)
        cols = []
        for q in QUANTILES:
            b = self.boosters_[(h, q)]
            cols.append(b.predict(x, num_iteration=b.best_iteration or None,
                                  num_threads=self.n_jobs))
        return np.column_stack(cols) if cols and len(x) else np.zeros((len(x), 3))

    def _row_scorer(self) -> RowScorer | None:
        """The single-row scorer of these boosters (built and checked on first use; None where
        the shortcut does not reproduce ``Booster.predict``)."""
        if len(self.boosters_) < len(self.horizons_) * len(QUANTILES):
            return None  # mid-fit: not every booster is trained yet
        if "_rows" not in self.__dict__:
            width = len(self.features_) + len(self.horizon_features_)
            groups = {h: [self.boosters_[(h, q)] for q in QUANTILES] for h in self.horizons_}
            self.__dict__["_rows"] = RowScorer.build(groups, width)
        return self.__dict__["_rows"]

    def predict_signal(self, frame: pd.DataFrame, horizons: list[int]) -> dict[int, np.ndarray]:
        level = level_of(frame, self.anchor)
        out = {}
        for h in horizons:
            z = np.sort(self.raw_scores(self.booster_inputs(frame, h), h), axis=1)
            z = apply_grouped(z, self.shifts_[h], row_groups(self.shifts_[h], frame),
                              self.calibration)
            out[h] = level[:, None] * np.exp(z)
        return out

    # -- fast path: a plain float matrix in, no frames -------------------------------------
    def matrix_columns(self, horizons: list[int]) -> list[str]:
        """Column order of the ``X`` that :meth:`predict_matrix` takes for ``horizons``: the
        shared inputs, each horizon's inputs, then the anchor column, ``f_tokens_ratio`` and
        the two :func:`~bubblecast.forecast.conformal.regime_columns` (which pick the conformal
        group: :func:`~bubblecast.forecast.conformal.matrix_groups`)."""
        self.check_fitted()
        cols = list(self.features_)
        for h in horizons:
            cols += [f"x{h}_{g[2:]}" for g in self.horizon_features_]
        regime = regime_columns(self.shifts_[self.horizons_[0]])
        return cols + [ANCHORS[self.anchor], "f_tokens_ratio", *regime]

    def predict_matrix(self, X: np.ndarray, horizons: list[int]) -> np.ndarray:
        """``(n, H, 3)`` p10/p50/p90 of ``y`` from ``X`` ``(n, len(matrix_columns(horizons)))``:
        the numbers :meth:`predict_signal` gives for a frame holding those columns (same
        float32 inputs, one ``Booster.predict`` per booster over all rows, same shifts)."""
        self.check_fitted()
        hz = [int(h) for h in horizons]
        unknown = [h for h in hz if h not in self.shifts_]
        if unknown:
            raise BubblecastError(f"{self.kind} model forecasts horizons "
                                  f"{list(self.horizons_)}, not {unknown}")
        X = np.asarray(X, dtype=np.float64)
        nf, nh = len(self.features_), len(self.horizon_features_)
        if X.ndim != 2 or X.shape[1] != nf + nh * len(hz) + 4:
            raise BubblecastError(f"{self.kind} model: input matrix has shape {X.shape}, "
                                  f"expected (n, {nf + nh * len(hz) + 4})")
        anchor = X[:, -4]
        level = np.where(np.isfinite(anchor), np.maximum(anchor, 1e-12), np.nan)
        cols, scaled = self._matrix_plan(tuple(hz))
        values = X[:, cols]
        values = np.where(scaled, values / level[:, None], values)
        # (H, n, width) float32, C order: each horizon's rows contiguous (LightGBM copies
        # F-order input first; the single-row path needs C order)
        n, width = X.shape[0], nf + nh
        rows = np.ascontiguousarray(values.reshape(n, len(hz), width).transpose(1, 0, 2),
                                    dtype=np.float32)
        z = np.empty((len(hz), n, 3))
        for i, h in enumerate(hz):
            z[i] = self.raw_scores(rows[i], h)
        z.sort(axis=2)
        # every horizon's shifts at once (element by element: what apply_grouped gives per
        # horizon), each row's group read from the last three columns as row_groups reads a
        # frame's
        lo, hi = np.empty((len(hz), n)), np.empty((len(hz), n))
        for i, h in enumerate(hz):
            groups = matrix_groups(self.shifts_[h], *X[:, -3:].T)
            bounds = group_bounds(self.shifts_[h], int(groups.max(initial=0)) + 1)
            lo[i], hi[i] = bounds[0][groups], bounds[1][groups]
        z = apply_bounds(z, lo, hi, self.calibration)
        return level[:, None, None] * np.exp(z.transpose(1, 0, 2))

    def _matrix_plan(self, hz: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """Positions in ``X`` of the inputs of every requested horizon, in order, and which of
        them are divided by the anchor; cached."""
        cache = self.__dict__.setdefault("_plans", {})
        key = (hz, len(self.features_), len(self.horizon_features_))
        plan = cache.get(key)
        if plan is None:
            from bubblecast.dataset.features import is_scaled

            nf, nh = len(self.features_), len(self.horizon_features_)
            cols = np.concatenate([np.r_[np.arange(nf), nf + i * nh + np.arange(nh)]
                                   for i in range(len(hz))]).astype(np.intp)
            names = [c for h in hz for c in
                     self.features_ + [f"x{h}_{g[2:]}" for g in self.horizon_features_]]
            plan = cache[key] = (cols, np.array([is_scaled(c) for c in names])[None, :])
        return plan

    # -- persistence: native Booster text files plus JSON state ---------------------------
    @staticmethod
    def _file(h: int, q: float) -> str:
        return f"lgbm_h{h}_q{round(q * 100)}.txt"

    def save_native(self, directory: str) -> list[str]:
        files = []
        for (h, q), booster in self.boosters_.items():
            name = self._file(h, q)
            booster.save_model(os.path.join(directory, name),
                               num_iteration=booster.best_iteration or None)
            files.append(name)
        return files

    def state(self) -> dict[str, Any]:
        return {"horizons_": list(self.horizons_), "features_": self.features_,
                "horizon_features_": self.horizon_features_,
                "shifts_": {str(h): {g: list(v) for g, v in s.items()}
                            for h, s in self.shifts_.items()},
                "calibration_": self.calibration,
                "best_iterations_": self.best_iterations_}

    def load_state(self, state: dict[str, Any], directory: str) -> LGBMForecaster:
        import lightgbm as lgb

        super().load_state(state, directory)
        self._forget_caches()
        self.features_ = list(state["features_"])
        self.horizon_features_ = list(state["horizon_features_"])
        self.shifts_ = {int(h): {g: tuple(float(x) for x in v) for g, v in s.items()}
                        for h, s in state["shifts_"].items()}
        self.calibration_ = str(state.get("calibration_", "shift"))  # older models: shifts
        self.best_iterations_ = dict(state.get("best_iterations_", {}))
        self.boosters_ = {}
        for h in self.horizons_:
            for q in QUANTILES:
                path = os.path.join(directory, self._file(h, q))
                booster = lgb.Booster(model_file=path)
                booster.best_iteration = 0  # saved trimmed to the best iteration
                self.boosters_[(h, q)] = booster
        return self
