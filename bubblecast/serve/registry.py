"""Where the served model comes from: a local model directory or the MLflow registry.

``ModelSource(uri)`` loads ``uri`` (a directory, ``models:/name@alias`` or ``models:/name/N``)
and reports a *fingerprint* that changes when the source would now load something else: the
version an alias points to, or the modification time of a directory's ``model.json``.
:class:`SourceWatcher` polls the fingerprint in a daemon thread and reloads when it moves.
An alias is resolved to a version first and that exact version loaded, so the version
reported is the one served even if the alias moves during the load.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from bubblecast.errors import BubblecastError
from bubblecast.serve.model import ForecastModel, ModelInfo

log = logging.getLogger("bubblecast.serve")

_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/@]+)|/(?P<version>[^/@]+))$")

#: ``load(uri) -> model object`` for a directory or a pinned ``models:/name/N`` URI.
ModelLoader = Callable[[str], Any]


def parse_uri(uri: str) -> tuple[str, str | None, str | None] | None:
    """``(name, alias, version)`` of a ``models:/`` URI, None for anything else."""
    m = _URI.match(uri)
    if m is None:
        if uri.startswith("models:/"):
            raise BubblecastError(f"--model: '{uri}' is not models:/NAME@ALIAS or models:/NAME/N")
        return None
    return m.group("name"), m.group("alias"), m.group("version")


def default_loader(uri: str, tracking_uri: str | None = None) -> Any:
    """Load with the forecasting stage's ``load_model`` (directories and ``models:/`` URIs)."""
    try:
        from bubblecast.forecast.modeldir import load_model
    except ImportError:
        raise BubblecastError(f"--model {uri}: bubblecast.forecast (the model loader) is not "
                              "available in this build") from None
    return load_model(uri, tracking_uri=tracking_uri)


def as_forecast_model(obj: Any, uri: str) -> ForecastModel:
    """``obj`` itself when it answers ``predict_window``; a fitted ``bubblecast.forecast``
    forecaster wrapped by :class:`~bubblecast.serve.adapters.FeatureModel`."""
    if hasattr(obj, "predict_window"):
        return obj
    if hasattr(obj, "predict_signal") and hasattr(obj, "horizons_"):
        from bubblecast.serve.adapters import serve_forecaster

        return serve_forecaster(obj)
    raise BubblecastError(f"--model {uri}: a {type(obj).__name__} cannot forecast from a window "
                          "of recent steps (no predict_window)")


def _facts(obj: Any) -> tuple[str | None, dict[str, Any]]:
    """(name, training metrics) a loaded model reports about itself, if any."""
    name = getattr(obj, "name", None) or getattr(obj, "kind", None)
    metrics = getattr(obj, "metrics", None)
    if not metrics:
        metrics = (getattr(obj, "metadata_", None) or {}).get("metrics")
    return (str(name) if name else None), (dict(metrics) if isinstance(metrics, dict) else {})


class ModelSource:
    """A model directory or registry URI that can be loaded (again) and watched."""

    def __init__(self, uri: str, *, loader: ModelLoader | None = None,
                 tracking_uri: str | None = None) -> None:
        self.uri = str(uri)
        self.registry = parse_uri(self.uri)
        self.loader = loader or partial(default_loader, tracking_uri=tracking_uri)
        self.tracking_uri = tracking_uri
        if self.registry is None and not Path(self.uri).is_dir():
            raise BubblecastError(f"--model: {self.uri} is not a model directory or a "
                                  "models:/ URI")

    def _client(self) -> Any:
        from mlflow import MlflowClient

        return MlflowClient(tracking_uri=self.tracking_uri)

    def fingerprint(self) -> str:
        """What identifies the model the source points to now."""
        if self.registry is None:
            path = Path(self.uri) / "model.json"
            try:
                st = path.stat()
            except OSError:
                return "missing"
            return f"{st.st_mtime_ns}:{st.st_size}"
        name, alias, version = self.registry
        if alias is None:
            return str(version)
        try:
            return str(self._client().get_model_version_by_alias(name, alias).version)
        except Exception as exc:  # noqa: BLE001 - any registry failure means "unknown now"
            raise BubblecastError(f"--model {self.uri}: cannot resolve alias ({exc})") from None

    def load(self) -> tuple[ForecastModel, ModelInfo]:
        """Load the model the source points to now, with the facts ``/v1/model`` reports."""
        if self.registry is None:
            try:  # a directory has no version number: its model.json's content names it
                stamp = hashlib.sha256((Path(self.uri) / "model.json").read_bytes())
                version = stamp.hexdigest()[:12]
            except OSError:
                version = "unknown"
            obj = self.loader(self.uri)
            name, metrics = _facts(obj)
            info = ModelInfo(name=name or Path(self.uri).name, version=version, source=self.uri,
                             metrics=metrics)
            return as_forecast_model(obj, self.uri), info
        reg_name, alias, version = self.registry
        if alias is not None:
            version = self.fingerprint()
        obj = self.loader(f"models:/{reg_name}/{version}")
        _, metrics = _facts(obj)
        if not metrics:
            metrics = self._run_metrics(reg_name, str(version))
        info = ModelInfo(name=reg_name, version=str(version), alias=alias, source=self.uri,
                         metrics=metrics)
        return as_forecast_model(obj, self.uri), info

    def _run_metrics(self, name: str, version: str) -> dict[str, Any]:
        """The metrics of the MLflow run that logged this version (empty if unknown)."""
        try:
            client = self._client()
            run_id = client.get_model_version(name, version).run_id
            return dict(client.get_run(run_id).data.metrics) if run_id else {}
        except Exception:  # noqa: BLE001 - metrics are informative only
            return {}


class SourceWatcher:
    """Polls ``fingerprint()`` every ``interval_s`` and calls ``on_change()`` when it moves.

    Errors (registry down, a half-written directory) are logged and retried at the next poll;
    the model being served keeps serving.
    """

    def __init__(self, fingerprint: Callable[[], str], on_change: Callable[[], Any],
                 interval_s: float, initial: str | None = None) -> None:
        if not interval_s > 0:
            raise BubblecastError(f"--watch-interval: must be > 0 seconds, got {interval_s}")
        self.fingerprint = fingerprint
        self.on_change = on_change
        self.interval_s = float(interval_s)
        self.last = initial
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bubblecast-model-watch",
                                        daemon=True)

    def start(self) -> SourceWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)

    def poll(self) -> bool:
        """One check; True when the source moved and ``on_change`` succeeded."""
        now = self.fingerprint()
        if self.last is None:
            self.last = now
            return False
        if now == self.last:
            return False
        self.on_change()
        self.last = now
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                if self.poll():
                    log.info("model source moved; reloaded (%s)", self.last)
            except Exception as exc:  # noqa: BLE001 - keep watching, keep serving
                log.warning("model watch: %s", exc)
