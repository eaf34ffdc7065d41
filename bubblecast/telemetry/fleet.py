"""The fleet layout: many runs as one Parquet dataset partitioned by run.

A fleet is a directory holding one ``run_id=<id>/`` directory per run (the id URL-quoted, so
any run id is a valid name) with that run's events in ``*.parquet`` parts, each carrying the
run's metadata in its key-value store as a single events file does. ``simulate --runs N --out
DIR/`` and :func:`bubblecast.telemetry.io.write_events` to a directory write ``part-00000.parquet``
per run; the recorder writes ``rank<r>-<k>.parquet`` parts into the same kind of directory.

Appending a run is atomic: its directory is written under a hidden temporary name and renamed
into place, so readers (which skip hidden names) never see half a run.

This module knows the layout only (names, listing, units of work, the atomic append); reading
and writing Parquet is :mod:`bubblecast.telemetry.io`'s, handed in as a callable where needed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote, unquote

from bubblecast.errors import BubblecastError

if TYPE_CHECKING:
    from bubblecast.telemetry.events import Events

#: Name prefix of a run's directory in a fleet (Hive-style partitioning by ``run_id``).
RUN_PREFIX = "run_id="
#: File name of a run's part written by ``write_events``/``simulate``.
PART_NAME = "part-00000.parquet"


def run_dir_name(run_id: str) -> str:
    """``run_id=<quoted id>``: the directory of ``run_id`` in a fleet."""
    return RUN_PREFIX + quote(str(run_id), safe="")


def run_id_of(path: str | os.PathLike[str]) -> str | None:
    """The run id a ``run_id=<id>`` directory name stands for; None for another name."""
    name = Path(path).name
    return unquote(name[len(RUN_PREFIX):]) if name.startswith(RUN_PREFIX) else None


def fleet_runs(path: str | os.PathLike[str]) -> dict[str, Path]:
    """The runs of a fleet directory, ``{run_id: run directory}`` in name order (empty when
    ``path`` is not a fleet). Hidden names (temporaries of an append) are skipped."""
    p = Path(path)
    if not p.is_dir():
        return {}
    out: dict[str, Path] = {}
    for entry in sorted(os.scandir(p), key=lambda e: e.name):
        run_id = run_id_of(entry.name)
        if run_id is not None and entry.is_dir():
            out[run_id] = Path(entry.path)
    return out


def is_fleet(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a directory with at least one ``run_id=<id>`` run directory."""
    return bool(fleet_runs(path))


def is_directory_target(path: str | os.PathLike[str]) -> bool:
    """Whether an output ``path`` names a directory: it exists as one, or ends with ``/``."""
    text = os.fspath(path)
    return Path(text).is_dir() or text.endswith(("/", os.sep))


@dataclass(frozen=True)
class Unit:
    """One unit of work: a run of a fleet (``run_id`` set, ``path`` its directory), or a whole
    file or plain directory (``run_id`` None) whose runs are read together."""

    path: Path
    run_id: str | None = None
    source: Path | None = None  # the argument this unit came from

    @property
    def label(self) -> str:
        return f"run '{self.run_id}' ({self.path})" if self.run_id is not None else str(self.path)


def units_of(paths: list[Path] | list[str]) -> list[Unit]:
    """The units of work of command-line inputs, in input order: one per run of a fleet, one
    per other file or directory."""
    units: list[Unit] = []
    for raw in paths:
        p = Path(raw)
        runs = fleet_runs(p)
        if runs:
            units.extend(Unit(d, r, p) for r, d in runs.items())
        else:
            units.append(Unit(p, None, p))
    return units


def _stale_temporaries(fleet: Path) -> None:
    """Remove temporaries of appends that were killed (hidden ``.run_id=...`` directories last
    changed more than a day ago, or by a process that no longer runs: left as they are when
    unsure)."""
    for entry in os.scandir(fleet):
        if not (entry.name.startswith("." + RUN_PREFIX) and entry.is_dir()):
            continue
        pid = entry.name.rsplit(".", 1)[-1]
        alive = pid.isdigit() and _pid_alive(int(pid))
        if not alive:
            shutil.rmtree(entry.path, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def append_run(events: Events, fleet: str | os.PathLike[str],
               write_file: Callable[[Events, Path], object]) -> Path:
    """Add the one run of ``events`` to ``fleet`` atomically; return its directory.

    ``write_file(events, path)`` writes the part (``write_events``). The run directory is
    filled under a hidden temporary name, then renamed; a run already in the fleet is
    refused (one line), and on any failure nothing of the run is left."""
    if len(events.runs) != 1:
        raise BubblecastError(f"append_run: needs the events of one run, got {len(events.runs)}")
    run_id = next(iter(events.runs))
    root = Path(fleet)
    root.mkdir(parents=True, exist_ok=True)
    target = root / run_dir_name(run_id)
    if target.exists():
        raise BubblecastError(f"{target}: run '{run_id}' is already in the fleet {root}")
    _stale_temporaries(root)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=f".{os.getpid()}", dir=root))
    try:
        write_file(events, tmp / PART_NAME)
        os.chmod(tmp, 0o777 & ~_umask())
        os.rename(tmp, target)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if target.exists():
            raise BubblecastError(f"{target}: run '{run_id}' is already in the fleet {root}") \
                from None
        raise BubblecastError(f"{target}: cannot add run '{run_id}' ({exc})") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def append_runs(events: Events, fleet: str | os.PathLike[str],
                write_file: Callable[[Events, Path], object]) -> Path:
    """Add every run of ``events`` to ``fleet``, each atomically (see :func:`append_run`);
    runs already present are refused before anything is written."""
    root = Path(fleet)
    taken = [r for r in events.runs if (root / run_dir_name(r)).exists()]
    if taken:
        raise BubblecastError(f"{root / run_dir_name(taken[0])}: run '{taken[0]}' is already "
                              f"in the fleet {root}")
    for _run_id, one in events.by_run():
        append_run(one, root, write_file)
    return root


__all__ = ["PART_NAME", "RUN_PREFIX", "Unit", "append_run", "append_runs", "fleet_runs",
           "is_directory_target", "is_fleet", "run_dir_name", "run_id_of", "units_of"]
