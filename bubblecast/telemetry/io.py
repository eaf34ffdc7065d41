"""Parquet I/O for ``events``: files or directories, run metadata, atomic writes.

Parquet settings (:func:`parquet_options`) favour write speed at a modest size, since writing
events is most of what ``simulate`` spends its time on (``benchmarks/bench_write.py`` times
them):

- **Dictionary encoding only for the string columns** (``run_id``, ``op``, ``host``...). They
  reach Arrow as dictionary arrays built from the pandas categorical codes, so they are
  never turned into Python strings, and the writer stores their few values once plus
  run-length-encoded indices. Integer and float columns are written PLAIN: hashing every
  value into a dictionary costs more write time than it saves in bytes.
- **Compression**: LZ4 (the fastest codec Parquet readers all support) on every column but
  the float times ``start_s``, ``duration_s`` and ``wait_s``, whose mantissas are noise to a
  general-purpose codec (little saved for much more write time). zstd would make files
  smaller and the write slower.
- **No statistics for ``op``**: its per-row-group min/max (always about "B".."F") select
  nothing; every other column keeps them.
- **Row groups** of 1Mi rows (pyarrow's default, stated so it cannot drift): big enough for
  run-length encoding, small enough that a reader can read row groups in parallel.
- **Write batches of 64Ki rows** (``write_batch_size``; pyarrow's default is 1024): fewer
  rounds of the writer's per-batch work (statistics of the dictionary columns, page-size
  checks) for the same bytes (pages may run up to one batch past the 1 MiB page size).
- **Page checksums** (CRC32) are written and verified on read, so a corrupted page is an
  error naming the file, never silently different numbers.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from bubblecast.errors import BubblecastError
from bubblecast.telemetry.events import Events
from bubblecast.telemetry.frames import read_streaming, table_to_pandas, wanted_columns
from bubblecast.telemetry.schema import (
    METADATA_KEY,
    OPTIONAL,
    REQUIRED,
    RunMeta,
    decode_metadata,
    encode_metadata,
)
from bubblecast.telemetry.validate import (
    SchemaError,
    check_rows,
    prepare_frame,
    validate_frame,
)

#: Float columns with about one distinct value per row: no codec (see module doc).
PLAIN_COLUMNS: tuple[str, ...] = ("start_s", "duration_s", "wait_s")
ROW_GROUP_ROWS = 1 << 20
#: Rows the Parquet writer encodes per batch (pyarrow's default is 1024; see module doc).
WRITE_BATCH_ROWS = 1 << 16
_IMPORTED = time.time()
#: ``tempfile.mkstemp``'s random part: 8 characters of this set.
_TMP_RANDOM = "[a-z0-9_]{8}"


def process_start_time() -> float:
    """When this process loaded bubblecast's I/O (epoch seconds): temporaries last modified
    before it were left by an earlier process."""
    return _IMPORTED


def _lock(fd: int, *, wait: bool) -> bool:
    """Take an exclusive advisory lock on ``fd``; False when another process holds one.
    Where ``fcntl`` does not exist, always True."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no locks, the age test alone decides
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        return False
    return True


def _remove_if_unlocked(path: str) -> bool:
    """Unlink a temporary file unless a live writer holds its lock (see :func:`atomic_write`)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        if not _lock(fd, wait=False):
            return False
        os.unlink(path)
        return True
    finally:
        os.close(fd)


def remove_stale_temporaries(target: str | os.PathLike[str], *, dirs: bool = False) -> list[Path]:
    """Delete temporaries a killed writer of ``target`` left next to it; return them.

    Only our own naming pattern counts: ``.NAME.XXXXXXXX.tmp`` files of :func:`atomic_write`
    (and ``.NAME.XXXXXXXX`` directories with ``dirs=True``), last modified before this
    process started; a file is also kept while its writer, alive, holds its lock. Anything
    else (user files, other hidden names) is never touched."""
    target = Path(target)
    suffix = "" if dirs else r"\.tmp"
    prefix = f".{target.name}."  # a cheap filter first: a run's directory holds many parts
    removed: list[Path] = []
    try:
        candidates = [e for e in os.scandir(target.parent) if e.name.startswith(prefix)]
    except OSError:
        return removed
    if not candidates:
        return removed
    pattern = re.compile(rf"\.{re.escape(target.name)}\.{_TMP_RANDOM}{suffix}")
    started = process_start_time()
    for entry in candidates:
        if not pattern.fullmatch(entry.name):
            continue
        try:
            if entry.is_symlink() or entry.stat().st_mtime >= started:
                continue
            if entry.is_file() and not dirs:
                if not _remove_if_unlocked(entry.path):
                    continue
            elif entry.is_dir() and dirs:
                shutil.rmtree(entry.path)
            else:
                continue
        except OSError:
            continue  # gone already, or not ours to delete: leave it
        removed.append(Path(entry.path))
    return removed


def _write_alongside(tmp: str, write: Callable[[str], None],
                     alongside: Callable[[], None]) -> None:
    """``write(tmp)`` on a worker thread while ``alongside()`` runs on this one (the Parquet
    writer releases the GIL, so on two cores the two overlap); ``alongside``'s error wins."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            write(tmp)
        except BaseException as exc:  # handed to the caller below
            failed.append(exc)

    worker = threading.Thread(target=run, name="bubblecast-write", daemon=True)
    worker.start()
    try:
        alongside()
    finally:
        worker.join()
    if failed:
        raise failed[0]


def atomic_write(path: str | os.PathLike[str], write: Callable[[str], None], *,
                 alongside: Callable[[], None] | None = None) -> Path:
    """Call ``write(tmp_path)`` then rename onto ``path``; on any error no file is left.

    ``alongside`` (a check, say) runs while ``write`` does; if it raises, the temporary is
    removed and ``path`` is left as it was. Temporaries of earlier writers of ``path`` that
    were killed are removed first."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        _lock(fd, wait=True)  # held while writing: others' clean-up leaves this file alone
        if alongside is None:
            write(tmp)
        else:
            _write_alongside(tmp, write, alongside)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the usual file mode
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    finally:
        os.close(fd)
    return target


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text))


def parquet_files(path: str | os.PathLike[str]) -> list[Path]:
    """The Parquet files behind ``path`` (a file, or a directory searched recursively)."""
    p = Path(path)
    if p.is_dir():
        # hidden names anywhere below ``p`` are temporaries (a fleet run being appended)
        files = sorted(f for f in p.rglob("*.parquet")
                       if not any(part.startswith(".") for part in f.relative_to(p).parts))
        if not files:
            raise BubblecastError(f"{p}: directory holds no .parquet files")
        return files
    if not p.exists():
        raise BubblecastError(f"{p}: no such file or directory")
    return [p]


def _unreadable(path: Path, exc: Exception) -> BubblecastError:
    """One line naming the file; a failed page checksum says the file is corrupted."""
    text = " ".join(str(exc).split())
    if "checksum" in text.lower() or "crc" in text.lower():
        return BubblecastError(f"{path}: corrupted Parquet file (page checksum mismatch: "
                               f"{text})")
    return BubblecastError(f"{path}: not a readable Parquet file ({text})")


def check_unread_types(schema: pa.Schema, want: list[str] | None, source: str) -> None:
    """Type-check the known numeric optional columns of ``schema`` that a read leaves out
    (``want``: the columns read; None = all, nothing to check), from the schema only, no data:
    a file is refused as a whole whichever columns a command reads. Raises
    :class:`SchemaError` naming ``source`` and the column; shared by every Parquet reader of
    events (this module's and :mod:`.fleet_read`'s)."""
    if want is None:
        return
    for field in schema:
        expected = OPTIONAL.get(field.name)
        if field.name in want or expected is None or pa.types.is_string(expected):
            continue
        if not (pa.types.is_integer(field.type) or pa.types.is_floating(field.type)
                or pa.types.is_null(field.type)):
            kind = "integer" if pa.types.is_integer(expected) else "float"
            raise SchemaError(source, field.name, None, f"expected {kind}, got {field.type}")


def _read_one(path: Path, columns: list[str] | None = None) -> Events:
    want = columns
    try:
        schema = pq.read_schema(path)
        want, strings = wanted_columns(schema, columns)
        check_unread_types(schema, want, str(path))
        frame, meta = read_streaming(path, want, strings)
        if frame is None:
            box = [pq.read_table(path, columns=want, read_dictionary=strings,
                                 page_checksum_verification=True)]
            meta = box[0].schema.metadata or {}
            frame = table_to_pandas(box)
    except (pa.ArrowInvalid, OSError) as exc:
        raise _unreadable(path, exc) from None
    except BubblecastError:
        raise
    except Exception:  # pyarrow raises several types for an odd dictionary column
        try:
            box = [pq.read_table(path, columns=want, page_checksum_verification=True)]
        except Exception as again:
            raise _unreadable(path, again) from None
        meta = box[0].schema.metadata or {}
        frame = table_to_pandas(box)
    try:
        runs = decode_metadata(meta.get(METADATA_KEY))
    except (ValueError, TypeError, KeyError) as exc:
        raise BubblecastError(f"{path}: bad '{METADATA_KEY.decode()}' metadata: {exc}") from None
    return Events(validate_frame(frame, runs, str(path)), runs)


def read_events(path: str | os.PathLike[str], columns: list[str] | None = None) -> Events:
    """Read and validate an events file or directory of files (SPEC §1).

    ``columns``: the optional and extra columns to read besides the required ones, which are
    always read (validation needs them); absent ones are skipped; None reads every column.
    String columns come back as pandas categoricals (Parquet dictionary pages are kept
    encoded), so a ``host`` column costs one small integer per row, not one string."""
    parts = [_read_one(f, columns) for f in parquet_files(path)]
    return parts[0] if len(parts) == 1 else Events.concat(parts)


def _dictionary_array(series: pd.Series) -> pa.DictionaryArray:
    """A categorical column as Arrow dictionary array: its codes, zero-copy, and its
    categories as strings (a handful), never one Python string per row."""
    codes = series.cat.codes.to_numpy()
    missing = codes < 0
    indices = pa.array(codes, mask=missing if missing.any() else None)
    categories = pa.array([str(c) for c in series.cat.categories], type=pa.string())
    return pa.DictionaryArray.from_arrays(indices, categories)


def _column_array(series: pd.Series, typ: pa.DataType | None, required: bool) -> pa.Array:
    """One column without a copy when its dtype already matches ``typ`` (numpy-backed)."""
    if isinstance(series.dtype, pd.CategoricalDtype):
        return _dictionary_array(series)
    if isinstance(series.dtype, np.dtype) and series.dtype != object:
        # Required columns are validated finite: no NaN-to-null pass over them.
        return pa.array(series.to_numpy(), type=typ, from_pandas=not required)
    return pa.array(series.array, type=typ, from_pandas=True)


def to_table(events: Events, source: str = "<memory>") -> pa.Table:
    """The events as an Arrow table with SPEC types and the run metadata attached.

    ``run_id`` and ``op`` become dictionary arrays (Parquet still stores them as UTF-8
    strings, dictionary-encoded); numeric columns share the frame's memory."""
    frame = events.frame
    arrays, fields = [], []
    names = list(REQUIRED) + [c for c in frame.columns if c not in REQUIRED]
    for name in names:
        typ = REQUIRED.get(name, OPTIONAL.get(name))
        required = name in REQUIRED
        if not required and typ == pa.string() and pd.api.types.is_numeric_dtype(frame[name]):
            typ = None  # e.g. a device index: kept as the number it is
        try:
            arr = _column_array(frame[name], typ, required)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
            problem = " ".join(str(exc).split())
            raise SchemaError(source, str(name), None, f"cannot store as {typ}: {problem}") \
                from None
        arrays.append(arr)
        fields.append(pa.field(str(name), arr.type, nullable=not required))
    schema = pa.schema(fields, metadata={METADATA_KEY: encode_metadata(events.runs)})
    return pa.Table.from_arrays(arrays, schema=schema)


def parquet_options(table: pa.Table) -> dict[str, Any]:
    """``pyarrow.parquet.write_table`` keywords for an events table (module doc says why)."""
    names = table.column_names
    strings = [c for c in names
               if pa.types.is_dictionary(table.schema.field(c).type)
               or pa.types.is_string(table.schema.field(c).type)
               or pa.types.is_large_string(table.schema.field(c).type)]
    return {
        "use_dictionary": strings,
        "compression": {c: "none" if c in PLAIN_COLUMNS else "lz4" for c in names},
        "write_statistics": [c for c in names if c != "op"],
        "row_group_size": ROW_GROUP_ROWS,
        "write_batch_size": WRITE_BATCH_ROWS,
        "write_page_checksum": True,
    }


def write_events(events: Events, path: str | os.PathLike[str], *, validate: bool = True) -> Path:
    """Validate then write ``events`` to one Parquet file atomically.

    The checks that need no pass over the rows run first; the row checks then run while the
    file is written (a refused table leaves no file, and its error is the one raised).
    A ``path`` that is a directory (or ends with ``/``) is a fleet: each run is appended as
    ``run_id=<id>/part-00000.parquet``, atomically (:mod:`bubblecast.telemetry.fleet`)."""
    from bubblecast.telemetry import fleet

    if fleet.is_directory_target(path):
        return fleet.append_runs(events, path, lambda one, part: write_events(
            one, part, validate=validate))
    runs = dict(events.runs)
    frame = prepare_frame(events.frame, runs, str(path)) if validate else events.frame
    table = to_table(Events(frame, runs), str(path))
    options = parquet_options(table)
    check = (lambda: check_rows(frame, runs, str(path))) if validate else None
    return atomic_write(path, lambda tmp: pq.write_table(table, tmp, **options), alongside=check)


__all__ = ["PLAIN_COLUMNS", "RunMeta", "SchemaError", "atomic_write", "atomic_write_text",
           "check_unread_types", "parquet_files", "parquet_options", "read_events",
           "remove_stale_temporaries", "to_table", "write_events"]
