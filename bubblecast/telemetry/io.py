"""Parquet I/O for ``events``: files or directories, run metadata, atomic writes."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from bubblecast.errors import BubblecastError
from bubblecast.telemetry.events import Events
from bubblecast.telemetry.schema import (
    METADATA_KEY,
    OPTIONAL,
    REQUIRED,
    RunMeta,
    decode_metadata,
    encode_metadata,
)
from bubblecast.telemetry.validate import SchemaError, validate_frame


def atomic_write(path: str | os.PathLike[str], write: Callable[[str], None]) -> Path:
    """Call ``write(tmp_path)`` then rename onto ``path``; on any error no file is left."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the usual file mode
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return target


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text))


def parquet_files(path: str | os.PathLike[str]) -> list[Path]:
    """The Parquet files behind ``path`` (a file, or a directory searched recursively)."""
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.rglob("*.parquet") if not f.name.startswith("."))
        if not files:
            raise BubblecastError(f"{p}: directory holds no .parquet files")
        return files
    if not p.exists():
        raise BubblecastError(f"{p}: no such file or directory")
    return [p]


def _read_one(path: Path) -> Events:
    try:
        table = pq.read_table(path, read_dictionary=["run_id", "op"])
    except (pa.ArrowInvalid, OSError) as exc:
        raise BubblecastError(f"{path}: not a readable Parquet file ({exc})") from None
    except Exception as exc:  # pyarrow raises several types for a missing dictionary column
        try:
            table = pq.read_table(path)
        except Exception:
            raise BubblecastError(f"{path}: not a readable Parquet file ({exc})") from None
    meta = table.schema.metadata or {}
    try:
        runs = decode_metadata(meta.get(METADATA_KEY))
    except (ValueError, TypeError, KeyError) as exc:
        raise BubblecastError(f"{path}: bad '{METADATA_KEY.decode()}' metadata: {exc}") from None
    frame = table.to_pandas()
    return Events(validate_frame(frame, runs, str(path)), runs)


def read_events(path: str | os.PathLike[str]) -> Events:
    """Read and validate an events file or directory of files (SPEC §1)."""
    parts = [_read_one(f) for f in parquet_files(path)]
    return parts[0] if len(parts) == 1 else Events.concat(parts)


def to_table(events: Events) -> pa.Table:
    """The events as an Arrow table with SPEC types and the run metadata attached."""
    frame = events.frame
    arrays, fields = [], []
    for name, typ in REQUIRED.items():
        col = frame[name]
        values = col.astype(str) if name in ("run_id", "op") else col
        arrays.append(pa.array(values.to_numpy(), type=typ))
        fields.append(pa.field(name, typ, nullable=False))
    for name in frame.columns:
        if name in REQUIRED:
            continue
        typ = OPTIONAL.get(name)
        col = frame[name]
        if isinstance(col.dtype, pd.CategoricalDtype):
            col = col.astype(str)
        arr = pa.array(col.to_numpy(), type=typ, from_pandas=True)
        arrays.append(arr)
        fields.append(pa.field(name, arr.type))
    schema = pa.schema(fields, metadata={METADATA_KEY: encode_metadata(events.runs)})
    return pa.Table.from_arrays(arrays, schema=schema)


def write_events(events: Events, path: str | os.PathLike[str], *, validate: bool = True) -> Path:
    """Validate then write ``events`` to one Parquet file atomically."""
    if validate:
        runs = dict(events.runs)
        events = Events(validate_frame(events.frame, runs, str(path)), runs)
    table = to_table(events)
    return atomic_write(path, lambda tmp: pq.write_table(table, tmp, compression="zstd"))


__all__ = ["RunMeta", "SchemaError", "atomic_write", "atomic_write_text", "parquet_files",
           "read_events", "to_table", "write_events"]
