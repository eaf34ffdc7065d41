"""The predictive policy's forecaster in the live loop, each way failing into "keep the plan".

- :func:`load_forecaster`: a trained model served in process
  (:func:`bubblecast.forecast.served.load_served`: a model directory or ``models:/`` URI,
  through the one model-to-speed adapter :class:`bubblecast.policy.speeds.ModelSpeeds`; a
  model with device-metric covariates as a :class:`.covariate_model.CovariateModel`), a
  ``module:factory`` import path, or the policy module's built-in trend forecaster.
- :class:`DeadlineRunner`: runs a decision in a daemon thread and gives up after a deadline,
  so a slow forecaster never holds the training loop longer than that.
- :func:`import_object`: dependency injection by import path (forecasters, external deciders).

A failure raises :class:`ForecastUnavailable` (or anything else); the decider turns it into a
decision to keep the current plan whose reason says what happened. The model loaders are
imported lazily.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from typing import Any

from bubblecast.errors import BubblecastError
from bubblecast.policy.speeds import CachingForecaster, ForecastUnavailable, ModelSpeeds

__all__ = ["CachingForecaster", "DeadlineRunner", "ForecastUnavailable", "ModelSpeeds",
           "check_model_source", "import_object", "load_forecaster"]


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


class DeadlineRunner:
    """``runner(fn, *args)``: ``fn(*args)`` in a daemon thread, waited for ``timeout_s``.

    On time-out the call is abandoned (it finishes in the background, its result dropped) and
    :class:`ForecastUnavailable` is raised; while it still runs, later calls are refused the
    same way, so at most one abandoned call exists.
    """

    def __init__(self, timeout_s: float) -> None:
        if not timeout_s > 0:
            raise BubblecastError(f"--forecast-timeout: must be > 0 seconds, got {timeout_s}")
        self.timeout_s = float(timeout_s)
        self._abandoned: threading.Thread | None = None

    def __call__(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self._abandoned is not None:
            if self._abandoned.is_alive():
                raise ForecastUnavailable("the previous forecast, abandoned after "
                                          f"{self.timeout_s:g} s, is still running")
            self._abandoned = None
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["value"] = fn(*args)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
                box["error"] = exc

        thread = threading.Thread(target=target, name="bubblecast-decide", daemon=True)
        thread.start()
        thread.join(self.timeout_s)
        if thread.is_alive():
            self._abandoned = thread
            raise ForecastUnavailable(f"forecaster timed out after {self.timeout_s:g} s")
        if "error" in box:
            raise box["error"]
        return box["value"]
