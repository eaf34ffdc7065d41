"""Interruption-safe stage directories for the demo's output folder.

A stage writes everything into a hidden temporary sibling (``.tmp-NAME-PID``); only when its
body returns does it write ``stage.json`` (its fingerprint, seconds and result) and rename the
folder onto ``NAME``, replacing the previous one. A demo killed midway therefore leaves either
the previous complete folder or nothing, plus hidden leftovers that :meth:`Workspace.clean`
removes before the next run. Files a stage must publish outside its folder (the MLflow
database) are registered with :meth:`StageContext.promote` and moved into place at commit.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bubblecast.errors import BubblecastError

STAGE_FILE = "stage.json"
_TMP, _OLD = ".tmp-", ".old-"


@dataclass
class StageContext:
    """A running stage: ``dir`` to write into; ``result`` to fill (JSON-able)."""

    name: str
    dir: Path
    result: dict[str, Any] = field(default_factory=dict)
    _promote: list[tuple[Path, Path]] = field(default_factory=list)

    def promote(self, src: Path, dst: Path) -> None:
        """Move ``src`` onto ``dst`` (atomically, same filesystem) when the stage commits."""
        self._promote.append((Path(src), Path(dst)))


class Workspace:
    """The demo's output folder: one sub-folder per finished stage."""

    def __init__(self, out: str | os.PathLike[str]) -> None:
        self.out = Path(out).resolve()

    def check(self, markers: tuple[str, ...]) -> None:
        """Refuse an output folder that holds something else (one line): a file, or a
        non-empty folder with none of ``markers`` (names a demo folder holds) and no stage
        left half-done in it."""
        if self.out.exists() and not self.out.is_dir():
            raise BubblecastError(f"--out {self.out}: exists and is not a folder")
        if not self.out.is_dir():
            return
        entries = [p.name for p in self.out.iterdir()]
        ours = any((self.out / m).exists() for m in markers) or any(
            e.startswith((_TMP, _OLD)) for e in entries)  # a first run, interrupted
        if entries and not ours:
            raise BubblecastError(f"--out {self.out}: folder is not empty and holds no "
                                  "bubblecast demo; choose a new or empty folder")

    def path(self, stage: str, *parts: str) -> Path:
        return self.out.joinpath(stage, *parts)

    def clean(self) -> list[str]:
        """Remove what interrupted runs left (temporary and half-replaced folders)."""
        removed = []
        if not self.out.is_dir():
            return removed
        for entry in sorted(self.out.iterdir()):
            if entry.name.startswith((_TMP, _OLD)) or (entry.name.startswith(".")
                                                        and entry.name.endswith(".tmp")):
                if entry.is_dir():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
                removed.append(entry.name)
        return removed

    def record(self, stage: str) -> dict[str, Any] | None:
        """The ``stage.json`` of a finished stage, or None (absent or unreadable)."""
        try:
            doc = json.loads(self.path(stage, STAGE_FILE).read_text())
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) and "fingerprint" in doc else None

    def finished(self, stage: str, fingerprint: str) -> dict[str, Any] | None:
        """The record of ``stage`` if it finished with this ``fingerprint``."""
        doc = self.record(stage)
        return doc if doc is not None and doc.get("fingerprint") == fingerprint else None

    def remove(self, stage: str) -> None:
        shutil.rmtree(self.path(stage), ignore_errors=True)

    @contextmanager
    def stage(self, name: str, fingerprint: str) -> Iterator[StageContext]:
        """Run a stage body in a temporary folder; commit it only if the body returns."""
        self.out.mkdir(parents=True, exist_ok=True)
        tmp = self.out / f"{_TMP}{name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        ctx = StageContext(name, tmp)
        started = time.perf_counter()
        try:
            yield ctx
            record = {"stage": name, "fingerprint": fingerprint,
                      "seconds": round(time.perf_counter() - started, 3),
                      "result": ctx.result}
            (tmp / STAGE_FILE).write_text(dumps(record))
            for src, dst in ctx._promote:
                dst.parent.mkdir(parents=True, exist_ok=True)
                os.replace(src, dst)
            self._swap(tmp, self.path(name))
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def _swap(self, tmp: Path, final: Path) -> None:
        old = self.out / f"{_OLD}{final.name}-{os.getpid()}"
        if final.exists():
            final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)


def plain(obj: Any) -> Any:
    """``obj`` as strict JSON values: numpy scalars unwrapped, NaN and inf as None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item"):
        return plain(obj.item())
    return obj


def dumps(obj: Any) -> str:
    """Strict, indented JSON of ``obj`` (see :func:`plain`)."""
    return json.dumps(plain(obj), indent=1, allow_nan=False)
