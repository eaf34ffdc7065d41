"""A trained forecaster with device-metric covariates, served in the live loop.

A model trained on ``bubblecast dataset --covariates auto`` features reads, besides the step
series, covariate columns computed from the ``device_metrics`` side table (``f_cov_*``:
:mod:`bubblecast.dataset.covariates`). The controller has those metrics too: every rank's
temperature per step and its slowdown temperature travel with the gathered compute
(:mod:`.observe`). :class:`CovariateModel` answers the served-model protocol
(:class:`bubblecast.forecast.served.ForecastModel`: ``predict_window``) for such a model as the
service's :class:`bubblecast.dataset.online_frame.WithCovariates` does, from numpy alone: the
step-series features of the window (:func:`bubblecast.dataset.online.origin_matrix`, what the
served fast path computes) and the covariates at the origin from the dataset's own feature
definitions read off dense arrays (:func:`bubblecast.dataset.covariates.series_covariates`),
fed to the forecaster's ``predict_matrix`` (else its ``predict_signal`` on a column view). When
the model loads, this path's forecasts are checked against the exact one's on probe windows
(the served model's pandas origin rows and the covariates of the same device metrics as rows,
as the service computes them: :class:`~bubblecast.dataset.online_frame.WithCovariates`); where
they differ, the exact path is served and a warning logged. Set :attr:`device` (a
:class:`DeviceSeries`: per metric, a ``(T, P)`` array by window row and stage,
:func:`device_frame`) before each forecast. Unlike a request to the service, a live run may
lack a metric on every rank (a plain slowdown, a CPU without sensors): a metric no rank reports
gives NaN covariates, as the dataset gives a rank without it (the model was trained on such
rows: a thermal fault's healthy peers report no temperature); :attr:`CovariateModel.missing`
names it and the decision records it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from bubblecast.dataset.window import Window

#: Device metrics the controller gathers from every rank (the others never reach rank 0).
GATHERED = ("temperature_c", "temperature_slowdown_c")
#: Steps of the window the model's features are built from (at least twice its history).
KEEP = 128
#: Forecasts remembered, by their inputs: the forecast guard re-forecasts earlier origins at
#: every decision (its backtests), from the same rows as when they were the last.
MEMO = 64


def covariate_columns_of(forecaster: Any) -> list[str]:
    """The covariate feature columns a fitted forecaster reads (none: a plain model)."""
    from bubblecast.dataset.covariates import is_covariate
    from bubblecast.dataset.online_frame import model_columns

    return sorted(c for c in model_columns(forecaster) if is_covariate(c))


class CovariateModel:
    """``predict_window`` for a forecaster that reads covariates (module docstring)."""

    def __init__(self, forecaster: Any) -> None:
        from bubblecast.errors import BubblecastError
        from bubblecast.forecast.served import FeatureModel

        self.base = FeatureModel(forecaster, fast=False)
        self.forecaster = forecaster
        self.config = self.base.config
        self.horizons = self.base.horizons
        self.min_window = self.base.min_window
        self.name = self.base.name
        self.metrics = self.base.metrics  # the training metrics it reports (ModelInfo)
        self.covariates = covariate_columns_of(forecaster)
        from bubblecast.dataset.covariates import missing_inputs

        probe = pd.DataFrame({"step": 0, "rank": 0, "metric": list(GATHERED), "value": 0.0})
        lacking = missing_inputs(self.covariates, probe)
        if lacking:
            first = sorted(lacking)[0]
            raise BubblecastError(f"--model: the model reads device metric '{first}' "
                                  f"({lacking[first][0]}), which the controller does not "
                                  f"gather (it gathers {', '.join(GATHERED)})")
        #: device metrics in the window's row numbering (:func:`device_frame`)
        self.device: DeviceSeries | None = None
        #: device metrics the model reads that no rank reported at the last forecast: their
        #: covariates were NaN, as the dataset's for a rank without the metric
        self.missing: list[str] = []
        self._memo: OrderedDict[tuple[Any, ...], np.ndarray] = OrderedDict()
        from bubblecast.dataset.online_frame import FastFeatures

        #: the origin rows from numpy, covariates added, by the forecaster's ``predict_matrix``
        #: when it has one
        self.fast_features = FastFeatures(forecaster, self.config, mode="matrix" if hasattr(
            forecaster, "predict_matrix") else "light")
        self.fast = False
        self.fast = self._fast_agrees()

    def _fast_agrees(self) -> bool:
        """Whether the numpy path (origin matrix, array covariates, ``predict_matrix``) gives
        the exact (pandas) path's forecasts on probe windows (noise, drift, spikes, a
        repartition) with heating temperatures; else the exact path is kept and a warning
        logged."""
        import logging

        from bubblecast.forecast.served import probe_window

        hz = list(self.horizons)
        for seed in range(2):
            window = probe_window(self.min_window + 7 * seed, seed, stages=2)
            temps = np.stack([np.full(window.steps, 75.0),
                              np.linspace(75.0, 83.0, window.steps)], axis=1)
            self.device = device_frame(temps, np.array([85.0, 85.0]))
            try:
                fast = self._forecast(window, hz, fast=True)
            except Exception as exc:  # noqa: BLE001 - any failure means: not this path
                logging.getLogger("bubblecast.serve").info("fast rows unavailable: %s", exc)
                return False
            if not np.allclose(fast, self._forecast(window, hz, fast=False), rtol=1e-5,
                               atol=1e-12, equal_nan=True):
                logging.getLogger("bubblecast.serve").warning(
                    "model %s: served through the pandas feature path (slower)", self.name)
                return False
        self.device = None
        self._memo.clear()
        return True

    def predict_window(self, window: Window, horizons: Sequence[int]) -> np.ndarray:
        """``(stages, H, 3)`` quantiles of the delay signal at the window's last step, from its
        last :data:`KEEP` steps (the longest feature window and lags fit well inside)."""
        return self._forecast(window, [int(h) for h in horizons], self.fast)

    def _forecast(self, window: Window, hz: list[int], fast: bool) -> np.ndarray:
        from bubblecast.dataset.covariates import covariate_input, series_covariates

        cut = max(0, window.steps - max(KEEP, 2 * self.min_window))
        device = self.device if self.device is not None else device_frame(
            np.full((0, window.stages), np.nan), None)
        seen = {m: v[cut:window.steps] for m, v in device.values.items()}
        key = (window.steps, cut, tuple(hz), fast,
               tuple((m, hash(v.tobytes())) for m, v in sorted(seen.items())),
               float(np.nansum(window.compute[cut:])))
        if key in self._memo:
            self._memo.move_to_end(key)
            return self._memo[key].copy()
        if cut:
            window = window_tail(window, cut)
        present = {m for m, v in seen.items() if np.isfinite(v).any()}
        self.missing = sorted({covariate_input(c) for c in self.covariates} - present)
        origin = window.steps - 1
        if fast:
            cov = series_covariates(seen, origin, self.config, stages=window.stages)
            out = self._predict_fast(window, hz, cov)
        else:
            out = self._predict_exact(window, hz, DeviceSeries(seen).frame())
        self._memo[key] = out
        while len(self._memo) > MEMO:
            self._memo.popitem(last=False)
        return out.copy()

    def _predict_fast(self, window: Window, hz: list[int], cov: dict[str, np.ndarray]
                      ) -> np.ndarray:
        """The forecast from the numpy origin matrix and covariates (:attr:`fast_features`)."""
        nan = np.full(window.stages, np.nan, dtype=np.float32)
        return self.fast_features.predict(window, hz, {c: cov.get(c, nan) for c in self.covariates})

    def _predict_exact(self, window: Window, hz: list[int], rows_of: pd.DataFrame
                       ) -> np.ndarray:
        """The forecast from the served model's pandas origin rows and the covariates of the
        device rows (what the service computes for a request; the fast path's check)."""
        from bubblecast.dataset.online_frame import WithCovariates

        exact = WithCovariates(self.base, rows_of, list(range(window.stages)), fill=True)
        return exact.predict_window(window, hz)


def window_tail(window: Window, start: int) -> Window:
    """``window`` from row ``start`` on."""
    from dataclasses import replace

    def cut(a: np.ndarray | None) -> np.ndarray | None:
        return None if a is None else a[start:]

    return replace(window, compute=window.compute[start:], cost=window.cost[start:],
                   tokens=cut(window.tokens), layers=cut(window.layers))


class DeviceSeries:
    """Device metrics in a window's numbering as dense arrays: ``values[metric]`` ``(T, P)``,
    row ``i`` the window's row ``i``, column the stage (NaN: no sample)."""

    def __init__(self, values: dict[str, np.ndarray]) -> None:
        self.values = values

    def frame(self) -> pd.DataFrame:
        """The samples as device-metric rows (``step``, ``rank``, ``metric``, ``value``)."""
        parts = [pd.DataFrame({"step": [], "rank": [], "metric": [], "value": []})
                 .astype({"step": np.int64, "rank": np.int64, "value": np.float64})]
        for metric, v in self.values.items():
            row, rank = np.nonzero(np.isfinite(v))
            parts.append(pd.DataFrame({"step": row.astype(np.int64),
                                       "rank": rank.astype(np.int64), "metric": metric,
                                       "value": v[row, rank]}))
        return pd.concat(parts, ignore_index=True)


def device_frame(temps: np.ndarray, slowdown: np.ndarray | None) -> DeviceSeries:
    """The gathered device metrics in a window's numbering: ``temps`` ``(T, P)`` at window rows
    ``0..T-1`` (NaN: none), ``slowdown`` ``(P,)`` reported at row 0 (NaN: none)."""
    temps = np.asarray(temps, dtype=np.float64)
    values = {GATHERED[0]: temps}
    if slowdown is not None:
        rows = np.full((max(len(temps), 1), temps.shape[1]), np.nan)
        rows[0] = slowdown
        values[GATHERED[1]] = rows
    return DeviceSeries(values)


def load_with_covariates(uri: str) -> Any:
    """The model at ``uri`` (loaded as the served path loads it), as a
    :class:`CovariateModel` when it reads covariates."""
    from bubblecast.forecast.served import default_loader

    obj = default_loader(uri)
    if hasattr(obj, "predict_signal") and covariate_columns_of(obj):
        return CovariateModel(obj)
    return obj


__all__ = ["GATHERED", "CovariateModel", "DeviceSeries", "covariate_columns_of", "device_frame",
           "load_with_covariates"]
