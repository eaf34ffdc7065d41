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
#: In a features dataset partitioned by run (``DIR/run_id=<id>/part-00000.parquet``), the file
#: holding the schema and the whole dataset's metadata (Parquet's dataset convention).
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
    it is corrupt. The one way features files are read, whole or part by part."""
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path, columns=columns, page_checksum_verification=True)
    except (OSError, ValueError) as exc:
        raise BubblecastError(f"{path}: not a readable Parquet file ({exc})") from None


def read_features_meta(path: str | os.PathLike[str]) -> FeaturesMeta:
    """The metadata of a features file; refuses a missing tag or another version (one line)."""
    import pyarrow.parquet as pq

    p = Path(path)
    if p.is_dir():  # a dataset partitioned by run: its metadata file
        if not (p / COMMON_METADATA).is_file():
            raise BubblecastError(f"{p}: not a bubblecast features dataset (no "
                                  f"{COMMON_METADATA}; build one with `bubblecast dataset`)")
        p = p / COMMON_METADATA
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
    if target.exists() and not (target / COMMON_METADATA).is_file() and (
            not target.is_dir() or any(target.iterdir())):
        raise BubblecastError(f"{target}: exists and is not a features dataset; refusing to "
                              "replace it")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def finish_partitioned(tmp: Path, out: str | os.PathLike[str], meta: FeaturesMeta) -> Path:
    """Write the dataset's metadata file into ``tmp`` and put ``tmp`` in place of ``out``
    (an earlier dataset there is replaced only once the new one is complete)."""
    import shutil

    import pyarrow.parquet as pq

    from bubblecast.telemetry.fleet import fleet_runs

    parts = [f for d in fleet_runs(tmp).values() for f in sorted(d.glob("*.parquet"))]
    if not parts:
        raise BubblecastError(f"{out}: no run gave any features rows")
    schema = pq.read_schema(parts[0])
    raw = json.dumps(meta.to_json(), sort_keys=True).encode()
    schema = schema.with_metadata({**(schema.metadata or {}), METADATA_KEY: raw})
    pq.write_metadata(schema, tmp / COMMON_METADATA)
    target = Path(out)
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old.{os.getpid()}")
        os.rename(target, old)
    os.rename(tmp, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return target
