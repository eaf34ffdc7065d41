"""Writing events files without pandas: atomic replacement, the clean-up of temporaries that
killed writers left, and the events Parquet settings.

:mod:`bubblecast.telemetry.io` (the DataFrame path) and :mod:`bubblecast.telemetry.fastwrite`
(numpy arrays: the recorder's parts, ``simulate``'s events) both write through here, so a file
is the same byte for byte whichever path wrote it; this module imports neither pandas nor
pyarrow (:func:`parquet_options` is handed an Arrow table).

Parquet settings (:func:`parquet_options`) favour write speed at a modest size, since writing
events is most of what ``simulate`` spends its time on (``benchmarks/bench_write.py`` times
them):

- **Dictionary encoding only for the string columns** (``run_id``, ``op``, ``host``...). They
  reach Arrow as dictionary arrays built from categorical codes (pandas' or the writer's own),
  so they are never turned into Python strings, and the writer stores their few values once
  plus run-length-encoded indices. Integer and float columns are written PLAIN: hashing every
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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

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


def parquet_options(table: pa.Table) -> dict[str, Any]:
    """``pyarrow.parquet.write_table`` keywords for an events table (module doc says why)."""
    import pyarrow as pa  # loaded already: ``table`` is an Arrow table

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


__all__ = ["PLAIN_COLUMNS", "ROW_GROUP_ROWS", "WRITE_BATCH_ROWS", "atomic_write",
           "atomic_write_text", "parquet_options", "process_start_time",
           "remove_stale_temporaries"]
