"""The predictive policy's forecaster in the live loop, each way failing into "keep the plan".

- :func:`load_forecaster`: a trained model served in process
  (:func:`bubblecast.forecast.served.load_served`: a model directory or ``models:/`` URI,
  through the one model-to-speed adapter :class:`bubblecast.policy.speeds.ModelSpeeds`; a
  model with device-metric covariates as a :class:`.covariate_model.CovariateModel`), a
  ``module:factory`` import path, or the policy module's built-in trend forecaster.
- :func:`import_object`: dependency injection by import path (forecasters, external deciders).

A failure raises :class:`ForecastUnavailable` (or anything else); the decider turns it into a
decision to keep the current plan whose reason says what happened (a slow one is given up on
by the controller's decision thread, :mod:`.decision_thread`). The model loaders are imported
lazily.
"""

from __future__ import annotations

import importlib
from typing import Any

from bubblecast.errors import BubblecastError
from bubblecast.policy.speeds import CachingForecaster, ForecastUnavailable, ModelSpeeds

__all__ = ["CachingForecaster", "ForecastUnavailable", "ModelSpeeds", "check_model_source",
           "import_object", "load_forecaster"]


def import_object(path: str, what: str = "forecaster") -> Any:
    """``package.module:attribute``; one-line error naming ``what`` when it cannot be
    imported (dependency injection by import path: forecasters, external deciders)."""
    module, _, attr = path.partition(":")
    if not module or not attr:
        raise BubblecastError(f"{what}: expected module:attribute, got '{path}'")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise BubblecastError(f"{what}: cannot import '{path}' ({exc})") from None


def load_forecaster(model: str | None = None, factory: str | None = None) -> tuple[Any, str]:
    """The predictive policy's forecaster and a description of it."""
    if factory is not None:
        obj = import_object(factory)()
        return obj, f"custom forecaster {factory}"
    if model is not None:
        from bubblecast.forecast.served import check_model, load_served
        from bubblecast.runtime.control.covariate_model import load_with_covariates

        served, info = load_served(model, loader=load_with_covariates)
        fc = ModelSpeeds(check_model(served), name=info.name)
        return fc, f"model '{info.name}' version {info.version} from {model} (in process)"
    from bubblecast.policy.policy_evaluation import BUILTIN_FORECASTER
    from bubblecast.runtime.control.observe import live_forecaster

    return live_forecaster(), (f"{BUILTIN_FORECASTER}, on the raw per-step speeds relative to "
                               "the ranks' common level")


def check_model_source(model: str) -> str:
    """Load ``model`` once (in the CLI, before any process starts); its description."""
    _, text = load_forecaster(model=model)
    return text
