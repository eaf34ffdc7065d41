"""A group of fleet runs read at once: one Arrow dataset scan, one validation.

Reading a fleet run by run (:func:`bubblecast.telemetry.io.read_events` per run directory)
pays fixed work per run (footer, frame assembly, a validation pass and a concat), which
dominates for small runs. A worker of a partitioned build reads its
whole group of runs here instead: every part's footer is read (schemas and run metadata), the
parts are scanned as one ``pyarrow.dataset`` (strings kept dictionary-encoded, page checksums
verified) into one frame, and that frame is validated once. The result equals reading the
runs one by one and concatenating them (:meth:`Events.concat`: run ids in sorted categories).

Anything unusual (schemas that differ, a part without run metadata, a run whose metadata must
be inferred, parts of two fleet layouts, a file that fails to read or validate) gives None:
the caller then reads run by run, whose errors name the run and file exactly as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bubblecast.errors import BubblecastError
from bubblecast.telemetry.events import Events


def _footers(files: list[Path], columns: list[str] | None) -> tuple[Any, dict[str, Any], Any]:
    """The union of the columns ``files`` hold that a read wants (a run without ``tokens``
    gets nulls there, as a concat gives; the optional columns a current-layout part pads with
    nulls count as absent there) and their runs' metadata, merged in file order as a concat
    does; and, when the parts hold no ``run_id`` (the partition key does), the run of each
    file's rows (None for parts of the earlier layout). Raises when a part has no run
    metadata, types conflict, or the layouts are mixed."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from bubblecast.telemetry.frames import wanted_columns
    from bubblecast.telemetry.io import check_unread_types, fleet_part_columns
    from bubblecast.telemetry.schema import METADATA_KEY, decode_metadata

    runs: dict[str, Any] = {}
    schemas = []
    keys: list[tuple[str, int]] = []
    for f in files:
        footer = pq.read_metadata(f)
        schema = footer.schema.to_arrow_schema()
        want, _ = wanted_columns(schema, columns)
        check_unread_types(schema, want, str(f))
        run, want = fleet_part_columns(f, footer, want)
        if run is not None:
            keys.append((run, footer.num_rows))
        decoded = decode_metadata((schema.metadata or {}).get(METADATA_KEY))
        if not decoded:
            raise ValueError(f"{f}: no run metadata")
        runs.update(decoded)
        kept = schema.remove_metadata()
        schemas.append(kept if want is None else pa.schema([kept.field(c) for c in want]))
    if keys and len(keys) != len(files):
        raise ValueError("parts of two fleet layouts")
    return pa.unify_schemas(schemas), runs, keys or None


def _run_ids(keys: list[tuple[str, int]]) -> Any:
    """The ``run_id`` column of parts whose rows belong to ``keys`` ``(run, rows)`` in
    order: a dictionary array over the sorted run ids (as :meth:`Events.concat` orders)."""
    import numpy as np
    import pyarrow as pa

    names = sorted({run for run, _ in keys})
    code = {run: i for i, run in enumerate(names)}
    indices = np.repeat(np.array([code[r] for r, _ in keys], dtype=np.int32),
                        [n for _, n in keys])
    return pa.DictionaryArray.from_arrays(pa.array(indices), pa.array(names, pa.string()))


def _scan(files: list[Path], schema: Any, keys: Any = None) -> Any:
    """The frame of the ``schema`` columns of ``files`` (one dataset scan, in file order;
    None when a column type needs the general reader), before validation; ``keys``: the run
    of each file's rows when the parts hold no ``run_id``."""
    import numpy as np
    import pandas as pd
    import pyarrow as pa
    import pyarrow.dataset as ds

    from bubblecast.telemetry.frames import table_to_pandas

    if not all(pa.types.is_integer(t) or pa.types.is_floating(t) or (
            pa.types.is_dictionary(t) and pa.types.is_string(t.value_type))
            for t in schema.types):
        return None  # plain strings and other types: the per-file reader's general path
    fmt = ds.ParquetFileFormat(default_fragment_scan_options=ds.ParquetFragmentScanOptions(
        page_checksum_verification=True))
    table = ds.dataset([str(f) for f in files], schema=schema, format=fmt).to_table(
        use_threads=False)
    if keys is not None:
        table = table.add_column(0, "run_id", _run_ids(keys))
    frame = table_to_pandas([table])
    pa.default_memory_pool().release_unused()
    run_id = frame["run_id"]
    if not isinstance(run_id.dtype, pd.CategoricalDtype):
        return None
    used = np.bincount(run_id.cat.codes.to_numpy() + 1, minlength=len(run_id.cat.categories)
                       + 1)[1:]
    if not used.all():  # only the runs present, as Events.concat keeps
        run_id = run_id.cat.remove_unused_categories()
    ordered = sorted(run_id.cat.categories, key=str)
    if list(run_id.cat.categories) != ordered:  # sorted, as Events.concat gives
        frame["run_id"] = run_id.cat.reorder_categories(ordered)
    elif not used.all():
        frame["run_id"] = run_id
    return frame


def read_group(paths: Sequence[str | Path], columns: list[str] | None = None) -> Events | None:
    """The events of ``paths`` (fleet run directories or events files) read as one; None
    when the group must be read run by run (see the module doc)."""
    import pyarrow as pa

    from bubblecast.telemetry.io import parquet_files
    from bubblecast.telemetry.validate import validate_frame

    try:
        files = [f for p in paths for f in parquet_files(p)]
        schema, runs, keys = _footers(files, columns)
        frame = _scan(files, schema, keys)
        if frame is None:
            return None
        known = set(runs)
        if not set(map(str, frame["run_id"].cat.categories)) <= known:
            return None  # metadata to infer: the per-run reader decides it per file
        return Events(validate_frame(frame, runs, str(paths[0])), runs)
    except (BubblecastError, OSError, ValueError, KeyError, TypeError, AttributeError,
            pa.ArrowException):
        return None


__all__ = ["read_group"]
