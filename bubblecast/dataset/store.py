"""The features file: Parquet with a version tag and the build config in its metadata.

A file built by another features version is refused with one line, because its columns would
mean something else to the models trained on this version.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bubblecast.dataset.config import FEATURES_VERSION, DatasetConfig
from bubblecast.errors import BubblecastError

METADATA_KEY = b"bubblecast.features"


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
    cols = [c for c in frame.columns if c in ("run_id", "replica", "stage", "step", "y", "work",
                                              "layers") or c.startswith(("y_h", "s_h"))]
    h = hashlib.sha256(json.dumps(config.to_json(), sort_keys=True).encode())
    h.update(str(FEATURES_VERSION).encode())
    hashed = pd.util.hash_pandas_object(frame[cols], index=False).to_numpy()
    h.update(np.ascontiguousarray(hashed).tobytes())
    return h.hexdigest()[:16]


def write_features(frame: pd.DataFrame, meta: FeaturesMeta, path: str | os.PathLike[str]) -> Path:
    """Write the frame atomically as one Parquet file with ``meta`` in its key-value store."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from bubblecast.telemetry.io import atomic_write

    table = pa.Table.from_pandas(frame, preserve_index=False)
    schema_meta = dict(table.schema.metadata or {})
    schema_meta[METADATA_KEY] = json.dumps(meta.to_json(), sort_keys=True).encode()
    table = table.replace_schema_metadata(schema_meta)
    return atomic_write(path, lambda tmp: pq.write_table(table, tmp, compression="zstd"))


def read_features_meta(path: str | os.PathLike[str]) -> FeaturesMeta:
    """The metadata of a features file; refuses a missing tag or another version (one line)."""
    import pyarrow.parquet as pq

    p = Path(path)
    if not p.is_file():
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
    import pyarrow.parquet as pq

    meta = read_features_meta(path)
    frame = pq.read_table(path).to_pandas()
    for col in ("run_id", "scenario"):
        if col in frame.columns and not isinstance(frame[col].dtype, pd.CategoricalDtype):
            frame[col] = frame[col].astype(str).astype("category")
    frame.attrs["bubblecast_features"] = meta.to_json()
    return frame, meta
