"""Parquet I/O for ``events`` through pandas frames: files or directories, run metadata,
validated atomic writes.

The pieces that need no pandas (atomic writes, stale temporaries, the Parquet settings and
their module doc) live in :mod:`bubblecast.telemetry.parquet_write` and are re-exported here.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from bubblecast.errors import BubblecastError
from bubblecast.telemetry.events import Events
from bubblecast.telemetry.frames import read_streaming, table_to_pandas, wanted_columns
from bubblecast.telemetry.parquet_write import (
    PLAIN_COLUMNS,
    ROW_GROUP_ROWS,
    WRITE_BATCH_ROWS,
    atomic_write,
    atomic_write_text,
    parquet_options,
    process_start_time,
    remove_stale_temporaries,
)
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


def null_columns(meta: pq.FileMetaData) -> set[str]:
    """The non-required top-level columns of a Parquet file that hold only nulls, by its
    footer's statistics (a column without statistics counts as holding values)."""
    out: set[str] = set()
    for j in range(meta.num_columns):
        name = meta.schema.column(j).path.split(".")[0]
        nulls = 0
        for i in range(meta.num_row_groups):
            stats = meta.row_group(i).column(j).statistics
            if stats is None or not stats.has_null_count:
                nulls = -1
                break
            nulls += stats.null_count
        if nulls == meta.num_rows and name not in REQUIRED:
            out.add(name)
    return out


def fleet_part_columns(path: Path, meta: pq.FileMetaData, want: list[str] | None
                       ) -> tuple[str | None, list[str] | None]:
    """For a part of a fleet in the current layout (no ``run_id`` column, in a ``run_id=``
    directory; ``meta`` its footer): its run id and the columns to read, less the optional
    ones the part pads with nulls (its run has none of them: they read as absent, as in the
    run written). Other files: ``(None, want)``."""
    from bubblecast.telemetry.fleet import run_id_of

    names = meta.schema.names
    run = run_id_of(path.parent) if "run_id" not in names else None
    if run is None:
        return None, want
    padded = null_columns(meta)
    return run, [c for c in (names if want is None else want) if c not in padded]


def _read_one(path: Path, columns: list[str] | None = None) -> Events:
    want, run = columns, None
    try:
        footer = pq.read_metadata(path)
        schema = footer.schema.to_arrow_schema()
        want, strings = wanted_columns(schema, columns)
        check_unread_types(schema, want, str(path))
        run, want = fleet_part_columns(path, footer, want)
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
    if run is not None:  # the partition key holds the run id
        frame.insert(0, "run_id", pd.Categorical.from_codes(np.zeros(len(frame), np.int8),
                                                            categories=[run]))
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


def write_events(events: Events, path: str | os.PathLike[str], *, validate: bool = True) -> Path:
    """Validate then write ``events`` to one Parquet file atomically.

    The checks that need no pass over the rows run first; the row checks then run while the
    file is written (a refused table leaves no file, and its error is the one raised).
    A ``path`` that is a directory (or ends with ``/``) is a fleet: each run is appended as
    ``run_id=<id>/part-00000.parquet`` in the fleet's part layout, atomically
    (:mod:`bubblecast.telemetry.fleet`)."""
    from bubblecast.telemetry import fleet

    if fleet.is_directory_target(path):
        return fleet.append_runs(events, path, lambda one, part: _write_file(
            one, part, validate, fleet_part=True))
    return _write_file(events, path, validate)


def _write_file(events: Events, path: str | os.PathLike[str], validate: bool,
                fleet_part: bool = False) -> Path:
    """:func:`write_events` of one file; ``fleet_part``: a part being added to the fleet two
    directories up (``FLEET/<temporary run directory>/part``), in the fleet's schema."""
    from bubblecast.telemetry import fleet

    runs = dict(events.runs)
    frame = prepare_frame(events.frame, runs, str(path)) if validate else events.frame
    table = to_table(Events(frame, runs), str(path))
    if fleet_part:
        table = fleet.part_table(table, fleet.part_schema(Path(path).parent.parent), str(path))
    options = parquet_options(table)
    check = (lambda: check_rows(frame, runs, str(path))) if validate else None
    return atomic_write(path, lambda tmp: pq.write_table(table, tmp, **options), alongside=check)


__all__ = ["PLAIN_COLUMNS", "ROW_GROUP_ROWS", "WRITE_BATCH_ROWS", "RunMeta", "SchemaError",
           "atomic_write", "atomic_write_text", "check_unread_types", "fleet_part_columns",
           "null_columns", "parquet_files",
           "parquet_options", "process_start_time", "read_events", "remove_stale_temporaries",
           "to_table", "write_events"]
