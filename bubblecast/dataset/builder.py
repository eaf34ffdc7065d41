"""Events -> features frame in one call: step series, then features and targets."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd

from bubblecast.dataset.config import DatasetConfig
from bubblecast.dataset.features import build_features
from bubblecast.dataset.series import step_series
from bubblecast.dataset.store import FeaturesMeta, fingerprint
from bubblecast.telemetry.events import Events


def _op_totals(frame: pd.DataFrame) -> pd.Series:
    """Seconds per (run_id, op) over all rows (the compute ops' sums are those over the compute
    rows alone): grouped by one int32 key of the categorical codes, so neither the events nor
    a per-column group index are copied (pandas' compensated sum, as a groupby by columns)."""
    import numpy as np

    run, op = frame["run_id"], frame["op"]
    if not (isinstance(run.dtype, pd.CategoricalDtype) and isinstance(op.dtype,
                                                                       pd.CategoricalDtype)):
        return frame.groupby(["run_id", "op"], observed=True)["duration_s"].sum()
    n_ops = len(op.cat.categories)
    key = run.cat.codes.to_numpy().astype(np.int32)
    key *= n_ops
    key += op.cat.codes.to_numpy()
    sums = pd.Series(frame["duration_s"].to_numpy()).groupby(key).sum()
    codes = sums.index.to_numpy()
    runs, ops = run.cat.categories, op.cat.categories
    index = pd.MultiIndex.from_arrays([[str(runs[c // n_ops]) for c in codes],
                                       [str(ops[c % n_ops]) for c in codes]])
    return pd.Series(sums.to_numpy(), index=index)


def run_info(events: Events) -> dict[str, dict[str, Any]]:
    """Per run, what replaying forecasts through the timing engine needs (see FeaturesMeta)."""
    totals = _op_totals(events.frame)
    out: dict[str, dict[str, Any]] = {}
    for run_id, meta in events.runs.items():
        per_op = {op: float(totals.get((run_id, op), 0.0)) for op in ("F", "B", "W")}
        total = sum(per_op.values())
        sim = meta.extra.get("sim") if isinstance(meta.extra.get("sim"), dict) else {}
        out[run_id] = {
            "schedule": meta.schedule, "stages": meta.stages,
            "microbatches": meta.microbatches, "chunks": meta.chunks,
            "replicas": meta.replicas, "comm_s": float(sim.get("comm_ms", 0.0)) / 1000.0,
            "op_share": {k: v / total for k, v in per_op.items()} if total > 0 else {},
        }
    return out


def build_dataset(events: Events, config: DatasetConfig | None = None,
                  progress: Callable[[str], None] | None = None,
                  sources: list[str] | None = None,
                  metrics: pd.DataFrame | None = None) -> tuple[pd.DataFrame, FeaturesMeta]:
    """The features frame of ``events`` and its metadata (config, fingerprint, runs).

    ``metrics``: the runs' ``device_metrics`` rows, read when ``config.covariates`` is
    ``auto`` (covariate features, :mod:`bubblecast.dataset.covariates`).

    Runs are independent, so this can run per run (or per partition of runs) and the frames
    concatenated; the result is the same.
    """
    config = config or DatasetConfig()
    note = progress or (lambda _msg: None)
    note("step series")
    info = run_info(events)  # before the features exist: its temporaries do not add to them
    series = step_series(events)
    frame = build_features(series, config, progress=note)
    if config.covariates != "none":
        from bubblecast.dataset.covariates import add_covariates

        note("covariates")
        frame = add_covariates(frame, events, metrics, config)
    meta = FeaturesMeta(config=config, fingerprint=fingerprint(frame, config),
                        runs=[str(r) for r in frame["run_id"].cat.categories],
                        sources=list(sources or []), run_info=info)
    frame.attrs["bubblecast_features"] = meta.to_json()
    return frame, meta


def load_for_dataset(path: Any, format: str = "auto") -> Events:
    """A ``dataset`` input's events: bubblecast events read with only the columns the dataset
    uses (:data:`~bubblecast.dataset.series.EVENT_COLUMNS`; strings as categoricals), other
    formats through their importer."""
    from bubblecast.dataset.series import EVENT_COLUMNS
    from bubblecast.telemetry.importers import detect_format, load_events
    from bubblecast.telemetry.io import read_events

    fmt = detect_format(path) if format == "auto" else format
    if fmt == "bubblecast":
        return read_events(path, columns=list(EVENT_COLUMNS))
    return load_events(path, fmt)


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


def build_unit(units: list[Any], format: str, config: DatasetConfig, tmp: str,
               skip_bad: bool = False) -> dict[str, Any]:
    """A group of units of a partitioned build (fleet runs, or a file of runs), on any worker:
    read them, build their features at once and write one part per run under ``tmp``; return
    what the reduce needs (rows, row hashes, run ids and run info), never the rows."""
    from pathlib import Path

    import numpy as np
    import pyarrow as pa

    from bubblecast.dataset.store import fingerprint_of, row_hashes, write_features_table
    from bubblecast.telemetry.fleet import PART_NAME, run_dir_name
    from bubblecast.telemetry.importers import timing_of

    loaded, skipped = [], []
    for unit in units:
        events, metrics, bad = _load_unit(unit, format, config, skip_bad)
        skipped += bad
        if events is not None:
            loaded.append((events, metrics))
    if not loaded:
        return {"skipped": skipped}
    if len(loaded) == 1 or all(m is None for _, m in loaded):
        events = loaded[0][0] if len(loaded) == 1 else Events.concat([e for e, _ in loaded])
        frame, meta = build_dataset(events, config, metrics=loaded[0][1])
    else:  # covariate metrics are per unit: build each, then join the frames
        built = [build_dataset(e, config, metrics=m) for e, m in loaded]
        frame = pd.concat([f for f, _ in built], ignore_index=True)
        events = Events.concat([e for e, _ in loaded])
        meta = FeaturesMeta(config=config, fingerprint="", runs=[r for _, m in built
                                                                 for r in m.runs],
                            run_info={k: v for _, m in built for k, v in m.run_info.items()})
    hashes = row_hashes(frame)
    frame.attrs = {}
    table = pa.Table.from_pandas(frame, preserve_index=False)  # once for the group
    codes = frame["run_id"].astype(str).to_numpy()
    order = np.argsort(codes, kind="stable")  # rows of a run, in frame order
    edges = np.flatnonzero(codes[order][1:] != codes[order][:-1]) + 1
    for rows in np.split(order, edges) if len(order) else []:
        run_id = str(codes[rows[0]])
        contiguous = rows[-1] - rows[0] + 1 == len(rows)
        part = table.slice(rows[0], len(rows)) if contiguous else table.take(rows)
        part_meta = FeaturesMeta(config=config, fingerprint=fingerprint_of([hashes[rows]],
                                 config), runs=[run_id],
                                 run_info={run_id: meta.run_info.get(run_id, {})})
        write_features_table(part, part_meta, Path(tmp) / run_dir_name(run_id) / PART_NAME)
    return {"runs": meta.runs, "rows": len(frame), "hashes": hashes,
            "run_info": meta.run_info, "timing": timing_of(events), "skipped": skipped,
            "features": sum(c.startswith(("f_", "x")) for c in frame.columns)}


def groups_of(units: list[Any], workers: int, most: int = 16) -> list[list[Any]]:
    """Consecutive units in groups: about four per worker, at most ``most`` units each (so a
    task's memory does not grow with the fleet); order kept."""
    size = max(1, min(most, -(-len(units) // (4 * max(1, workers)))))
    return [units[i:i + size] for i in range(0, len(units), size)]


def build_partitioned(paths: list[Any], out: Any, config: DatasetConfig, executor: Any,
                      format: str = "auto", skip_bad: bool = False,
                      sources: list[str] | None = None) -> dict[str, Any]:
    """Build the features of ``paths`` unit by unit with ``executor`` (this process or Dask)
    into ``out``, a dataset partitioned by run; the ``dataset --json`` summary.

    Rows, fingerprint and metadata equal those of :func:`build_dataset` on all the events at
    once; only per-unit summaries come back to this process. ``out`` appears whole or not at
    all (parts go to a hidden temporary directory renamed at the end)."""
    from pathlib import Path

    from bubblecast.dataset.store import fingerprint_of, finish_partitioned, partition_tmp
    from bubblecast.errors import BubblecastError
    from bubblecast.telemetry.fleet import units_of

    remote = executor.client is not None  # workers may run elsewhere: absolute paths
    units = units_of([Path(p).absolute() if remote else p for p in paths])
    with partition_tmp(out) as tmp:
        results = executor.map(build_unit, groups_of(units, executor.workers), format, config,
                               str(tmp.absolute()), skip_bad, label="features")
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
