"""The features file: Parquet with a version tag and the build config in its metadata.

A file built by another features version is refused with one line, because its columns would
mean something else to the models trained on this version.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bubblecast.dataset.config import FEATURES_VERSION, DatasetConfig
from bubblecast.errors import BubblecastError

METADATA_KEY = b"bubblecast.features"
#: Of a features dataset partitioned by run (``DIR/run_id=<id>/part-00000.parquet``), the file
#: holding the schema and the whole dataset's metadata (Parquet's dataset convention). It lives
#: in the folder beside the dataset, ``_DIR.sidecars/`` (only parts are inside ``DIR``, so every
#: reader opens it); datasets written before that hold it as ``DIR/_common_metadata``.
COMMON_METADATA = "_common_metadata"


@dataclass
class FeaturesMeta:
    """What a features file says about itself."""

    config: DatasetConfig
    fingerprint: str
    runs: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    version: int = FEATURES_VERSION
    #: Per run: schedule, stages, microbatches, chunks, replicas, comm_s and op_share (the
    #: share of compute time of F, B and W), to replay forecasts through the timing engine.
    run_info: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"features_version": self.version, "config": self.config.to_json(),
                "fingerprint": self.fingerprint, "runs": self.runs, "sources": self.sources,
                "run_info": self.run_info}


def fingerprint(frame: pd.DataFrame, config: DatasetConfig) -> str:
    """A short content hash of the rows (keys, signal, work, targets) and the build config."""
    return fingerprint_of([row_hashes(frame)], config)


def row_hashes(frame: pd.DataFrame) -> np.ndarray:
    """One 64-bit hash per row of the columns the fingerprint covers (by value, so a run's
    rows hash alike alone or among other runs)."""
    cols = [c for c in frame.columns if c in ("run_id", "replica", "stage", "step", "y", "work",
                                              "layers") or c.startswith(("y_h", "s_h"))]
    return np.ascontiguousarray(pd.util.hash_pandas_object(frame[cols], index=False).to_numpy())


def fingerprint_of(hashes: list[np.ndarray], config: DatasetConfig) -> str:
    """The fingerprint of rows whose :func:`row_hashes` are ``hashes`` (parts in row order):
    a dataset built run by run gets the fingerprint of the same rows built at once."""
    h = hashlib.sha256(json.dumps(config.to_json(), sort_keys=True).encode())
    h.update(str(FEATURES_VERSION).encode())
    for part in hashes:
        h.update(np.ascontiguousarray(part).tobytes())
    return h.hexdigest()[:16]


def write_features(frame: pd.DataFrame, meta: FeaturesMeta, path: str | os.PathLike[str]) -> Path:
    """Write the frame atomically as one Parquet file with ``meta`` in its key-value store."""
    import pyarrow as pa

    return write_features_table(pa.Table.from_pandas(frame, preserve_index=False), meta, path)


def write_features_table(table: Any, meta: FeaturesMeta, path: str | os.PathLike[str]) -> Path:
    """:func:`write_features` of a frame already converted to Arrow (a partitioned build
    converts a group of runs once and writes a zero-copy slice per run)."""
    import pyarrow.parquet as pq

    from bubblecast.telemetry.io import atomic_write

    schema_meta = dict(table.schema.metadata or {})
    schema_meta[METADATA_KEY] = json.dumps(meta.to_json(), sort_keys=True).encode()
    table = table.replace_schema_metadata(schema_meta)
    return atomic_write(path, lambda tmp: pq.write_table(table, tmp, compression="zstd",
                                                         write_page_checksum=True))


def read_features_table(path: str | os.PathLike[str], columns: list[str] | None = None) -> Any:
    """One features Parquet file (a single file or one part of a partitioned dataset) as an
    Arrow table, ``columns`` only when given, its page checksums verified (files written
    before they had checksums read as before); a :class:`BubblecastError` naming the file when
    it is corrupt. A part that holds no ``run_id`` (its ``run_id=<id>`` directory does) gets
    the column first, as a dictionary of that one id. The one way features files are read,
    whole or part by part."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from bubblecast.telemetry.fleet import run_id_of

    run = run_id_of(Path(path).parent)
    try:
        if run is not None and "run_id" not in pq.read_schema(path).names:
            want = None if columns is None else [c for c in columns if c != "run_id"]
            table = pq.read_table(path, columns=want, page_checksum_verification=True)
            if columns is not None and "run_id" not in columns:
                return table
            ids = pa.DictionaryArray.from_arrays(pa.array([0] * table.num_rows, pa.int32()),
                                                 pa.array([run], pa.string()))
            at = 0 if columns is None else columns.index("run_id")
            return table.add_column(at, "run_id", ids)
        return pq.read_table(path, columns=columns, page_checksum_verification=True)
    except (OSError, ValueError) as exc:
        raise BubblecastError(f"{path}: not a readable Parquet file ({exc})") from None


def features_part_schema(path: str | os.PathLike[str]) -> Any:
    """The Arrow schema of a features file or part as :func:`read_features_table` gives it
    (a part's ``run_id``, held by its directory, first), from its footer alone."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from bubblecast.telemetry.fleet import run_id_of

    try:
        schema = pq.read_schema(path)
    except (OSError, ValueError) as exc:
        raise BubblecastError(f"{path}: not a readable Parquet file ({exc})") from None
    if run_id_of(Path(path).parent) is not None and "run_id" not in schema.names:
        schema = schema.insert(0, pa.field("run_id", pa.dictionary(pa.int32(), pa.string())))
    return schema


def metadata_file(path: str | os.PathLike[str]) -> Path | None:
    """The metadata file of a features dataset directory: in its sidecar folder, or inside it
    for a dataset of the earlier layout; None when neither exists."""
    from bubblecast.telemetry.fleet import sidecar_dir

    for candidate in (sidecar_dir(path) / COMMON_METADATA, Path(path) / COMMON_METADATA):
        if candidate.is_file():
            return candidate
    return None


def read_features_meta(path: str | os.PathLike[str]) -> FeaturesMeta:
    """The metadata of a features file; refuses a missing tag or another version (one line)."""
    import pyarrow.parquet as pq

    p = Path(path)
    if p.is_dir():  # a dataset partitioned by run: its metadata file
        found = metadata_file(p)
        if found is None:
            from bubblecast.telemetry.fleet import sidecar_dir

            raise BubblecastError(f"{p}: not a bubblecast features dataset (no "
                                  f"{sidecar_dir(p) / COMMON_METADATA} beside it: copy or move "
                                  "a dataset with its sidecar folder, or build one with "
                                  "`bubblecast dataset`)")
        p = found
    elif not p.is_file():
        raise BubblecastError(f"{p}: no such features file")
    try:
        raw = (pq.read_schema(p).metadata or {}).get(METADATA_KEY)
    except Exception as exc:
        raise BubblecastError(f"{p}: not a readable Parquet file ({exc})") from None
    if raw is None:
        raise BubblecastError(f"{p}: not a bubblecast features file (no "
                              f"'{METADATA_KEY.decode()}' metadata; build one with "
                              "`bubblecast dataset`)")
    try:
        obj = json.loads(raw)
        version = obj.get("features_version")
    except (ValueError, AttributeError):
        raise BubblecastError(f"{p}: unreadable '{METADATA_KEY.decode()}' metadata") from None
    if version != FEATURES_VERSION:
        raise BubblecastError(f"{p}: features version {version!r}, this bubblecast reads "
                              f"{FEATURES_VERSION} (rebuild it with `bubblecast dataset`)")
    try:
        config = DatasetConfig.from_json(obj["config"])
    except (KeyError, TypeError, ValueError) as exc:
        raise BubblecastError(f"{p}: bad dataset config in its metadata ({exc})") from None
    return FeaturesMeta(config=config, fingerprint=str(obj.get("fingerprint", "")),
                        runs=list(obj.get("runs", [])), sources=list(obj.get("sources", [])),
                        version=version, run_info=dict(obj.get("run_info") or {}))


def read_features(path: str | os.PathLike[str]) -> tuple[pd.DataFrame, FeaturesMeta]:
    """Read a features file and its metadata (checked first, so a stale file fails fast)."""
    meta = read_features_meta(path)
    if Path(path).is_dir():
        import pyarrow as pa

        tables = [read_features_table(f) for f in partition_files(path, meta)]
        frame = pa.concat_tables(tables, promote_options="permissive").to_pandas()
    else:
        frame = read_features_table(path).to_pandas()
    for col in ("run_id", "scenario"):
        if col in frame.columns and not isinstance(frame[col].dtype, pd.CategoricalDtype):
            frame[col] = frame[col].astype(str).astype("category")
    frame.attrs["bubblecast_features"] = meta.to_json()
    return frame, meta


def partition_files(path: str | os.PathLike[str], meta: FeaturesMeta) -> list[Path]:
    """The parts of a features dataset in its runs' order (the order of an in-process build);
    runs that gave no rows have none."""
    from bubblecast.telemetry.fleet import fleet_runs

    dirs = fleet_runs(path)
    order = {run: i for i, run in enumerate(meta.runs)}
    runs = sorted(dirs, key=lambda r: (order.get(r, len(order)), r))
    return [f for r in runs for f in sorted(dirs[r].glob("*.parquet"))
            if not f.name.startswith(".")]


@contextmanager
def partition_tmp(out: str | os.PathLike[str]) -> Iterator[Path]:
    """A hidden temporary directory next to ``out`` for a partitioned build, removed unless
    :func:`finish_partitioned` renamed it onto ``out``."""
    import shutil
    import tempfile

    target = Path(out)
    if target.exists() and metadata_file(target) is None and (
            not target.is_dir() or any(target.iterdir())):
        raise BubblecastError(f"{target}: exists and is not a features dataset; refusing to "
                              "replace it")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _one_schema(parts: list[Path]) -> Any:
    """Give every part the schema of all of them (columns a part lacks as typed nulls, in one
    order), rewriting only the parts that differ; that schema."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from bubblecast.telemetry.io import atomic_write

    schemas = {p: pq.read_schema(p) for p in parts}
    unified = pa.unify_schemas([s.remove_metadata() for s in schemas.values()],
                               promote_options="permissive")
    for part, schema in schemas.items():
        if schema.remove_metadata().equals(unified):
            continue
        table = pq.read_table(part)
        columns = [table.column(f.name).cast(f.type) if f.name in table.column_names
                   else pa.nulls(table.num_rows, f.type) for f in unified]
        table = pa.Table.from_arrays(columns, schema=unified.with_metadata(schema.metadata))
        atomic_write(part, lambda tmp, t=table: pq.write_table(
            t, tmp, compression="lz4", write_page_checksum=True))
    return unified


def finish_partitioned(tmp: Path, out: str | os.PathLike[str], meta: FeaturesMeta) -> Path:
    """Give the parts in ``tmp`` one schema, write the dataset's metadata file into the
    sidecar folder beside ``out`` and put both in place (an earlier dataset there is replaced
    only once the new one is complete; its data directory first, then its sidecar folder)."""
    import shutil
    import tempfile

    import pyarrow.parquet as pq

    from bubblecast.telemetry.fleet import fleet_runs, sidecar_dir

    parts = [f for d in fleet_runs(tmp).values() for f in sorted(d.glob("*.parquet"))]
    if not parts:
        raise BubblecastError(f"{out}: no run gave any features rows")
    schema = _one_schema(parts)
    raw = json.dumps(meta.to_json(), sort_keys=True).encode()
    target, side = Path(out), sidecar_dir(out)
    side_tmp = Path(tempfile.mkdtemp(prefix=f".{side.name}.", dir=target.parent))
    try:
        pq.write_metadata(schema.with_metadata({METADATA_KEY: raw}), side_tmp / COMMON_METADATA)
        mode = 0o777 & ~_umask()
        os.chmod(tmp, mode)
        os.chmod(side_tmp, mode)
        old = [_move_aside(target), _move_aside(side)]
        os.rename(tmp, target)
        os.rename(side_tmp, side)
    finally:
        shutil.rmtree(side_tmp, ignore_errors=True)
    for gone in old:
        if gone is not None:
            shutil.rmtree(gone, ignore_errors=True)
    return target


def _move_aside(path: Path) -> Path | None:
    """Rename an existing ``path`` to a hidden name beside it (to be removed); None if absent."""
    if not path.exists():
        return None
    old = path.with_name(f".{path.name}.old.{os.getpid()}")
    os.rename(path, old)
    return old


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
