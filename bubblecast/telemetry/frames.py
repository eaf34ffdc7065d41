"""Parquet events files to pandas frames without a second copy, strings kept categorical.

:func:`read_streaming` fills one preallocated array per column row group by row group (memory
holds the frame plus one row group, never the whole Arrow table as well); string columns are
read as Parquet dictionaries and become pandas categoricals (codes into a few categories),
optional integer columns with nulls become nullable integers directly. Files with other
column types go through :func:`table_to_pandas` (one Arrow table, released column by column
as it is converted). Used by :func:`bubblecast.telemetry.io.read_events`, which validates.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from bubblecast.telemetry.schema import REQUIRED

#: Optional integer columns that may hold nulls: read as pandas nullable integers.
_NULLABLE_INTS = {"layers": pd.Int32Dtype(), "tokens": pd.Int64Dtype(),
                  "documents": pd.Int32Dtype()}


def wanted_columns(schema: pa.Schema, columns: list[str] | None
                   ) -> tuple[list[str] | None, list[str]]:
    """The columns to read (None: all; the required ones always, validation needs them) and,
    of those, the string columns to keep dictionary-encoded (pandas categoricals)."""
    want = None if columns is None else \
        [n for n in schema.names if n in REQUIRED or n in set(columns)]
    strings = [f.name for f in schema if (want is None or f.name in want)
               and (pa.types.is_string(f.type) or pa.types.is_large_string(f.type))]
    return want, strings


def table_to_pandas(box: list[pa.Table]) -> pd.DataFrame:
    """The table in ``box`` (taken out of it: no other reference may keep its buffers) as a
    frame without a second copy: columns converted one by one and each Arrow buffer released
    once converted (``self_destruct``, one block per column); optional integer columns
    holding nulls become nullable integers directly (not float64 then back)."""
    table = box.pop()
    names = table.column_names
    nullable = {c: table.column(c).to_pandas(types_mapper={
        pa.int32(): _NULLABLE_INTS[c], pa.int64(): _NULLABLE_INTS[c]}.get)
        for c in _NULLABLE_INTS if c in names and table.column(c).null_count
        and pa.types.is_integer(table.schema.field(c).type)}
    rest = table.drop_columns(list(nullable)) if nullable else table
    del table
    frame = rest.to_pandas(self_destruct=True, split_blocks=True, use_threads=False)
    del rest
    for col, values in sorted(nullable.items(), key=lambda kv: names.index(kv[0])):
        frame.insert(min(names.index(col), frame.shape[1]), col, values.array)
    return frame


def _streamable(schema: pa.Schema) -> bool:
    """Whether every column is an integer, a float or a dictionary of strings (then
    :func:`_read_streaming` can fill the frame row group by row group)."""
    return all(pa.types.is_integer(t) or pa.types.is_floating(t) or (
        pa.types.is_dictionary(t) and (pa.types.is_string(t.value_type)
                                       or pa.types.is_large_string(t.value_type)))
        for t in schema.types)


class _Column:
    """One column filled row group by row group into a preallocated array: numbers as they
    are (nulls as a mask), dictionary-encoded strings as codes into categories seen so far."""

    def __init__(self, typ: pa.DataType, n: int) -> None:
        self.dictionary = pa.types.is_dictionary(typ)
        dtype = np.int32 if self.dictionary else typ.to_pandas_dtype()
        self.values = np.empty(n, dtype=dtype)
        self.mask: np.ndarray | None = None
        self.categories: dict[str, int] = {}

    def put(self, at: int, chunk: pa.Array) -> None:
        n = len(chunk)
        if self.dictionary:
            words = chunk.dictionary.to_pylist()
            lookup = np.array([self.categories.setdefault(w, len(self.categories))
                               for w in words] + [-1], dtype=np.int32)
            codes = chunk.indices.fill_null(len(words)).to_numpy()
            self.values[at:at + n] = lookup[codes]
            return
        if chunk.null_count:
            if self.mask is None:
                self.mask = np.zeros(len(self.values), dtype=bool)
            self.mask[at:at + n] = chunk.is_null().to_numpy(zero_copy_only=False)
            chunk = chunk.fill_null(0 if pa.types.is_integer(chunk.type) else np.nan)
        self.values[at:at + n] = chunk.to_numpy()

    def series(self) -> Any:
        if self.dictionary:
            return pd.Categorical.from_codes(self.values, categories=list(self.categories))
        if self.mask is not None and self.values.dtype.kind in "iu":
            return pd.arrays.IntegerArray(self.values, self.mask)
        if self.mask is not None:
            self.values[self.mask] = np.nan
        return self.values


def read_streaming(path: Path, want: list[str] | None, strings: list[str]) -> tuple[
        pd.DataFrame | None, dict[bytes, bytes]]:
    """The file as a frame built row group by row group, so that memory holds the frame plus
    one row group (not the whole Arrow table as well); None when a column type needs the
    general path. And the file's key-value metadata."""
    pf = pq.ParquetFile(path, read_dictionary=strings, page_checksum_verification=True)
    schema = pf.schema_arrow
    meta = schema.metadata or {}
    fields = [schema.field(c) for c in (want if want is not None else schema.names)]
    if not _streamable(pa.schema(fields)):
        return None, meta
    n = pf.metadata.num_rows
    cols = {f.name: _Column(f.type, n) for f in fields}
    at = 0
    for i in range(pf.num_row_groups):
        group = pf.read_row_group(i, columns=list(cols))
        for name, col in cols.items():
            offset = at
            for chunk in group.column(name).chunks:
                col.put(offset, chunk)
                offset += len(chunk)
        at += group.num_rows
        del group
    pa.default_memory_pool().release_unused()  # the row groups' buffers, back to the system
    # copy=False: the arrays become the blocks as they are (one per column, not consolidated)
    return pd.DataFrame({name: col.series() for name, col in cols.items()}, copy=False), meta
