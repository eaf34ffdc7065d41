"""The working directory of a ``collect``/``run`` job, beside its output: telemetry is kept.

``OUT.partial/`` (visible, one per output file) holds ``job.json``, ``torchrun.log``, the
ranks' ``error-rank{r}.txt``, rank 0's ``summary.json`` and ``origin.json``, and the ranks'
telemetry parts in ``parts-{n}/`` (one folder per attempt). It is removed once rank 0 has
merged the parts into ``OUT``. When the job fails, or the command is killed, it stays with
every part written so far (readable as it is: ``bubblecast inspect OUT.partial/parts-0``) and
the error names it. A later job writing the same output refuses to start while it holds
parts, unless it resumes from a checkpoint: then the rows the earlier attempt recorded before
the checkpoint's step are carried into the new attempt's parts, so that ``OUT`` ends up
holding every step once, on one clock. A lock (``.lock``, released by the kernel when the
command dies, even by SIGKILL) keeps two commands from sharing the directory.

Multi-node (``node`` given: one command per node, the same ``OUT`` path on a filesystem every
node sees): ``OUT.partial/`` is shared, each node's command keeps its job files in
``OUT.partial/node-<host>-<pid>/`` (locked while it runs) and every rank writes its parts to
the shared ``OUT.partial/parts-0/``, which rank 0, wherever it runs, merges into ``OUT``.
The command whose node ran rank 0 copies its ``summary.json`` up into ``OUT.partial/`` for
the others (:meth:`JobDir.summary`); the last command to finish removes the folder.
No torch import here.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path
from typing import IO

from bubblecast.errors import BubblecastError

SUFFIX = ".partial"
_ATTEMPT = re.compile(r"parts-(\d+)")


class TrainingFailed(RuntimeError):
    """A job's ranks failed; the message is one line (why, and where the telemetry is).
    ``exit_code``: what the command exits with (1; 130 when interrupted)."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def partial_dir(out: str | Path) -> Path:
    """``run.parquet`` -> ``run.parquet.partial`` beside it."""
    out = Path(out)
    return out.with_name(out.name + SUFFIX)


def _number(attempt: Path) -> int:
    """``parts-3`` -> 3."""
    return int(attempt.name.removeprefix("parts-"))


def _has_parts(folder: Path) -> bool:
    return folder.is_dir() and any(not f.name.startswith(".") for f in folder.glob("*.parquet"))


def describe_parts(folder: Path) -> str:
    """``steps 0-649 in 26 part files``: what a parts folder holds (read from its files)."""
    import pyarrow.parquet as pq

    files = sorted(f for f in folder.glob("*.parquet") if not f.name.startswith("."))
    lo, hi = None, None
    for f in files:
        try:
            steps = pq.read_table(f, columns=["step"]).column("step")
        except Exception:  # noqa: BLE001 - a description only; readers name bad files
            continue
        if len(steps):
            import pyarrow.compute as pc

            bounds = pc.min_max(steps)
            a, b = bounds["min"].as_py(), bounds["max"].as_py()
            lo, hi = (a if lo is None else min(lo, a)), (b if hi is None else max(hi, b))
    what = f"steps {lo}-{hi}" if lo is not None else "no steps"
    return f"{what} in {len(files)} part file{'s' if len(files) != 1 else ''}"


class JobDir:
    """``OUT.partial``: see the module docstring. ``open`` it, run the job with ``parts`` as
    its events folder, then ``close(ok)``. ``resuming``: the job starts from a checkpoint,
    so an earlier attempt's parts are carried over (:meth:`carry`) rather than refused.
    ``node``: this node's name in a multi-node job (see the module docstring); ``root`` is
    then this command's folder inside the shared ``OUT.partial`` (:attr:`shared`)."""

    def __init__(self, out: str | Path, *, resuming: bool = False,
                 node: str | None = None) -> None:
        self.out = Path(out)
        self.shared = partial_dir(self.out)
        self.node = node
        self.root = self.shared / f"node-{node}" if node else self.shared
        self.resuming = resuming
        self.parts = self.shared / "parts-0"
        self._lock: IO[str] | None = None
        self.closed = False

    def attempts(self) -> list[Path]:
        """The ``parts-{n}`` folders holding parts, oldest first."""
        found = [p for p in self.shared.glob("parts-*")
                 if _ATTEMPT.fullmatch(p.name) and _has_parts(p)]
        return sorted(found, key=_number)

    def open(self) -> JobDir:
        """Create and lock the folder; BubblecastError (one line) if it is in use or holds an
        unfinished run's telemetry and this job does not resume."""
        self.root.mkdir(parents=True, exist_ok=True)
        lock = _try_lock(self.root)
        if lock is None:
            raise BubblecastError(f"--out: another collect or run is writing {self.out} "
                                  f"(its job folder {self.root} is locked)")
        self._lock = lock
        if self.node:
            return self._open_node()
        earlier = self.attempts()
        if earlier and not self.resuming:
            self._unlock()
            raise BubblecastError(f"--out: {self.root} holds the telemetry of an unfinished run "
                                  f"of {self.out} ({describe_parts(earlier[-1])}); continue it "
                                  "with --resume, or move it away first")
        for child in self.root.iterdir():  # what the last attempt left, but its parts/clock
            keep = child.name == ".lock" or (earlier and (child.name == "origin.json" or
                                                          child in earlier))
            if not keep:
                shutil.rmtree(child) if child.is_dir() else child.unlink()
        self.parts = self.root / f"parts-{_number(earlier[-1]) + 1 if earlier else 0}"
        self.parts.mkdir()
        return self

    def _open_node(self) -> JobDir:
        """Multi-node open: refuse an unfinished run's parts, remove dead nodes' folders."""
        if self.resuming:
            self._unlock()
            raise BubblecastError("--resume: not supported with --nnodes > 1")
        earlier = self.attempts()
        if earlier and not self.live_nodes(others=True):
            self._unlock()
            raise BubblecastError(f"--out: {self.shared} holds the telemetry of an unfinished "
                                  f"run of {self.out} ({describe_parts(earlier[-1])}); move it "
                                  "away first")
        for folder in self.shared.glob("node-*"):
            young = time.time() - folder.stat().st_mtime < 30  # may be locked any moment
            lock = _try_lock(folder) if folder != self.root and not young else None
            if lock is not None:  # its command is gone
                lock.close()
                shutil.rmtree(folder, ignore_errors=True)
        (self.shared / "summary.json").unlink(missing_ok=True)
        self.parts.mkdir(exist_ok=True)
        return self

    def live_nodes(self, *, others: bool = False) -> list[Path]:
        """Node folders whose command still runs (holds its lock); ``others``: not this one."""
        live = []
        for folder in sorted(self.shared.glob("node-*")):
            if folder == self.root:
                if not others:
                    live.append(folder)
                continue
            lock = _try_lock(folder)
            if lock is None:
                live.append(folder)
            else:
                lock.close()
        return live

    def summary(self, wait_s: float = 0.0) -> Path | None:
        """Rank 0's ``summary.json``: in this job folder (multi-node: copied up to the shared
        folder for the other nodes), else, multi-node, the shared copy, waited for up to
        ``wait_s`` seconds; None when there is none."""
        own = self.root / "summary.json"
        if own.exists() or not self.node:
            if own.exists() and self.node:
                from bubblecast.telemetry.io import atomic_write_text

                atomic_write_text(self.shared / "summary.json", own.read_text())
            return own if own.exists() else None
        shared, deadline = self.shared / "summary.json", time.monotonic() + wait_s
        while not shared.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        return shared if shared.exists() else None

    def origin(self) -> float | None:
        """The wall-clock origin of the earlier attempt's times (``origin.json``), if any."""
        try:
            return float(json.loads((self.root / "origin.json").read_text())["origin_wall"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def carry(self, before: int, run_id: str) -> int:
        """Copy the latest earlier attempt's rows of steps < ``before`` into this attempt's
        parts (``carried.parquet``), then remove the earlier attempts; the rows carried.
        BubblecastError when they are another run's (another ``--run-id``)."""
        from bubblecast.telemetry import from_frame, read_events, write_events

        earlier = [p for p in self.attempts() if p != self.parts]
        if not earlier:
            return 0
        events = read_events(earlier[-1])
        if set(events.runs) != {run_id}:
            raise BubblecastError(f"--resume: {earlier[-1]} holds run "
                                  f"{', '.join(map(repr, sorted(events.runs)))}, this run is "
                                  f"'{run_id}' (same --run-id, or move the folder away)")
        frame = events.frame
        keep = frame.loc[frame["step"] < before].reset_index(drop=True)
        if len(keep):
            target = self.parts / "carried.parquet"
            write_events(from_frame(keep, dict(events.runs), str(target)), target)
        for old in earlier:  # only once their rows are safe in this attempt's folder
            shutil.rmtree(old)
        return len(keep)

    def close(self, ok: bool) -> Path | None:
        """Remove the folder after success, or when nothing was recorded; otherwise keep it
        and return the parts folder to name in the error."""
        if self.closed:
            return None
        self.closed = True
        kept = None if ok else next(iter(reversed(self.attempts())), None)
        self._unlock()
        if kept is None:
            shutil.rmtree(self.root, ignore_errors=True)
            if self.node and not self.live_nodes():  # the last node out removes the rest
                shutil.rmtree(self.shared, ignore_errors=True)
        return kept

    def failed(self, reason: str, exit_code: int = 1) -> TrainingFailed:
        """Close after a failure; the one-line error: ``reason`` and where the telemetry is."""
        kept = self.close(ok=False)
        where = (f"; telemetry so far ({describe_parts(kept)}) kept in {kept}" if kept
                 else "; no telemetry was recorded")
        return TrainingFailed(f"{reason}{where}", exit_code)

    def _unlock(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None


def _try_lock(folder: Path) -> IO[str] | None:
    """``folder/.lock`` opened and exclusively locked (released by the kernel when the process
    dies), or None when another process holds it."""
    import fcntl

    lock = open(folder / ".lock", "a")  # noqa: SIM115 - held by the caller
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.close()
        return None
    return lock
