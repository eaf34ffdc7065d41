"""Covariate features from the ``device_metrics`` side table and the run calendar.

Leakage-free like mlforecast's exogenous features: a row at origin step ``t`` (for the target
at ``t + h``) reads

- **observed** metrics (temperature, clocks, power, load...) at steps ``<= t`` only: the
  last sample at or before ``t`` (``f_cov_{m}``; metrics are sampled every K steps), its change
  over the two shortest windows (``f_cov_{m}_d{w}``) and its gap to the median of the run's
  ranks at ``t`` (``f_cov_{m}_peer``: a rank hotter than its peers);
- **known-future** metrics (:func:`bubblecast.telemetry.metrics.is_known_future`: tokens the
  data loader announced) at steps ``<= t + h``: ``x{h}_cov_{m}_ratio``, the value at ``t + h``
  over the value at ``t``;
- the **calendar** in run metadata (``calendar: {"checkpoint_every": N, "eval_every": M}``,
  optional ``{kind}_first``, default ``N - 1``: step ``s`` is scheduled when ``s >= first`` and
  ``(s - first) % N == 0``): ``x{h}_cal_{kind}_due`` (step ``t + h`` is scheduled) and
  ``x{h}_cal_{kind}_within`` (some step in ``(t, t + h]`` is).

A metric's rows belong to a series through the events' (run, replica, stage) -> rank map.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from bubblecast.dataset.config import DatasetConfig

#: Values of ``--covariates``.
MODES: tuple[str, ...] = ("none", "auto")
_PREFIXES = ("f_cov_", "f_cal_")


def is_covariate(name: str) -> bool:
    """Whether a features-frame column is a covariate feature (this module's)."""
    return name.startswith(_PREFIXES) or bool(re.match(r"x\d+_(cov|cal)_", name))


def covariate_columns(columns: list[str] | pd.Index) -> list[str]:
    return [c for c in columns if is_covariate(str(c))]


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "metric"


def rank_map(events_frame: pd.DataFrame) -> pd.DataFrame:
    """(run_id, replica, stage) -> rank, from the events rows."""
    cols = ["run_id", "replica", "stage", "rank"]
    out = events_frame[cols].drop_duplicates(["run_id", "replica", "stage"])
    return out.assign(run_id=out["run_id"].astype(str)).reset_index(drop=True)


def _asof(keys: pd.DataFrame, table: pd.DataFrame) -> np.ndarray:
    """Per key row (run_id, rank, at): the value of the last ``table`` row with step <= at."""
    out = np.full(len(keys), np.nan)
    if table.empty:
        return out
    left = keys.assign(_i=np.arange(len(keys))).sort_values("at", kind="stable")
    right = table.sort_values("step", kind="stable")
    merged = pd.merge_asof(left, right, left_on="at", right_on="step", by=["run_id", "rank"],
                           direction="backward")
    out[merged["_i"].to_numpy()] = merged["value"].to_numpy(dtype=np.float64)
    return out


def _calendar(meta: Any) -> dict[str, tuple[int, int]]:
    """``{kind: (every, first)}`` from a run's ``calendar`` metadata (bad entries skipped)."""
    raw = getattr(meta, "extra", {}).get("calendar") if meta is not None else None
    out: dict[str, tuple[int, int]] = {}
    if not isinstance(raw, dict):
        return out
    for key, every in raw.items():
        if not key.endswith("_every") or not isinstance(every, int) or every < 1:
            continue
        kind = _slug(key[:-6])
        first = raw.get(f"{key[:-6]}_first", every - 1)
        out[kind] = (every, int(first) if isinstance(first, int) else every - 1)
    return out


def _scheduled_upto(step: np.ndarray, every: int, first: int) -> np.ndarray:
    """Scheduled steps in ``[0, step]``."""
    return np.where(step >= first, (step - first) // every + 1, 0)


def _metric_columns(name: str, ahead: bool, asof: Callable[[int], np.ndarray],
                    peer: Callable[[np.ndarray], np.ndarray],
                    config: DatasetConfig) -> dict[str, np.ndarray]:
    """The feature definitions of one device metric (module docstring), whoever reads it:
    ``asof(k)`` is each row's last sample at or before its origin step plus ``k`` (NaN:
    none), ``peer(now)`` each row's median of ``now`` over its run's rows at the same step."""
    now = asof(0)
    out: dict[str, np.ndarray] = {}
    if ahead:
        with np.errstate(divide="ignore", invalid="ignore"):
            for h in config.horizons:
                out[f"x{h}_cov_{name}_ratio"] = asof(h) / now
        return out
    out[f"f_cov_{name}"] = now
    for w in config.windows[:2]:
        out[f"f_cov_{name}_d{w}"] = now - asof(-w)
    out[f"f_cov_{name}_peer"] = now - peer(now)
    return out


def _calendar_columns(step: np.ndarray, run_of: np.ndarray, runs: dict[str, Any],
                      config: DatasetConfig) -> dict[str, np.ndarray]:
    """The calendar features (module docstring) of rows at ``step`` of runs ``run_of``."""
    out: dict[str, np.ndarray] = {}
    kinds = sorted({k for meta in runs.values() for k in _calendar(meta)})
    for kind in kinds:
        every = np.zeros(len(step), dtype=np.int64)
        first = np.zeros(len(step), dtype=np.int64)
        for run_id, meta in runs.items():
            cal = _calendar(meta).get(kind)
            if cal is not None:
                mask = run_of == run_id
                every[mask], first[mask] = cal
        has = every > 0
        safe = np.where(has, every, 1)
        for h in config.horizons:
            target = step + h
            due = has & (target >= first) & ((target - first) % safe == 0)
            within = _scheduled_upto(target, safe, first) - _scheduled_upto(step, safe, first)
            out[f"x{h}_cal_{kind}_due"] = np.where(has, due, np.nan)
            out[f"x{h}_cal_{kind}_within"] = np.where(has, within > 0, np.nan)
    return out


def covariate_features(frame: pd.DataFrame, metrics: pd.DataFrame | None, ranks: pd.DataFrame,
                       runs: dict[str, Any], config: DatasetConfig) -> dict[str, np.ndarray]:
    """Covariate columns for the rows of ``frame`` (keys run_id, replica, stage, step)."""
    from bubblecast.telemetry.metrics import is_known_future

    keys = frame[["run_id", "replica", "stage", "step"]].assign(
        run_id=frame["run_id"].astype(str)).merge(ranks, how="left",
                                                  on=["run_id", "replica", "stage"])
    base = keys[["run_id", "rank"]].assign(rank=keys["rank"].fillna(-1).astype(np.int64))
    step = keys["step"].to_numpy(dtype=np.int64)
    run_of = keys["run_id"].to_numpy()
    out: dict[str, np.ndarray] = {}

    def peer(now: np.ndarray) -> np.ndarray:
        return pd.Series(now).groupby([run_of, step]).transform("median").to_numpy()

    if metrics is not None and not metrics.empty:
        for metric, part in _grouped(metrics).groupby("metric", sort=True):
            part = part[["run_id", "rank", "step", "value"]]

            def asof(k: int, part: pd.DataFrame = part) -> np.ndarray:
                return _asof(base.assign(at=step + k), part)

            out.update(_metric_columns(_slug(str(metric)), is_known_future(str(metric)), asof,
                                       peer, config))
    out.update(_calendar_columns(step, run_of, runs, config))
    return {k: np.asarray(v, dtype=np.float32) for k, v in out.items()}


def _grouped(metrics: pd.DataFrame) -> pd.DataFrame:
    """Metric rows, one per (run_id, rank, metric, step): the mean of its samples."""
    table = metrics.assign(run_id=metrics["run_id"].astype(str),
                           rank=metrics["rank"].astype(np.int64))
    return table.groupby(["run_id", "rank", "metric", "step"], as_index=False)["value"].mean()


def _with_columns(frame: pd.DataFrame, cols: dict[str, Any]) -> pd.DataFrame:
    """``frame`` with ``cols`` appended in one concat, its ``attrs`` kept."""
    attrs = frame.attrs
    out = pd.concat([frame, pd.DataFrame(cols, index=frame.index)], axis=1)
    out.attrs = attrs
    return out


def add_covariates(frame: pd.DataFrame, events: Any, metrics: pd.DataFrame | None,
                   config: DatasetConfig) -> pd.DataFrame:
    """``frame`` with its covariate columns appended (none when ``config.covariates`` is
    ``none`` or nothing is present)."""
    if config.covariates == "none" or frame.empty:
        return frame
    cols = covariate_features(frame, metrics, rank_map(events.frame), events.runs, config)
    if not cols:
        return frame
    return _with_columns(frame, cols)


_OBSERVED = re.compile(r"f_cov_(.+?)(?:_d\d+|_peer)?")
_AHEAD = re.compile(r"x\d+_cov_(.+)_ratio")
_CALENDAR = re.compile(r"x\d+_cal_(.+)_(?:due|within)")


def covariate_input(column: str) -> str | None:
    """What a covariate feature column is computed from: the device metric's slug (e.g.
    ``power_w`` for ``f_cov_power_w_d5`` or ``x5_cov_tokens_ratio``), ``calendar:KIND`` for a
    calendar column; None for a column that is no covariate."""
    for pattern, prefix in ((_OBSERVED, ""), (_AHEAD, ""), (_CALENDAR, "calendar:")):
        match = pattern.fullmatch(column)
        if match:
            return prefix + match.group(1)
    return None


def missing_inputs(needed: list[str] | set[str], metrics: pd.DataFrame | None,
                   runs: dict[str, Any] | None = None) -> dict[str, list[str]]:
    """The covariate columns of ``needed`` that ``metrics`` (device-metric rows) and the runs'
    calendars cannot give, by input (:func:`covariate_input`): ``{input: [columns]}``, empty
    when every one can be built. Columns that are no covariates are not this module's."""
    have = set() if metrics is None or metrics.empty else \
        {_slug(str(m)) for m in pd.unique(metrics["metric"])}
    have |= {f"calendar:{k}" for meta in (runs or {}).values() for k in _calendar(meta)}
    out: dict[str, list[str]] = {}
    for column in sorted(needed):
        source = covariate_input(str(column))
        if source is not None and source not in have:
            out.setdefault(source, []).append(str(column))
    return out


def metric_features(frame: pd.DataFrame, events_frame: pd.DataFrame, metrics: pd.DataFrame,
                    config: DatasetConfig) -> pd.DataFrame:
    """``frame`` (a features frame of ``events_frame``'s runs) with the device-metric covariate
    columns it lacks appended, computed as :func:`add_covariates` does (calendar columns come
    from run metadata, not from here): for features built without the metrics at hand."""
    cols = covariate_features(frame, metrics, rank_map(events_frame), {}, config)
    cols = {k: v for k, v in cols.items() if k not in frame.columns}
    if not cols:
        return frame
    return _with_columns(frame, cols)


def _median_by_row(now: np.ndarray) -> float:
    """The median of the values of ``now`` as the dataset's grouped median takes it
    (``np.nanmedian``: NaN skipped, an even count the mean of the two middle values; none:
    NaN, without numpy's all-NaN warning)."""
    if np.isnan(now).all():
        return np.nan
    return float(np.nanmedian(now))


def series_covariates(series: Mapping[str, np.ndarray], step: int, config: DatasetConfig,
                      meta: Any = None, first_step: int = 0,
                      sampled: Mapping[str, np.ndarray] | None = None,
                      stages: int | None = None) -> dict[str, np.ndarray]:
    """The covariate features of one pipeline replica at origin ``step`` from dense arrays:
    ``{column: (P,) float32}``, the features :func:`covariate_features` gives the dataset's
    rows for the same samples (the same definitions, read by array index, no frames).

    ``series``: ``{metric: (T, P) values}``, row ``i`` the samples at step ``first_step + i``,
    column ``s`` stage ``s``'s rank; a sample is a finite value, or where ``sampled`` (same
    keys and shapes) is given, a True there (its value may be NaN, as a metric row's may).
    Observed metrics are read at rows up to ``step`` only, known-future ones up to
    ``step + max(horizons)``; rows beyond the arrays have no sample. ``meta``: run metadata
    with a ``calendar``, if any; ``stages``: P where ``series`` is empty (calendar only).
    """
    from bubblecast.telemetry.metrics import is_known_future

    out: dict[str, np.ndarray] = {}
    for metric in sorted(series):
        values = np.asarray(series[metric], dtype=np.float64)
        has = ~np.isnan(values) if sampled is None else np.asarray(sampled[metric], dtype=bool)
        rows = np.arange(values.shape[0])[:, None]
        last = np.maximum.accumulate(np.where(has, rows, -1), axis=0) if len(values) else None
        cols = np.arange(values.shape[1])

        def asof(k: int, values: np.ndarray = values, last: Any = last,
                 cols: np.ndarray = cols) -> np.ndarray:
            at = step + k - first_step
            if at < 0 or last is None:
                return np.full(values.shape[1], np.nan)
            i = last[min(at, len(last) - 1)]
            return np.where(i >= 0, values[np.maximum(i, 0), cols], np.nan)

        def peer(now: np.ndarray) -> np.ndarray:
            return np.full(len(now), _median_by_row(now))

        out.update(_metric_columns(_slug(metric), is_known_future(metric), asof, peer, config))
    if stages is None:
        stages = next(iter(series.values())).shape[1] if series else 0
    if meta is not None and stages:
        out.update(_calendar_columns(np.full(stages, int(step), dtype=np.int64),
                                     np.full(stages, "live", dtype=object), {"live": meta},
                                     config))
    return {k: np.asarray(v, dtype=np.float32) for k, v in out.items()}


def origin_covariates(metrics: pd.DataFrame, ranks: list[int] | np.ndarray, step: int,
                      config: DatasetConfig, meta: Any = None) -> dict[str, np.ndarray]:
    """The covariate features of one pipeline replica at origin ``step``, as the dataset
    builds them: ``{column: (P,) float32}``, stage ``s`` read from rank ``ranks[s]``.

    For live callers (the prediction service, the runtime controller). ``metrics``: device
    metric rows (``step``, ``rank``, ``metric``, ``value``; a ``run_id`` column is ignored) up
    to ``step`` for observed metrics and up to ``step + max(horizons)`` for known-future ones
    (:func:`bubblecast.telemetry.metrics.is_known_future`); ``meta``: the run's metadata when
    it has a ``calendar``. The rows become dense arrays (one row per step, samples of a step
    averaged as the dataset does) for :func:`series_covariates`.
    """
    ranks = [int(r) for r in ranks]
    horizon = max(config.horizons, default=0)
    rows = metrics[["step", "rank", "metric", "value"]]
    rows = rows[rows["step"] <= int(step) + horizon]  # later rows are never read
    if rows.empty:
        return series_covariates({}, step, config, meta, stages=len(ranks))
    table = _grouped(rows.assign(run_id="live"))
    lo = int(table["step"].min())
    size = int(table["step"].max()) - lo + 1
    values: dict[str, np.ndarray] = {}
    sampled: dict[str, np.ndarray] = {}
    for metric, part in table.groupby("metric", sort=True):
        v = np.full((size, len(ranks)), np.nan)
        m = np.zeros((size, len(ranks)), dtype=bool)
        at = part["step"].to_numpy(np.int64) - lo
        for s, r in enumerate(ranks):
            mine = part["rank"].to_numpy() == r
            v[at[mine], s] = part["value"].to_numpy(np.float64)[mine]
            m[at[mine], s] = True
        values[str(metric)], sampled[str(metric)] = v, m
    return series_covariates(values, step, config, meta, first_step=lo, sampled=sampled)
