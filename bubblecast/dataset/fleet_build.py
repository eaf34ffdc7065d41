"""A features dataset built unit by unit (on Dask with ``--cluster``), partitioned by run.

The driver splits the inputs into groups of runs (:func:`groups_of`: a few groups per worker,
at most :data:`MOST_RUNS` runs each, so a task's memory does not grow with the fleet) and maps
:func:`build_unit` over them; a task reads its group's parts with one Arrow dataset scan
(:func:`bubblecast.telemetry.fleet_read.read_group`), builds the group's features with the
same vectorised code as the in-process path (:func:`build_dataset`), and writes one part per
run. Only row counts, row hashes and run info come back; :func:`build_partitioned` reduces them
into the dataset's metadata. Rows, fingerprint and metadata equal the in-process build's.

Per-run fixed costs are paid per group instead: one scan and one validation per group rather
than reading, validating and concatenating each run apart, and each small part is written with
dictionary encoding only for the string columns, as events files are, to keep the Parquet
writer's per-column set-up small (``benchmarks/bench_fleet.py`` times this path).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from bubblecast.dataset.builder import build_dataset, load_for_dataset
from bubblecast.dataset.config import DatasetConfig
from bubblecast.dataset.store import FeaturesMeta
from bubblecast.telemetry.events import Events

#: Most runs in one task (its memory is about that of the in-process build of so many runs).
MOST_RUNS = 64
#: Groups per worker: enough that the last ones balance the load, few enough that per-task
#: costs (a features build's fixed work, a scheduler round trip) stay small.
GROUPS_PER_WORKER = 6


def _load_unit(unit: Any, format: str, config: DatasetConfig, skip_bad: bool
               ) -> tuple[Events | None, Any, list[dict[str, Any]]]:
    """A unit's events and covariate metrics; an unreadable one raises naming the run and
    file, or (``skip_bad``) comes back as a skipped entry."""
    from bubblecast.errors import BubblecastError
    from bubblecast.telemetry.importers import require_per_op

    try:
        events = load_for_dataset(unit.path, format)
        require_per_op(events, "dataset", unit.path)
    except BubblecastError as exc:
        where = f"run '{unit.run_id}': " if unit.run_id is not None else ""
        if not skip_bad:
            raise BubblecastError(f"{where}{exc}") from None
        return None, None, [{"run_id": unit.run_id, "path": str(unit.path), "error": str(exc)}]
    metrics = None
    if config.covariates != "none":
        from bubblecast.telemetry.metrics import read_metrics

        metrics = read_metrics(unit.path)
    return events, metrics, []


def _read_at_once(units: list[Any], format: str, config: DatasetConfig) -> Events | None:
    """The group's events in one scan when they are plain fleet runs without covariates;
    None to read unit by unit (errors then name the run and file)."""
    from bubblecast.errors import BubblecastError
    from bubblecast.telemetry.fleet_read import read_group
    from bubblecast.telemetry.importers import require_per_op

    if config.covariates != "none" or format not in ("auto", "bubblecast") or any(
            u.run_id is None for u in units):
        return None
    from bubblecast.dataset.series import EVENT_COLUMNS

    events = read_group([u.path for u in units], list(EVENT_COLUMNS))
    if events is None:
        return None
    try:
        require_per_op(events, "dataset", units[0].path)
    except BubblecastError:
        return None
    return events


def _features(events: Events, config: DatasetConfig, metrics: Any = None,
              n_jobs: int | None = 1) -> tuple[pd.DataFrame, FeaturesMeta]:
    """:func:`build_dataset` of a group, less the fingerprint when there are no covariates
    (the reduce makes the dataset's from the row hashes, computed once per group)."""
    if config.covariates != "none":
        return build_dataset(events, config, metrics=metrics, n_jobs=n_jobs)
    from bubblecast.dataset.builder import run_info
    from bubblecast.dataset.features import build_features
    from bubblecast.dataset.series import step_series

    info = run_info(events)
    frame = build_features(step_series(events), config, n_jobs=n_jobs)
    return frame, FeaturesMeta(config=config, fingerprint="", run_info=info,
                               runs=[str(r) for r in frame["run_id"].cat.categories])


def _group_features(units: list[Any], format: str, config: DatasetConfig, skip_bad: bool,
                    n_jobs: int | None = 1) -> tuple[pd.DataFrame | None, FeaturesMeta | None,
                                                     Events | None, list[dict[str, Any]]]:
    """The group's features frame, metadata and events, and the runs skipped."""
    events = _read_at_once(units, format, config)
    if events is not None:
        frame, meta = _features(events, config, n_jobs=n_jobs)
        return frame, meta, events, []
    loaded, skipped = [], []
    for unit in units:
        one, metrics, bad = _load_unit(unit, format, config, skip_bad)
        skipped += bad
        if one is not None:
            loaded.append((one, metrics))
    if not loaded:
        return None, None, None, skipped
    if len(loaded) == 1 or all(m is None for _, m in loaded):
        events = loaded[0][0] if len(loaded) == 1 else Events.concat([e for e, _ in loaded])
        frame, meta = _features(events, config, loaded[0][1], n_jobs)
        return frame, meta, events, skipped
    built = [_features(e, config, m, n_jobs) for e, m in loaded]  # metrics are per unit
    frame = pd.concat([f for f, _ in built], ignore_index=True)
    meta = FeaturesMeta(config=config, fingerprint="", runs=[r for _, m in built
                                                             for r in m.runs],
                        run_info={k: v for _, m in built for k, v in m.run_info.items()})
    return frame, meta, Events.concat([e for e, _ in loaded]), skipped


def part_columns(table: Any) -> Any:
    """A features table as its parts hold it: no ``run_id`` (the ``run_id=<id>`` partition
    key stores it once, so every reader opens the dataset) nor pandas' metadata listing it,
    dictionary columns with ``int32`` indices (one type in every part, whatever a group's
    category count)."""
    import pyarrow as pa

    dict32 = pa.dictionary(pa.int32(), pa.string())
    table = table.drop_columns(["run_id"])  # and pandas' column list that names it (dask)
    table = table.replace_schema_metadata({k: v for k, v in (table.schema.metadata or {}).items()
                                           if k != b"pandas"})
    for i, f in enumerate(table.schema):
        if pa.types.is_dictionary(f.type) and f.type != dict32:
            table = table.set_column(i, pa.field(f.name, dict32, f.nullable),
                                     table.column(i).cast(dict32))
    return table


def _write_parts(frame: pd.DataFrame, meta: FeaturesMeta, hashes: Any, config: DatasetConfig,
                 tmp: str) -> None:
    """One part per run under ``tmp`` (``run_id=<id>/part-00000.parquet``, in the layout of
    :func:`part_columns`), the group converted to Arrow once and sliced; dictionary encoding
    only for the string columns (the writer's per-column dictionary set-up was most of a small
    part's write time)."""
    import json

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from bubblecast.dataset.store import METADATA_KEY, fingerprint_of
    from bubblecast.telemetry.fleet import PART_NAME, run_dir_name
    from bubblecast.telemetry.io import atomic_write

    table = part_columns(pa.Table.from_pandas(frame, preserve_index=False))
    strings = [f.name for f in table.schema if pa.types.is_dictionary(f.type)
               or pa.types.is_string(f.type)]
    run_id = frame["run_id"].cat
    codes = run_id.codes.to_numpy()
    order = np.argsort(codes, kind="stable")  # rows of a run, in frame order
    edges = np.flatnonzero(codes[order][1:] != codes[order][:-1]) + 1
    for rows in np.split(order, edges) if len(order) else []:
        run = str(run_id.categories[codes[rows[0]]])
        contiguous = rows[-1] - rows[0] + 1 == len(rows)
        part = table.slice(rows[0], len(rows)) if contiguous else table.take(rows)
        part_meta = FeaturesMeta(config=config, fingerprint=fingerprint_of([hashes[rows]],
                                 config), runs=[run], run_info={run: meta.run_info.get(run, {})})
        part = part.replace_schema_metadata({**(part.schema.metadata or {}), METADATA_KEY:
                                             json.dumps(part_meta.to_json(),
                                                        sort_keys=True).encode()})
        atomic_write(Path(tmp) / run_dir_name(run) / PART_NAME, lambda f, t=part: pq.write_table(
            t, f, compression="lz4", use_dictionary=strings, write_page_checksum=True))


def build_unit(units: list[Any], format: str, config: DatasetConfig, tmp: str,
               skip_bad: bool = False, n_jobs: int | None = 1) -> dict[str, Any]:
    """A group of units of a partitioned build (fleet runs, or a file of runs), on any worker:
    read them, build their features at once and write one part per run under ``tmp``; return
    what the reduce needs (rows, row hashes, run ids and run info), never the rows."""
    from bubblecast.dataset.store import row_hashes
    from bubblecast.telemetry.importers import timing_of

    frame, meta, events, skipped = _group_features(units, format, config, skip_bad, n_jobs)
    if frame is None or meta is None or events is None:
        return {"skipped": skipped}
    hashes = row_hashes(frame)
    frame.attrs = {}
    _write_parts(frame, meta, hashes, config, tmp)
    return {"runs": meta.runs, "rows": len(frame), "hashes": hashes,
            "run_info": meta.run_info, "timing": timing_of(events), "skipped": skipped,
            "features": sum(c.startswith(("f_", "x")) for c in frame.columns)}


def groups_of(units: list[Any], workers: int, most: int = MOST_RUNS) -> list[list[Any]]:
    """Consecutive units in groups: about :data:`GROUPS_PER_WORKER` per worker, at most
    ``most`` units each (so a task's memory does not grow with the fleet); order kept."""
    size = max(1, min(most, -(-len(units) // (GROUPS_PER_WORKER * max(1, workers)))))
    return [units[i:i + size] for i in range(0, len(units), size)]


def build_partitioned(paths: list[Any], out: Any, config: DatasetConfig, executor: Any,
                      format: str = "auto", skip_bad: bool = False,
                      sources: list[str] | None = None, n_jobs: int | None = None
                      ) -> dict[str, Any]:
    """Build the features of ``paths`` unit by unit with ``executor`` (this process or Dask)
    into ``out``, a dataset partitioned by run; the ``dataset --json`` summary.

    Rows, fingerprint and metadata equal those of :func:`build_dataset` on all the events at
    once; only per-unit summaries come back to this process. ``out`` appears whole or not at
    all (parts go to a hidden temporary directory renamed at the end)."""
    from bubblecast.dataset.store import fingerprint_of, finish_partitioned, partition_tmp
    from bubblecast.errors import BubblecastError
    from bubblecast.telemetry.fleet import units_of

    remote = executor.client is not None  # workers may run elsewhere: absolute paths
    units = units_of([Path(p).absolute() if remote else p for p in paths])
    with partition_tmp(out) as tmp:
        # threads in this process; one each on Dask's workers (a process per core already)
        results = executor.map(build_unit, groups_of(units, executor.workers), format, config,
                               str(tmp.absolute()), skip_bad, n_jobs if not remote else 1,
                               label="features")
        done = [r for r in results if "runs" in r]
        skipped = [s for r in results for s in r["skipped"]]
        runs = [run for r in done for run in r["runs"]]
        if len(set(runs)) != len(runs):
            raise BubblecastError("the inputs share run ids; each run must come from one file")
        if not done:
            raise BubblecastError(f"no run could be read ({len(skipped)} skipped)")
        run_info = {k: v for r in done for k, v in r["run_info"].items()}
        meta = FeaturesMeta(config=config, fingerprint=fingerprint_of(
            [r["hashes"] for r in done], config), runs=runs, sources=list(sources or []),
            run_info=run_info)
        finish_partitioned(tmp, out, meta)
    timings = {r["timing"] for r in done}
    return {"out": str(out), "rows": sum(r["rows"] for r in done), "runs": len(runs),
            "horizons": list(config.horizons), "features": done[0]["features"],
            "fingerprint": meta.fingerprint,
            "timing": timings.pop() if len(timings) == 1 else "mixed",
            **({"skipped_runs": skipped} if skip_bad else {})}


def read_features_skipping(path: Any, skip_bad: bool = False) -> tuple[
        pd.DataFrame, FeaturesMeta, list[dict[str, Any]]]:
    """:func:`~bubblecast.dataset.store.read_features` for ``train``/``evaluate
    --skip-bad-runs``: of a dataset partitioned by run, an unreadable part fails naming its run
    and file, or (``skip_bad``) is left out and listed (``{run_id, path, error}``); the
    metadata's runs and run info then cover the runs read (its fingerprint stays the whole
    dataset's). A single features file is read as it is (:mod:`.partread`)."""
    from bubblecast.dataset.partread import read_parts
    from bubblecast.dataset.store import read_features

    if not Path(path).is_dir():
        frame, meta = read_features(path)
        return frame, meta, []
    return read_parts(path, skip_bad)


__all__ = ["GROUPS_PER_WORKER", "MOST_RUNS", "build_partitioned", "build_unit", "groups_of",
           "part_columns", "read_features_skipping"]
