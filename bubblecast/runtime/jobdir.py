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
No torch import here.
"""

from __future__ import annotations

import json
import re
import shutil
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
    so an earlier attempt's parts are carried over (:meth:`carry`) rather than refused."""

    def __init__(self, out: str | Path, *, resuming: bool = False) -> None:
        self.out = Path(out)
        self.root = partial_dir(self.out)
        self.resuming = resuming
        self.parts = self.root / "parts-0"
        self._lock: IO[str] | None = None
        self.closed = False

    def attempts(self) -> list[Path]:
        """The ``parts-{n}`` folders holding parts, oldest first."""
        found = [p for p in self.root.glob("parts-*")
                 if _ATTEMPT.fullmatch(p.name) and _has_parts(p)]
        return sorted(found, key=_number)

    def open(self) -> JobDir:
        """Create and lock the folder; BubblecastError (one line) if it is in use or holds an
        unfinished run's telemetry and this job does not resume."""
        import fcntl

        self.root.mkdir(parents=True, exist_ok=True)
        lock = open(self.root / ".lock", "a")  # noqa: SIM115 - held until close()
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            raise BubblecastError(f"--out: another collect or run is writing {self.out} "
                                  f"(its job folder {self.root} is locked)") from None
        self._lock = lock
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
