"""A trained forecaster with device-metric covariates, served in the live loop.

A model trained on ``bubblecast dataset --covariates auto`` features reads, besides the step
series, covariate columns computed from the ``device_metrics`` side table (``f_cov_*``:
:mod:`bubblecast.dataset.covariates`). The controller has those metrics too: every rank's
temperature per step and its slowdown temperature travel with the gathered compute
(:mod:`.observe`). :class:`CovariateModel` answers the served-model protocol
(:class:`bubblecast.forecast.served.ForecastModel`: ``predict_window``) for such a model
through the service's own path (:class:`bubblecast.dataset.online_frame.WithCovariates`): the
step-series features of the window from the served model's builder
(:meth:`bubblecast.forecast.served.FeatureModel.origin_rows`), the covariates at the origin
from the dataset's own code (:func:`bubblecast.dataset.covariates.origin_covariates`), so
both equal what the model was trained on for the same telemetry. Set :attr:`device` (device
metric rows with the window's step numbering, rank = stage: :func:`device_frame`) before each
forecast. A covariate
the metrics cannot give raises :class:`~bubblecast.policy.speeds.ForecastUnavailable` naming the
device metric: the decision keeps the plan and says why.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from bubblecast.dataset.window import Window
from bubblecast.policy.speeds import ForecastUnavailable

#: Device metrics the controller gathers from every rank (the others never reach rank 0).
GATHERED = ("temperature_c", "temperature_slowdown_c")


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
        #: device-metric rows in the window's step numbering (:func:`device_frame`)
        self.device: pd.DataFrame | None = None

    def predict_window(self, window: Window, horizons: Sequence[int]) -> np.ndarray:
        """``(stages, H, 3)`` quantiles of the delay signal at the window's last step."""
        from bubblecast.dataset.covariates import missing_inputs
        from bubblecast.dataset.online_frame import WithCovariates

        device = self.device
        if device is None or device.empty:
            raise ForecastUnavailable(f"model '{self.name}' reads device metrics "
                                      f"({', '.join(self.covariates[:2])}...); no rank "
                                      "reported any")
        seen = device[device["step"] <= window.steps - 1]
        lacking = missing_inputs(self.covariates, seen)
        if lacking:
            first = sorted(lacking)[0]
            raise ForecastUnavailable(f"model '{self.name}' reads device metric '{first}' "
                                      f"({lacking[first][0]}); no rank reported it")
        fed = WithCovariates(self.base, seen, list(range(window.stages)))
        return fed.predict_window(window, horizons)


def device_frame(temps: np.ndarray, slowdown: np.ndarray | None) -> pd.DataFrame:
    """Device-metric rows in a window's numbering: ``temps`` ``(T, P)`` at window rows
    ``0..T-1`` (NaN: none), ``slowdown`` ``(P,)`` reported from row 0 (NaN: none)."""
    row, rank = np.nonzero(np.isfinite(temps))
    parts = [pd.DataFrame({"step": row.astype(np.int64), "rank": rank.astype(np.int64),
                           "metric": GATHERED[0], "value": temps[row, rank]})]
    if slowdown is not None:
        ok = np.flatnonzero(np.isfinite(slowdown))
        parts.append(pd.DataFrame({"step": np.zeros(len(ok), dtype=np.int64),
                                   "rank": ok.astype(np.int64), "metric": GATHERED[1],
                                   "value": slowdown[ok]}))
    return pd.concat(parts, ignore_index=True)


def load_with_covariates(uri: str) -> Any:
    """The model at ``uri`` (loaded as the served path loads it), as a
    :class:`CovariateModel` when it reads covariates."""
    from bubblecast.forecast.served import default_loader

    obj = default_loader(uri)
    if hasattr(obj, "predict_signal") and covariate_columns_of(obj):
        return CovariateModel(obj)
    return obj


__all__ = ["GATHERED", "CovariateModel", "covariate_columns_of", "device_frame",
           "load_with_covariates"]
