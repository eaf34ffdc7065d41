"""Hot reload of the served model from a local model directory or the MLflow registry.

``ModelSource(uri)`` loads ``uri`` (a directory, ``models:/name@alias`` or ``models:/name/N``)
with :func:`bubblecast.forecast.served.load_parsed` and reports a *fingerprint* that changes
when the source would now load something else: the version an alias points to, or, for a
directory, the name, size and modification time of every file in it.
:class:`SourceWatcher` polls the fingerprint in a daemon thread and reloads when it moves.
An alias is resolved to a version first and that exact version loaded, so the version
reported is the one served even if the alias moves during the load.

A directory may be replaced by any copy method (``cp``, ``rsync``, file by file), so a reload
loads it only when its files form one model (:func:`directory_state`): ``model.json`` parses,
every file it lists is there, and each file its ``sha256`` manifest names has that content;
the same check after the load must give the same contents, else the files moved under the
loader. Otherwise the reload fails with the reason (logged by the watcher) and the model being
served keeps serving. The watcher also waits for a directory's fingerprint to hold still for
one poll before loading (a copy in progress keeps moving it).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
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

    @property
    def settles(self) -> bool:
        """True for a directory: reload once its fingerprint held still for one poll."""
        return self.registry is None

    def fingerprint(self) -> str:
        """What identifies the model the source points to now."""
        if self.registry is None:
            return directory_fingerprint(Path(self.uri))
        name, alias, version = self.registry
        if alias is None:
            return str(version)
        return alias_version(self.uri, name, alias, self.tracking_uri)

    def load(self) -> tuple[ForecastModel, ModelInfo]:
        """Load the model the source points to now, with the facts ``/v1/model`` reports;
        a directory only when its files are one complete, consistent model, before and after
        the load (BubblecastError saying why otherwise)."""
        if self.registry is not None:
            return load_parsed(self.uri, self.registry, loader=self.loader,
                               tracking_uri=self.tracking_uri)
        before = directory_state(Path(self.uri))
        loaded = load_parsed(self.uri, None, loader=self.loader, tracking_uri=self.tracking_uri)
        if directory_state(Path(self.uri)) != before:
            raise BubblecastError(f"{self.uri}: the model files changed while loading (a copy "
                                  "in progress?); not loaded")
        return loaded


MODEL_FILE = "model.json"


def directory_fingerprint(path: Path) -> str:
    """Name, size and modification time of every file under ``path``, hashed; "missing"
    when the directory cannot be read."""
    digest = hashlib.sha256()
    try:
        for root, dirs, files in os.walk(path, onerror=_raise):
            dirs.sort()
            for name in sorted(files):
                full = Path(root) / name
                st = full.stat()
                digest.update(f"{full.relative_to(path)}\0{st.st_size}\0{st.st_mtime_ns}\n"
                              .encode())
    except OSError:
        return "missing"
    return digest.hexdigest()[:24]


def _raise(exc: OSError) -> None:
    raise exc


def directory_state(path: Path) -> str:
    """The content digest of the model in ``path`` when its files form one model, else
    BubblecastError naming what is wrong: ``model.json`` not complete JSON, a file it lists
    missing, or a file whose sha256 differs from ``model.json``'s manifest (``"sha256":
    {file: hex}``; without one, the files listed are only required to exist)."""
    try:
        raw = (path / MODEL_FILE).read_bytes()
    except OSError as exc:
        raise BubblecastError(f"{path}: cannot read {MODEL_FILE} ({exc.strerror})") from None
    try:
        doc = json.loads(raw)
    except ValueError:
        raise BubblecastError(f"{path}: {MODEL_FILE} is not complete JSON (a copy in "
                              "progress?); not loaded") from None
    if not isinstance(doc, dict):
        raise BubblecastError(f"{path}: {MODEL_FILE} is not an object; not loaded")
    listed = [str(f) for f in doc.get("files") or []]
    manifest = doc.get("sha256") or {}
    digest = hashlib.sha256(raw)
    for name in sorted(set(listed) | set(manifest)):
        try:
            data = (path / name).read_bytes()
        except OSError:
            raise BubblecastError(f"{path}: {name}, listed in {MODEL_FILE}, is missing (a copy "
                                  "in progress?); not loaded") from None
        actual = hashlib.sha256(data).hexdigest()
        if name in manifest and actual != manifest[name]:
            raise BubblecastError(f"{path}: {name} does not match {MODEL_FILE} (sha256 "
                                  f"{actual[:12]}, expected {str(manifest[name])[:12]}): files "
                                  "of two versions (a copy in progress?); not loaded")
        digest.update(f"\0{name}\0{actual}".encode())
    return digest.hexdigest()


class SourceWatcher:
    """Polls ``fingerprint()`` every ``interval_s`` and calls ``on_change()`` when it moves.

    Errors (registry down, a half-written directory) are logged and retried at the next poll;
    the model being served keeps serving. With ``settle``, a new fingerprint must be seen on
    two polls in a row before ``on_change`` runs (a directory being copied keeps moving).
    """

    def __init__(self, fingerprint: Callable[[], str], on_change: Callable[[], Any],
                 interval_s: float, initial: str | None = None, settle: bool = False) -> None:
        if not interval_s > 0:
            raise BubblecastError(f"--watch-interval: must be > 0 seconds, got {interval_s}")
        self.fingerprint = fingerprint
        self.on_change = on_change
        self.interval_s = float(interval_s)
        self.last = initial
        self.settle = settle
        self.pending: str | None = None
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
            self.pending = None
            return False
        if self.settle and now != self.pending:
            self.pending = now  # moved since the last poll: load once it holds still
            return False
        self.on_change()
        self.last = now
        self.pending = None
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                if self.poll():
                    log.info("model source moved; reloaded (%s)", self.last)
            except Exception as exc:  # noqa: BLE001 - keep watching, keep serving
                log.warning("model watch: the served model keeps serving: %s", exc)
