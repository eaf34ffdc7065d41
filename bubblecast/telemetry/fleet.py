"""The fleet layout: many runs as one plain hive-partitioned Parquet dataset.

A fleet is a directory holding one ``run_id=<id>/`` directory per run (the id URL-quoted, so
any run id is a valid name) with that run's events in ``*.parquet`` parts, each carrying the
run's metadata in its key-value store as a single events file does. ``simulate --runs N --out
DIR/`` and :func:`bubblecast.telemetry.io.write_events` to a directory write ``part-00000.parquet``
per run.

So that every common reader (pandas, ``pyarrow.dataset`` with hive partitioning, polars, duckdb,
dask) opens a fleet as the same rows as the single-file output, a part (:func:`part_table`):

- holds no ``run_id`` column: the partition key ``run_id=<id>`` stores it once (an in-file copy
  clashes with the key's inferred type in one reader or another);
- has the fleet's one schema: the SPEC's other required columns, then every SPEC optional
  column (absent ones as typed nulls), then the fleet's extra columns (those of its first run;
  a later run may lack one, never add one); string columns dictionary-encoded with ``int32``
  indices;
- is the only kind of file inside the fleet directory. Sidecars (device metrics of a run)
  live beside the fleet in ``_<name>.sidecars/run_id=<id>/`` (:func:`run_sidecar_dir`): polars
  reads every file under the directory it is given, underscore- or dot-prefixed ones included.

Fleets written before this layout (``run_id`` inside each part, ``*.metrics`` inside the run
directories: :func:`is_legacy_part`) are still read; new runs are not appended to them.

Appending a run is atomic: its directory is written under a hidden temporary name and renamed
into place, so readers (which skip hidden names) never see half a run.

This module knows the layout (names, listing, the part schema, units of work, the atomic
append); writing Parquet is :mod:`bubblecast.telemetry.io`'s, handed in as a callable.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

from bubblecast.errors import BubblecastError

if TYPE_CHECKING:
    from bubblecast.telemetry.events import Events

#: Name prefix of a run's directory in a fleet (Hive-style partitioning by ``run_id``).
RUN_PREFIX = "run_id="
#: File name of a run's part written by ``write_events``/``simulate``.
PART_NAME = "part-00000.parquet"
#: Suffix of the folder beside a directory output (``_<name>.sidecars``) holding its sidecars.
SIDECARS_SUFFIX = ".sidecars"


def sidecar_dir(root: str | os.PathLike[str]) -> Path:
    """``_<name>.sidecars/`` beside the directory output ``root`` (a fleet or a features
    dataset): where its sidecar files live, outside the data tree every reader lists."""
    p = Path(os.path.normpath(os.fspath(root)))
    if p.name in ("", ".", ".."):
        p = Path(os.path.abspath(p))
    return p.parent / f"_{p.name}{SIDECARS_SUFFIX}"


def run_sidecar_dir(run_dir: str | os.PathLike[str]) -> Path:
    """The sidecar folder of a fleet's run directory ``FLEET/run_id=<id>``:
    ``_FLEET.sidecars/run_id=<id>/``."""
    p = Path(os.path.normpath(os.fspath(run_dir)))
    return sidecar_dir(p.parent) / p.name


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


def is_legacy_part(names: list[str], path: str | os.PathLike[str]) -> bool:
    """Whether a part with columns ``names`` at ``path`` is of the layout before the current
    one (``run_id`` stored inside the part of a ``run_id=`` directory)."""
    return "run_id" in names and run_id_of(Path(path).parent) is not None


def part_schema(root: str | os.PathLike[str]) -> Any:
    """The Arrow schema of a part already in the fleet ``root`` (the fleet's schema, which
    every part shares), or None for a new or empty fleet; one footer read (none when this
    process read the same unchanged part before: a fleet written run after run)."""
    p = Path(root)
    if not p.is_dir():
        return None
    for entry in os.scandir(p):
        if run_id_of(entry.name) is None or not entry.is_dir():
            continue
        parts = sorted(f for f in os.listdir(entry.path)
                       if f.endswith(".parquet") and not f.startswith("."))
        if parts:
            part = os.path.join(entry.path, parts[0])
            stat = os.stat(part)
            return _footer_schema(part, stat.st_mtime_ns, stat.st_size, stat.st_ino)
    return None


@functools.lru_cache(maxsize=16)
def _footer_schema(path: str, *stamp: int) -> Any:
    """The Arrow schema in the footer of the file ``path`` as it was at ``stamp``."""
    import pyarrow.parquet as pq

    return pq.read_schema(path)


def _string_type(typ: Any) -> bool:
    import pyarrow as pa

    value = typ.value_type if pa.types.is_dictionary(typ) else typ
    return bool(pa.types.is_string(value) or pa.types.is_large_string(value))


def _conform(column: Any, typ: Any, source: str, name: str) -> Any:
    """``column`` (an Arrow array or chunked array) as type ``typ`` of the fleet's schema."""
    import pyarrow as pa

    if column.type == typ:
        return column
    try:
        if pa.types.is_dictionary(typ) and not pa.types.is_dictionary(column.type):
            column = column.cast(pa.string())
            chunked = column if isinstance(column, pa.ChunkedArray) else \
                pa.chunked_array([column])
            column = chunked.combine_chunks().dictionary_encode()
        return column.cast(typ)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise BubblecastError(f"{source}: column '{name}' is {column.type}, the fleet's parts "
                              f"hold {typ} ({' '.join(str(exc).split())})") from None


def part_table(table: Any, reference: Any = None, source: str = "<memory>") -> Any:
    """An events Arrow table of one run as a part of a fleet whose parts have the schema
    ``reference`` (None: a new fleet): the layout in the module doc. Raises a one-line
    :class:`BubblecastError` for a column the fleet's schema has no room for."""
    import pyarrow as pa

    from bubblecast.telemetry.schema import OPTIONAL, REQUIRED

    dict32 = pa.dictionary(pa.int32(), pa.string())
    if reference is not None and "run_id" in reference.names:
        raise BubblecastError(f"{source}: the fleet was written in the layout before this "
                              "bubblecast's (run_id inside each part); it is still read, "
                              "but write new runs to a new fleet directory")
    known = [c for c in REQUIRED if c != "run_id"] + list(OPTIONAL)
    schema = table.schema
    present = set(schema.names)
    extras = [c for c in schema.names if c not in REQUIRED and c not in OPTIONAL]
    if reference is not None:
        ref_extras = [c for c in reference.names if c not in REQUIRED and c not in OPTIONAL]
        new = [c for c in extras if c not in ref_extras]
        if new:
            raise BubblecastError(f"{source}: column '{new[0]}' is not in the fleet's schema "
                                  "(the runs of a fleet share one schema: write this run to "
                                  "another fleet)")
        extras = ref_extras
    n = table.num_rows
    arrays, fields = [], []
    for name in known + extras:
        if reference is not None:
            typ = reference.field(name).type
        elif name == "op":
            typ = pa.dictionary(pa.int8(), pa.string())
        elif name in present and not _string_type(schema.field(name).type):
            typ = schema.field(name).type
        else:
            typ = REQUIRED.get(name, OPTIONAL.get(name, pa.string()))
            typ = dict32 if _string_type(typ) else typ
        column = table.column(name) if name in present else pa.nulls(n, typ)
        arrays.append(_conform(column, typ, source, name))
        fields.append(pa.field(name, typ, nullable=name not in REQUIRED))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields, metadata=schema.metadata))


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


__all__ = ["PART_NAME", "RUN_PREFIX", "SIDECARS_SUFFIX", "Unit", "append_run", "append_runs",
           "fleet_runs", "is_directory_target", "is_fleet", "is_legacy_part", "part_schema",
           "part_table", "run_dir_name", "run_id_of", "run_sidecar_dir", "sidecar_dir",
           "units_of"]
