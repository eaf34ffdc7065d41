"""Hot reload of the served model from a local model directory or the MLflow registry.

``ModelSource(uri)`` loads ``uri`` (a directory, ``models:/name@alias`` or ``models:/name/N``)
with :func:`bubblecast.forecast.served.load_parsed` and reports a *fingerprint* that changes
when the source would now load something else: the version an alias points to, or the
modification time of a directory's ``model.json``.
:class:`SourceWatcher` polls the fingerprint in a daemon thread and reloads when it moves.
An alias is resolved to a version first and that exact version loaded, so the version
reported is the one served even if the alias moves during the load.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bubblecast.errors import BubblecastError
from bubblecast.forecast.served import (
    ForecastModel,
    ModelInfo,
    ModelLoader,
    alias_version,
    load_parsed,
    parse_uri,
)

log = logging.getLogger("bubblecast.serve")

__all__ = ["ModelLoader", "ModelSource", "SourceWatcher", "parse_uri"]


class ModelSource:
    """A model directory or registry URI that can be loaded (again) and watched."""

    def __init__(self, uri: str, *, loader: ModelLoader | None = None,
                 tracking_uri: str | None = None) -> None:
        self.uri = str(uri)
        self.registry = parse_uri(self.uri)
        self.loader = loader
        self.tracking_uri = tracking_uri
        if self.registry is None and not Path(self.uri).is_dir():
            raise BubblecastError(f"--model: {self.uri} is not a model directory or a "
                                  "models:/ URI")

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
        return alias_version(self.uri, name, alias, self.tracking_uri)

    def load(self) -> tuple[ForecastModel, ModelInfo]:
        """Load the model the source points to now, with the facts ``/v1/model`` reports."""
        return load_parsed(self.uri, self.registry, loader=self.loader,
                           tracking_uri=self.tracking_uri)


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
