"""Baseline forecasters: last value, EWMA, rolling median and seasonal naive.

Each reads its point forecast straight from the features frame (no look-ahead: the columns are
computed from data at or before the origin). ``fit`` picks the baseline's one parameter per
horizon (EWMA alpha, median window) by MAE on the training frame, and learns the p10/p90 of the
log-residuals per horizon so that baselines give intervals too.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import pandas as pd

from bubblecast.errors import BubblecastError
from bubblecast.forecast.base import Forecaster, dataset_config_of, frame_horizons

BASELINES: tuple[str, ...] = ("last", "ewma", "rolling_median", "seasonal_naive")


class Baseline(Forecaster):
    """Shared logic: candidate point columns per horizon, parameter choice, residual quantiles."""

    kind: ClassVar[str] = "baseline"

    def candidates(self, columns: pd.Index, h: int) -> list[str]:
        raise NotImplementedError

    def _point(self, frame: pd.DataFrame, column: str) -> np.ndarray:
        if column not in frame.columns:
            raise BubblecastError(f"features frame: missing column '{column}' the {self.kind} "
                                  "baseline needs")
        return frame[column].to_numpy(dtype=np.float64)

    def point(self, frame: pd.DataFrame, h: int) -> np.ndarray:
        return self._point(frame, self.column_[h])

    def fit(self, frame: pd.DataFrame) -> Baseline:
        self.horizons_ = frame_horizons(frame)
        self.dataset_config_ = dataset_config_of(frame)
        self.column_: dict[int, str] = {}
        self.residual_q_: dict[int, tuple[float, float]] = {}
        for h in self.horizons_:
            y = frame[f"y_h{h}"].to_numpy(dtype=np.float64)
            cands = self.candidates(frame.columns, h)
            if not cands:
                raise BubblecastError(f"features frame: no columns for the {self.kind} baseline "
                                      f"at horizon {h}")
            best, best_mae = cands[0], np.inf
            if len(cands) > 1:
                for col in cands:
                    err = np.abs(self._point(frame, col) - y)
                    mae = np.nanmean(err) if np.isfinite(err).any() else np.inf
                    if mae < best_mae:
                        best, best_mae = col, mae
            self.column_[h] = best
            p = self.point(frame, h)
            with np.errstate(divide="ignore", invalid="ignore"):
                r = np.log(y / p)
            r = r[np.isfinite(r)]
            self.residual_q_[h] = (float(np.quantile(r, 0.1)), float(np.quantile(r, 0.9))) \
                if len(r) else (0.0, 0.0)
        return self

    def predict_signal(self, frame: pd.DataFrame, horizons: list[int]) -> dict[int, np.ndarray]:
        out = {}
        for h in horizons:
            p = self.point(frame, h)
            lo, hi = self.residual_q_[h]
            out[h] = np.column_stack([p * np.exp(lo), p, p * np.exp(hi)])
        return out

    def state(self) -> dict[str, Any]:
        return {"horizons_": list(self.horizons_),
                "column_": {str(h): c for h, c in self.column_.items()},
                "residual_q_": {str(h): list(q) for h, q in self.residual_q_.items()}}

    def load_state(self, state: dict[str, Any], directory: str) -> Baseline:
        super().load_state(state, directory)
        self.column_ = {int(h): str(c) for h, c in state["column_"].items()}
        self.residual_q_ = {int(h): (float(q[0]), float(q[1]))
                            for h, q in state["residual_q_"].items()}
        return self


class LastValue(Baseline):
    """The latest observed value: y(t+h) = y(t)."""

    kind: ClassVar[str] = "last"

    def __init__(self) -> None:
        pass

    def candidates(self, columns: pd.Index, h: int) -> list[str]:
        return ["f_u_lag0"]


class EWMA(Baseline):
    """An exponentially weighted moving average; ``alpha=None`` picks it per horizon in fit."""

    kind: ClassVar[str] = "ewma"

    def __init__(self, alpha: float | None = None) -> None:
        self.alpha = alpha

    def candidates(self, columns: pd.Index, h: int) -> list[str]:
        cols = [c for c in columns if c.startswith("f_u_ewm")]
        if self.alpha is not None:
            cols = [c for c in cols if np.isclose(float(c[len("f_u_ewm"):]), self.alpha)]
        return cols


class RollingMedian(Baseline):
    """The median of the last ``window`` steps; ``window=None`` picks it per horizon in fit."""

    kind: ClassVar[str] = "rolling_median"

    def __init__(self, window: int | None = None) -> None:
        self.window = window

    def candidates(self, columns: pd.Index, h: int) -> list[str]:
        cols = [c for c in columns if c.startswith("f_u_q50_w")]
        if self.window is not None:
            cols = [c for c in cols if c == f"f_u_q50_w{self.window}"]
        return cols


class SeasonalNaive(Baseline):
    """The value one detected period before the target step, else the last value.

    The period is detected per series from the past alone (regular spike intervals, else the
    autocorrelation peak); the dataset stores the matching lagged value as ``x{h}_u_seasonal``.
    """

    kind: ClassVar[str] = "seasonal_naive"

    def __init__(self) -> None:
        pass

    def candidates(self, columns: pd.Index, h: int) -> list[str]:
        return [f"x{h}_u_seasonal"]

    def point(self, frame: pd.DataFrame, h: int) -> np.ndarray:
        seasonal = self._point(frame, self.column_[h])
        return np.where(np.isfinite(seasonal), seasonal, self._point(frame, "f_u_lag0"))


def make_baseline(name: str) -> Baseline:
    classes = {"last": LastValue, "ewma": EWMA, "rolling_median": RollingMedian,
               "seasonal_naive": SeasonalNaive}
    if name not in classes:
        raise BubblecastError(f"unknown baseline '{name}' (choose from {', '.join(BASELINES)})")
    return classes[name]()
