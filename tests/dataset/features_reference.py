"""Frozen reference: ``build_features`` as it was in pandas before the numpy kernels (issue 26).

The tests hold today's features to these values (to float32 resolution and the differences
of summation order); not used by the package. The original docstring follows.

Step series -> features and per-horizon targets, vectorised over every series at once.

Rows: one per (run, replica, stage, step) with at least ``config.history`` steps of history.
Every ``f_*`` feature at origin step t reads only values at steps <= t (the look-ahead test in
``tests/dataset`` perturbs the future and checks this); ``x{h}_*`` features are per-horizon:
the seasonal value and spike phase extrapolated from the past, and the known-ahead token load
of step t+h (a data loader knows it before the step runs). Targets: ``y_h{h}`` (the delay
signal at t+h), ``s_h{h}`` (compute seconds at t+h) and ``work_h{h}`` (work the stage will hold
at t+h with its current layers, used to turn a forecast of ``y`` back into seconds).

Naming: ``f_u_*`` and ``x{h}_u_*`` carry the unit of ``y`` (models divide them by ``level``,
the recent median, to be scale-free); other ``f_*`` / ``x{h}_*`` features are dimensionless.
All series are laid end to end in one array; windows never reach into the previous series
because only rows with ``pos >= history - 1`` are kept.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from bubblecast.dataset.config import DatasetConfig
from bubblecast.errors import BubblecastError

KEY_COLUMNS: list[str] = ["run_id", "replica", "stage", "step"]
INFO_COLUMNS: list[str] = ["scenario", "compute_s", "work", "layers", "y", "level"]


def _series_index(series: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(series id, position within series, start index of the row's series) per row."""
    run = series["run_id"].cat.codes.to_numpy().astype(np.int64)
    rep = series["replica"].to_numpy().astype(np.int64)
    stage = series["stage"].to_numpy().astype(np.int64)
    new = np.r_[True, (run[1:] != run[:-1]) | (rep[1:] != rep[:-1]) | (stage[1:] != stage[:-1])]
    sid = np.cumsum(new) - 1
    starts = np.flatnonzero(new)
    start = starts[sid]
    pos = np.arange(len(series)) - start
    return sid, pos, start


def check_lengths(series: pd.DataFrame, config: DatasetConfig) -> None:
    """Refuse runs shorter than the longest window plus the largest horizon (one line)."""
    steps = series.groupby("run_id", observed=True)["step"].nunique()
    short = steps[steps < config.min_steps]
    if len(short):
        run, n = str(short.index[0]), int(short.iloc[0])
        raise BubblecastError(
            f"run '{run}' has {n} steps; the dataset needs at least {config.min_steps} "
            f"(longest window {config.history} + largest horizon {config.horizons[-1]})"
        )


def _shift(values: np.ndarray, k: int) -> np.ndarray:
    """values[i - k] (k > 0: past, k < 0: future), NaN beyond the array."""
    out = np.full(len(values), np.nan)
    if k > 0:
        out[k:] = values[:-k]
    elif k < 0:
        out[:k] = values[-k:]
    else:
        out[:] = values
    return out


def _ahead(values: np.ndarray, h: int, sid: np.ndarray, step: np.ndarray) -> np.ndarray:
    """values at step t+h of the same series (NaN where that step is missing)."""
    out = _shift(values, -h)
    ok = (_shift(sid.astype(np.float64), -h) == sid) & (_shift(step.astype(np.float64), -h)
                                                        == step + h)
    out[~ok] = np.nan
    return out


def _spikes(y: np.ndarray, pos: np.ndarray, start: np.ndarray, config: DatasetConfig,
            out: dict[str, np.ndarray]) -> np.ndarray:
    """Spike flags, time since the last spike and the spike period; returns the period."""
    w = config.windows[1]
    prev_med = _shift(pd.Series(y).rolling(w).median().to_numpy(), 1)
    high = (pos >= w) & (y > config.spike_ratio * prev_med)
    # A spike is the first high step of an episode, so a lasting slowdown counts once.
    spike = high & ~np.r_[False, high[:-1]]
    idx = np.arange(len(y))
    last = np.maximum.accumulate(np.where(spike, idx, -1))
    last_excl = np.r_[-1, last[:-1]]
    has = last >= start
    prev = np.where(has, last_excl[np.maximum(last, 0)], -1)
    has_prev = has & (prev >= start)
    prev2 = np.where(has_prev, last_excl[np.maximum(prev, 0)], -1)
    has_prev2 = has_prev & (prev2 >= start)
    since = np.where(has, idx - last, np.nan)
    period = np.where(has_prev, last - prev, np.nan)
    period2 = np.where(has_prev2, prev - prev2, np.nan)
    regular = has_prev2 & (np.abs(period - period2) <= 1)
    out["f_spike"] = spike.astype(np.float64)
    out["f_since_spike"] = since
    out["f_spike_period"] = period
    out["f_spike_regular"] = regular.astype(np.float64)
    out["f_spike_count"] = pd.Series(spike.astype(np.float64)).rolling(
        config.history).sum().to_numpy()
    return np.where(regular, period, np.nan)


def _acf(y: np.ndarray, config: DatasetConfig, out: dict[str, np.ndarray]) -> np.ndarray:
    """Autocorrelation peak over lags 2..max_period in the trailing window; returns the lag."""
    w = config.history - config.max_period
    ys = pd.Series(y)
    m = ys.rolling(w).mean().to_numpy()
    sd = ys.rolling(w).std(ddof=0).to_numpy()
    lags = np.arange(2, config.max_period + 1)
    r = np.empty((len(y), len(lags)), dtype=np.float32)
    for j, lag in enumerate(lags):
        past = _shift(m, lag), _shift(sd, lag)
        prod = pd.Series(y * _shift(y, lag)).rolling(w).mean().to_numpy()
        with np.errstate(invalid="ignore", divide="ignore"):
            r[:, j] = (prod - m * past[0]) / (sd * past[1])
    r = np.nan_to_num(r, nan=-1.0)
    best = r.max(axis=1)
    # The smallest lag whose correlation is within 0.05 of the peak (not a multiple of it).
    first = np.argmax(r >= (best - 0.05)[:, None], axis=1)
    period = np.where(best > 0.6, lags[first], np.nan).astype(np.float64)
    out["f_acf_peak"] = best.astype(np.float64)
    out["f_acf_period"] = period
    return period


def _peers(series: pd.DataFrame, y: np.ndarray, out: dict[str, np.ndarray]) -> np.ndarray:
    run = series["run_id"].cat.codes.to_numpy()
    step, stage = series["step"].to_numpy(), series["stage"].to_numpy()
    rep = series["replica"].to_numpy()
    ys = pd.Series(y)
    peer = ys.groupby([run, step]).transform("median").to_numpy()
    same_stage = ys.groupby([run, stage, step]).transform("median").to_numpy()
    pipe = ys.groupby([run, rep, step]).transform("median").to_numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        out["f_peer_ratio"] = y / peer
        out["f_replica_ratio"] = y / same_stage
        out["f_pipeline_ratio"] = y / pipe
    out["f_u_peer_med"] = peer
    return peer


class _Columns(dict):
    """Feature columns stored as float32 for the kept rows only (memory: the full-length
    float64 array is dropped at once, except for the few names later features read)."""

    def __init__(self, keep: np.ndarray, retain: set[str]) -> None:
        super().__init__()
        self.keep, self.retain, self.full = keep, retain, {}

    def __setitem__(self, name: str, values: np.ndarray) -> None:
        if name in self.retain:
            self.full[name] = values
        super().__setitem__(name, np.asarray(values[self.keep], dtype=np.float32))


def build_features(series: pd.DataFrame, config: DatasetConfig | None = None,
                   progress: Callable[[str], None] | None = None) -> pd.DataFrame:
    """Features and targets from :func:`bubblecast.dataset.series.step_series` output."""
    config = config or DatasetConfig()
    note = progress or (lambda _msg: None)
    check_lengths(series, config)
    series = series.sort_values(KEY_COLUMNS, kind="stable").reset_index(drop=True)
    sid, pos, start = _series_index(series)
    y = series["y"].to_numpy(dtype=np.float64)
    keep = pos >= config.history - 1
    retain = {f"f_u_q50_w{config.windows[0]}", "f_since_spike", "f_peer_ratio",
              *(f"f_u_mean_w{w}" for w in config.windows)}
    f = _Columns(keep, retain)

    note("lags and rolling windows")
    level = _history_features(f, y, sid, pos, config)
    note("spikes and periodicity")
    spike_period = _spikes(y, pos, start, config, f)
    acf_period = _acf(y, config, f)
    period = np.where(np.isfinite(spike_period), spike_period, acf_period)
    f["f_period"] = period
    note("peers, partition and known-ahead load")
    peer = _peers(series, y, f)
    for k in range(config.lags):
        f[f"f_u_peer_lag{k}"] = _shift(peer, k)
    f["f_peer_ratio_m5"] = pd.Series(f.full["f_peer_ratio"]).rolling(config.windows[0]).mean() \
        .to_numpy()
    _partition_features(series, f, pos, start, config)
    targets = _horizon_features(series, f, y, sid, pos, period, spike_period, config)
    note("assembling rows")
    return _assemble(series, f, keep, level, targets)


def _history_features(f: _Columns, y: np.ndarray, sid: np.ndarray, pos: np.ndarray,
                      config: DatasetConfig) -> np.ndarray:
    """Lags, rolling-window statistics, EWMs and slopes of ``y``; returns the level."""
    ys = pd.Series(y)
    for k in range(config.lags):
        f[f"f_u_lag{k}"] = _shift(y, k)
    for w in config.windows:
        roll = ys.rolling(w)
        f[f"f_u_mean_w{w}"] = roll.mean().to_numpy()
        f[f"f_u_std_w{w}"] = roll.std().to_numpy()
        f[f"f_u_min_w{w}"] = roll.min().to_numpy()
        f[f"f_u_max_w{w}"] = roll.max().to_numpy()
        for q in config.quantiles:
            f[f"f_u_q{round(q * 100)}_w{w}"] = roll.quantile(q).to_numpy()
    level = f.full[f"f_u_q50_w{config.windows[0]}"]
    for a in config.ewm_alphas:
        f[f"f_u_ewm{a:g}"] = ys.groupby(sid).ewm(alpha=a, adjust=False).mean().to_numpy()
    tpos = pos.astype(np.float64)
    for w in config.windows[1:]:
        roll = pd.Series(tpos * y).rolling(w).mean().to_numpy()
        tmean = pd.Series(tpos).rolling(w).mean().to_numpy()
        slope = (roll - tmean * f.full[f"f_u_mean_w{w}"]) / ((w * w - 1) / 12.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            f[f"f_slope_w{w}"] = slope / level
    return level


def _partition_features(series: pd.DataFrame, f: _Columns, pos: np.ndarray, start: np.ndarray,
                        config: DatasetConfig) -> None:
    """Layers held, cost share, steps since the last repartition and the token ratio."""
    layers = series["layers"].to_numpy(dtype=np.float64)
    f["f_layers"] = layers
    run = series["run_id"].cat.codes.to_numpy()
    rep = series["replica"].to_numpy()
    cost = series["cost"].to_numpy(dtype=np.float64)
    step = series["step"].to_numpy()
    total_cost = pd.Series(cost).groupby([run, rep, step]).transform("sum").to_numpy()
    f["f_cost_share"] = cost / total_cost
    changed = (pos > 0) & (layers != _shift(layers, 1)) & np.isfinite(layers)
    idx = np.arange(len(layers))
    last_change = np.maximum.accumulate(np.where(changed, idx, -1))
    # Capped at the history so that it never encodes the run's age (a serving window sees
    # only ``history`` steps, and run age is an artefact of how a run was recorded).
    f["f_since_repartition"] = np.minimum(
        np.where(last_change >= start, idx - last_change, pos + 1.0), config.history)
    tokens = series["tokens"].to_numpy(dtype=np.float64)
    f["f_tokens_ratio"] = tokens / pd.Series(tokens).rolling(config.windows[1]).mean().to_numpy()


def _horizon_features(series: pd.DataFrame, f: _Columns, y: np.ndarray, sid: np.ndarray,
                      pos: np.ndarray, period: np.ndarray, spike_period: np.ndarray,
                      config: DatasetConfig) -> dict[str, np.ndarray]:
    """Per-horizon inputs (seasonal value, spike phase, known-ahead tokens) and the targets."""
    step = series["step"].to_numpy()
    idx = np.arange(len(y))
    tokens = series["tokens"].to_numpy(dtype=np.float64)
    tok_per = series["tokens2"].to_numpy(dtype=np.float64) / tokens
    cost = series["cost"].to_numpy(dtype=np.float64)
    work = series["work"].to_numpy(dtype=np.float64)
    load = work / cost
    compute = series["compute_s"].to_numpy(dtype=np.float64)
    targets: dict[str, np.ndarray] = {}
    for h in config.horizons:
        lag = np.where(np.isfinite(period), period * np.ceil(h / np.where(
            np.isfinite(period), period, 1.0)) - h, np.nan)
        ok = np.isfinite(lag) & (lag <= pos)
        src = np.where(ok, idx - np.nan_to_num(lag).astype(np.int64), 0)
        f[f"x{h}_u_seasonal"] = np.where(ok, y[src], np.nan)
        phase = np.where(np.isfinite(spike_period), np.mod(f.full["f_since_spike"] + h, np.where(
            np.isfinite(spike_period), spike_period, 1.0)), np.nan)
        f[f"x{h}_spike_due"] = np.where(np.isfinite(phase), (phase == 0).astype(np.float64),
                                        0.0)
        f[f"x{h}_spike_phase"] = phase / spike_period
        f[f"x{h}_tokens_ratio"] = _ahead(tokens, h, sid, step) / tokens
        f[f"x{h}_tokens2_ratio"] = _ahead(tok_per, h, sid, step) / tok_per
        load_h = _ahead(load, h, sid, step)
        targets[f"y_h{h}"] = _ahead(y, h, sid, step)
        targets[f"s_h{h}"] = _ahead(compute, h, sid, step)
        targets[f"work_h{h}"] = np.where(np.isfinite(tokens) & np.isfinite(load_h),
                                         cost * load_h, work)
    return targets


def _assemble(series: pd.DataFrame, f: _Columns, keep: np.ndarray, level: np.ndarray,
              targets: dict[str, np.ndarray]) -> pd.DataFrame:
    """The kept rows: keys, level, features (in the order they were made), then targets."""
    data: dict[str, object] = {c: series[c].to_numpy()[keep] for c in
                               KEY_COLUMNS + ["scenario", "compute_s", "work", "layers", "y"]}
    for col in ("run_id", "scenario"):
        cat = series[col].cat
        data[col] = pd.Categorical.from_codes(cat.codes.to_numpy()[keep], cat.categories)
    data["level"] = np.maximum(level[keep], 1e-12)
    if "speed" in series.columns:
        data["speed"] = series["speed"].to_numpy()[keep]
    data.update(f)
    f.clear()
    data.update({name: values[keep] for name, values in targets.items()})
    return pd.DataFrame(data, copy=False)
