"""Reading a features dataset partitioned by run one part at a time.

``train``/``evaluate`` read such a dataset whole (:func:`read_parts`, what
:func:`bubblecast.dataset.fleet_build.read_features_skipping` returns); ``train --model seq``, whose
fit streams the parts itself, only scans it (:func:`scan_runs`: each part is read and checked,
its run, scenario and row count kept, the table dropped, so no more than one part is held) and
then reads the held-out runs alone (:func:`read_runs`). Either way an unreadable part fails
naming its run and file, or with ``skip_bad`` its run is left out and listed
(``{run_id, path, error}``), and the metadata's runs and run info cover the runs kept (its
fingerprint stays the whole dataset's).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from bubblecast.dataset.store import FeaturesMeta


def frame_of_tables(tables: list[Any], meta: FeaturesMeta) -> pd.DataFrame:
    """Arrow tables of a features dataset as one frame, as ``read_features`` gives it."""
    import pyarrow as pa

    frame = pa.concat_tables(tables, promote_options="permissive").to_pandas()
    for col in ("run_id", "scenario"):
        if col in frame.columns and not isinstance(frame[col].dtype, pd.CategoricalDtype):
            frame[col] = frame[col].astype(str).astype("category")
    frame.attrs["bubblecast_features"] = meta.to_json()
    return frame


def _checked(path: Any, meta: FeaturesMeta, skip_bad: bool, skipped: list[dict[str, Any]]
             ) -> Iterator[tuple[str, Path, Any]]:
    """``(run, part, table)`` of each readable part in the dataset's order; an unreadable one
    raises naming its run, or (``skip_bad``) is appended to ``skipped``."""
    from bubblecast.dataset.store import partition_files, read_features_table
    from bubblecast.errors import BubblecastError
    from bubblecast.telemetry.fleet import run_id_of

    for part in partition_files(path, meta):
        run = run_id_of(part.parent)
        try:
            table = read_features_table(part)
        except BubblecastError as exc:
            if not skip_bad:
                raise BubblecastError(f"run '{run}': {exc}") from None
            skipped.append({"run_id": run, "path": str(part), "error": str(exc)})
            continue
        yield run, part, table


def _kept(meta: FeaturesMeta, skipped: list[dict[str, Any]], path: Any, read: int
          ) -> FeaturesMeta:
    from bubblecast.errors import BubblecastError

    if not read:
        raise BubblecastError(f"{path}: no run could be read ({len(skipped)} skipped)")
    gone = {s["run_id"] for s in skipped}
    meta.runs = [r for r in meta.runs if r not in gone]
    meta.run_info = {k: v for k, v in meta.run_info.items() if k not in gone}
    return meta


def read_parts(path: Any, skip_bad: bool = False) -> tuple[
        pd.DataFrame, FeaturesMeta, list[dict[str, Any]]]:
    """The whole dataset as one frame, its metadata (cut to the runs read) and the skipped."""
    from bubblecast.dataset.store import read_features_meta

    meta = read_features_meta(path)
    skipped: list[dict[str, Any]] = []
    tables = [table for _, _, table in _checked(path, meta, skip_bad, skipped)]
    meta = _kept(meta, skipped, path, len(tables))
    return frame_of_tables(tables, meta), meta, skipped


@dataclass
class RunScan:
    """One row per run read (``run_id``, ``scenario``, ``rows``), in the dataset's order, with
    each run's parts, the metadata cut to those runs and the skipped runs."""

    path: Any
    runs: pd.DataFrame
    meta: FeaturesMeta
    skipped: list[dict[str, Any]] = field(default_factory=list)
    parts: dict[str, list[Path]] = field(default_factory=dict)


def scan_runs(path: Any, skip_bad: bool = False) -> RunScan:
    """Check every part and note its run, scenario and rows; hold one part at a time."""
    from bubblecast.dataset.store import read_features_meta

    meta = read_features_meta(path)
    skipped: list[dict[str, Any]] = []
    rows: dict[str, int] = {}
    scenario: dict[str, str] = {}
    parts: dict[str, list[Path]] = {}
    for run, part, table in _checked(path, meta, skip_bad, skipped):
        rows[run] = rows.get(run, 0) + table.num_rows
        parts.setdefault(run, []).append(part)
        if run not in scenario and "scenario" in table.column_names and table.num_rows:
            scenario[run] = str(table.column("scenario")[0].as_py())
    meta = _kept(meta, skipped, path, len(parts))
    frame = pd.DataFrame({"run_id": list(rows), "rows": list(rows.values())})
    if len(scenario) == len(rows):
        frame["scenario"] = [scenario[r] for r in rows]
    return RunScan(path, frame, meta, skipped, parts)


def read_runs(scan: RunScan, runs: list[str]) -> pd.DataFrame:
    """The rows of ``runs`` only, as one frame in the dataset's order."""
    from bubblecast.dataset.store import read_features_table

    wanted = set(runs)
    tables = [read_features_table(p) for run, ps in scan.parts.items() if run in wanted for p in ps]
    return frame_of_tables(tables, scan.meta)
