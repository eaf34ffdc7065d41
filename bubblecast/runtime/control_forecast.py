"""What the controller asks for a decision, each way failing into "keep the current plan".

- :func:`load_forecaster`: the predictive policy's forecaster: a trained model served in
  process (:class:`bubblecast.serve.Predictor`, a model directory or ``models:/`` URI), a
  ``module:factory`` import path, or the policy module's built-in trend forecaster.
- :class:`ServiceDecider`: asks a running prediction service for the action
  (``/v1/recommend`` through the fail-open :class:`bubblecast.serve.Client`).
- :class:`DeadlineRunner`: runs a decision in a daemon thread and gives up after a deadline,
  so a slow forecaster never holds the training loop longer than that.

A failure raises :class:`ForecastUnavailable` (or anything else); the controller turns it into
a ``NoOp`` whose reason says what happened. serve and the model loaders are imported lazily.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from bubblecast.errors import BubblecastError


class ForecastUnavailable(Exception):
    """No forecast (or service answer) in time, or none possible yet; the message says why."""


class CachingForecaster:
    """A ``SpeedForecaster`` that remembers its last answer (for the predicted saving)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = str(getattr(inner, "name", type(inner).__name__))
        self.last: tuple[np.ndarray, np.ndarray] | None = None  # (horizons, (H, P, 3))

    def forecast(self, state: Any, horizons: np.ndarray) -> np.ndarray:
        q = np.asarray(self.inner.forecast(state, horizons), dtype=np.float64)
        self.last = (np.asarray(horizons), q)
        return q


class ModelSpeedForecaster:
    """A served model (``predict_window``) as the policy's speed forecaster.

    The controller sets :attr:`window` (a :class:`bubblecast.serve.model.Window` of compute
    seconds and layer cost held per step) before each decision; the conversion from the
    model's delay signal to the policy's speed is the service's own
    (:class:`bubblecast.serve.recommend.WindowSpeeds`).
    """

    def __init__(self, model: Any, name: str = "model") -> None:
        self.model = model
        self.name = name
        self.window: Any = None

    @property
    def min_window(self) -> int:
        return int(getattr(self.model, "min_window", 1))

    def forecast(self, state: Any, horizons: np.ndarray) -> np.ndarray:
        from bubblecast.serve.recommend import WindowSpeeds

        w = self.window
        if w is None or w.steps < self.min_window:
            have = 0 if w is None else w.steps
            raise ForecastUnavailable(f"model '{self.name}' needs {self.min_window} steps of "
                                      f"history, has {have}")
        return WindowSpeeds(self.model, w).forecast(state, horizons)


def import_object(path: str) -> Any:
    """``package.module:attribute``; one-line error when it cannot be imported."""
    module, _, attr = path.partition(":")
    if not module or not attr:
        raise BubblecastError(f"forecaster: expected module:attribute, got '{path}'")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise BubblecastError(f"forecaster: cannot import '{path}' ({exc})") from None


def load_forecaster(model: str | None = None, factory: str | None = None) -> tuple[Any, str]:
    """The predictive policy's forecaster and a description of it."""
    if factory is not None:
        obj = import_object(factory)()
        return obj, f"custom forecaster {factory}"
    if model is not None:
        from bubblecast.serve.predictor import Predictor

        predictor = Predictor.from_source(model)
        info = predictor.info
        fc = ModelSpeedForecaster(predictor.loaded.model, name=info.name)
        return fc, f"model '{info.name}' version {info.version} from {model} (in process)"
    from bubblecast.policy.evaluate import BUILTIN_FORECASTER
    from bubblecast.runtime.control_observe import live_forecaster

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


class ServiceDecider:
    """Asks a prediction service for the predictive policy's action (fail-open).

    ``params`` are the predictive policy's knobs (horizon, risk, margin, min_gain, hold,
    min_history); ``timeout_s`` bounds each call, retries included.
    """

    def __init__(self, url: str, timeout_s: float, params: dict[str, Any]) -> None:
        from bubblecast.serve.client import Client

        self.url = url
        self.client = Client(url, timeout=timeout_s, retries=1)
        self.params = params
        self.horizons: list[int] | None = None
        self.name = f"service {url}"

    def _model_horizons(self) -> list[int]:
        """The served model's horizons (``/v1/model``), asked once; [1] when unknown."""
        if self.horizons is None:
            breaker = self.client.breaker
            if not breaker.allow():
                raise ForecastUnavailable(f"service {self.url}: circuit open after failures")
            try:
                resp = self.client._http.get("/v1/model", timeout=self.client.timeout)
                hz = resp.json().get("horizons") if resp.status_code == 200 else None
            except Exception as exc:  # noqa: BLE001 - fail open
                breaker.record_failure()
                raise ForecastUnavailable(f"service {self.url} unavailable "
                                          f"({type(exc).__name__})") from None
            breaker.record_success()
            self.horizons = [int(h) for h in hz] if hz else [1]
        return self.horizons

    def request(self, *, stages: int, schedule: str, microbatches: int, chunks: int,
                compute: np.ndarray, held: np.ndarray, partition: tuple[int, ...],
                costs: np.ndarray, param_bytes: np.ndarray, migration: dict[str, Any],
                steps_since_action: int | None) -> dict[str, Any]:
        """The ``/v1/recommend`` body (at most the last 1024 steps)."""
        compute, held = compute[-1024:], held[-1024:]
        ranks = [{"rank": r, "stage": r, "compute_s": compute[:, r].tolist(),
                  "work": np.maximum(held[:, r], 1e-12).tolist()} for r in range(stages)]
        return {"pipeline": {"schedule": schedule, "stages": stages,
                             "microbatches": microbatches, "chunks": chunks},
                "horizons": self._model_horizons(), "ranks": ranks,
                "partition": list(partition), "layer_costs": costs.tolist(),
                "migration": {"param_bytes": param_bytes.tolist(), **migration},
                "policy": self.params, "steps_since_action": steps_since_action}

    def decide(self, body: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        """(action, facts) from the service; ForecastUnavailable when it gives none."""
        from bubblecast.policy.actions import action_from_json

        resp = self.client.recommend(body)
        if resp is None:
            why = self.client.last_error or "no answer"
            raise ForecastUnavailable(f"service {self.url}: {why}")
        facts = {"reason": resp.reason, "predicted_step_s": resp.step_time_s,
                 "predicted_step_with_action_s": resp.step_time_with_action_s,
                 "predicted_migration_s": resp.migration_s}
        return action_from_json(resp.action), facts

    def close(self) -> None:
        self.client.close()
