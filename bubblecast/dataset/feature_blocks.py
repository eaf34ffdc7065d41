"""The per-series features of a block of whole series, written at the block's kept rows.

:func:`block_features` computes everything that reads one series at a time (lags, window
statistics, EWMs, slopes, spikes, autocorrelation, repartitions, the known-ahead load and the
targets) from the kernels of :mod:`bubblecast.dataset.windows`, whose values do not depend on
what else the block holds; :func:`peer_features` the features across series (peers, cost
share), from the whole frame. Both write into a :class:`Sink` of preallocated columns, so
blocks run on any thread in any order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from bubblecast.dataset.config import DatasetConfig
from bubblecast.dataset.windows import (
    CHUNK_ROWS,
    Moments,
    ewm_restarting,
    levels_for,
    order_stats,
    pyramid,
    window_sum,
    window_sums,
)

Put = Callable[[str, np.ndarray], None]


class Sink:
    """Output columns of the kept rows, allocated once (float32 features, float64 targets
    and level); blocks write disjoint row ranges."""

    def __init__(self, names32: list[str], names64: list[str], rows: int) -> None:
        self.arrays: dict[str, np.ndarray] = {n: np.empty(rows, np.float32) for n in names32}
        self.arrays.update({n: np.empty(rows) for n in names64})

    def writer(self, offset: int) -> Put:
        """``put(name, values)`` writing ``values`` at kept rows ``offset`` onwards."""
        arrays = self.arrays

        def put(name: str, values: np.ndarray) -> None:
            arrays[name][offset:offset + len(values)] = values

        return put


@dataclass
class Inputs:
    """The step-series columns the features read, as float64 arrays (``step`` int64), and
    each row's position in its series."""

    y: np.ndarray
    pos: np.ndarray
    step: np.ndarray
    layers: np.ndarray
    cost: np.ndarray
    tokens: np.ndarray
    tok_per: np.ndarray
    work: np.ndarray
    compute: np.ndarray

    @classmethod
    def of(cls, series: pd.DataFrame, pos: np.ndarray) -> Inputs:
        col = {c: series[c].to_numpy(dtype=np.float64) for c in
               ("y", "layers", "cost", "tokens", "tokens2", "work", "compute_s")}
        with np.errstate(invalid="ignore", divide="ignore"):
            tok_per = col["tokens2"] / col["tokens"]
        return cls(y=col["y"], pos=pos, step=series["step"].to_numpy().astype(np.int64),
                   layers=col["layers"], cost=col["cost"], tokens=col["tokens"],
                   tok_per=tok_per, work=col["work"], compute=col["compute_s"])

    def rows(self, lo: int, hi: int) -> Inputs:
        return Inputs(**{k: v[lo:hi] for k, v in vars(self).items()})


def block_features(inputs: Inputs, lo: int, hi: int, offset: int, config: DatasetConfig,
                   sink: Sink) -> None:
    """Every per-series feature and target of rows ``[lo, hi)`` (whole series) at their
    kept rows, written from kept row ``offset`` on."""
    b = inputs.rows(lo, hi)
    k = np.flatnonzero(b.pos >= config.history - 1)
    if not len(k):
        return
    put = sink.writer(offset)
    start = np.arange(len(b.y)) - b.pos
    with np.errstate(invalid="ignore", divide="ignore"):
        top = levels_for(max(config.windows[-1], config.history - config.max_period))
        mom = Moments(b.y, b.pos, top)
        level, median = _history(b, k, mom, config, put)
        assert median is not None
        since, spike_period = _spikes(b, k, start, median, config, put)
        acf_period = _acf(k, mom, config, put)
        period = np.where(np.isfinite(spike_period), spike_period, acf_period)
        put("f_period", period)
        put("level", np.maximum(level, 1e-12))
        _partition(b, k, start, config, put)
        _horizons(b, k, start, period, since, spike_period, config, put)


def history_features(inputs: Inputs, lo: int, hi: int, offset: int, config: DatasetConfig,
                     sink: Sink) -> None:
    """The lags, window statistics and EWMs alone of rows ``[lo, hi)`` (whole series) at
    their kept rows, written from kept row ``offset`` on."""
    b = inputs.rows(lo, hi)
    k = np.flatnonzero(b.pos >= config.history - 1)
    if len(k):
        with np.errstate(invalid="ignore", divide="ignore"):
            mom = Moments(b.y, b.pos, levels_for(config.windows[-1]))
            _history(b, k, mom, config, sink.writer(offset), full=False)


def _history(b: Inputs, k: np.ndarray, mom: Moments, config: DatasetConfig,
             put: Put, full: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
    """Lags, window statistics, EWMs and (``full``) slopes at the kept rows; returns the level
    (median of the shortest window) there and (``full``) the rolling median of ``windows[1]``
    at every row."""
    y, quantiles = mom.y, config.quantiles  # values that are not finite as NaN
    for lag in range(config.lags):
        put(f"f_u_lag{lag}", b.y[k - lag])
    level = median = None
    w1 = config.windows[1]
    for w in config.windows:
        mean, std = mom.mean_std(w, k)
        put(f"f_u_mean_w{w}", mean)
        put(f"f_u_std_w{w}", std)
        if w == w1 and full:  # every row: the spikes read its median
            stats = order_stats(y, np.arange(w - 1, len(y)), w, quantiles, median=True)
            median = np.full(len(y), np.nan)
            median[w - 1:] = stats.pop()
            stats = [s[k - (w - 1)] for s in stats]
        else:
            stats = order_stats(y, k, w, quantiles)
        put(f"f_u_min_w{w}", stats[0])
        put(f"f_u_max_w{w}", stats[1])
        for q, values in zip(quantiles, stats[2:], strict=True):
            put(f"f_u_q{round(q * 100)}_w{w}", values)
        if level is None:
            level = stats[2 + quantiles.index(0.5)]
    if np.isfinite(y).all():
        ewm = ewm_restarting(y, b.pos, config.ewm_alphas)
    else:  # pandas' handling of missing values (weights decay over them), series by series
        ys = pd.Series(y).groupby(np.cumsum(b.pos == 0))
        ewm = np.stack([ys.ewm(alpha=a, adjust=False).mean().to_numpy()
                        for a in config.ewm_alphas])
    for a, values in zip(config.ewm_alphas, ewm, strict=True):
        put(f"f_u_ewm{a:g}", values[k])
    assert level is not None
    if not full:
        return level, None
    moved = pyramid(b.pos * (y - mom.x0), levels_for(config.windows[-1]))
    for w in config.windows[1:]:
        mean_c, _ = mom.centred(w, k)
        cov = window_sum(moved, w, k) / w - (b.pos[k] - (w - 1) / 2.0) * mean_c
        put(f"f_slope_w{w}", cov / ((w * w - 1) / 12.0) / level)
    return level, median


def _spikes(b: Inputs, k: np.ndarray, start: np.ndarray, median: np.ndarray,
            config: DatasetConfig, put: Put) -> tuple[np.ndarray, np.ndarray]:
    """Spike flags, steps since the last spike, its period and regularity and the spike count
    at the kept rows; returns (steps since the last spike, regular period) there."""
    y, pos, w = b.y, b.pos, config.windows[1]
    prev_med = np.full(len(y), np.nan)
    prev_med[w:] = median[w - 1:-1]
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
    since = np.where(has, idx - last, np.nan)[k]
    period = np.where(has_prev, last - prev, np.nan)[k]
    period2 = np.where(has_prev2, prev - prev2, np.nan)[k]
    regular = has_prev2[k] & (np.abs(period - period2) <= 1)
    counts = np.r_[0, np.cumsum(spike)]
    put("f_spike", spike[k])
    put("f_since_spike", since)
    put("f_spike_period", period)
    put("f_spike_regular", regular)
    put("f_spike_count", counts[k + 1] - counts[k + 1 - config.history])
    return since, np.where(regular, period, np.nan)


def _acf(k: np.ndarray, mom: Moments, config: DatasetConfig, put: Put) -> np.ndarray:
    """Autocorrelation peak over lags 2..max_period in the trailing window and its lag, at the
    kept rows; returns the period. Rows in chunks of :data:`CHUNK_ROWS` (each with the
    history before it), every row of a chunk at once."""
    w, most, lead = config.history - config.max_period, config.max_period, config.history - 1
    lags = np.arange(2, most + 1)
    c = mom.c
    best, period = np.full(len(c), np.nan), np.full(len(c), np.nan)
    view = np.lib.stride_tricks.sliding_window_view
    for at in range(lead, len(c), CHUNK_ROWS):
        lo, hi = at - lead, min(at + CHUNK_ROWS, len(c))
        seg = c[lo:hi]
        prod = np.empty((len(seg) - most, len(lags)))
        segs = view(seg, most + 1)
        np.multiply(segs[:, most:], segs[:, most - lags], out=prod)
        sums = window_sums(pyramid(prod, levels_for(w)), w)[lead - most:]
        m = window_sums(pyramid(seg, levels_for(w)), w) / w
        ss = window_sums(pyramid(seg * seg, levels_for(w)), w)
        ss -= m * m * w
        np.maximum(ss, 0.0, out=ss)
        ss[mom.runs[lo:hi] >= w] = 0.0
        sd = np.sqrt(ss / w)
        cov = sums / w - m[lead:, None] * view(m, most + 1)[lead - most:, most - lags]
        r = (cov / (sd[lead:, None] * view(sd, most + 1)[lead - most:, most - lags])).astype(
            np.float32)
        r = np.nan_to_num(r, nan=-1.0)
        top = r.max(axis=1)
        # The smallest lag whose correlation is within 0.05 of the peak (not a multiple of it).
        pick = np.argmax(r >= (top - 0.05)[:, None], axis=1)
        best[at:hi] = top
        period[at:hi] = np.where(top > 0.6, lags[pick], np.nan)
    put("f_acf_peak", best[k])
    put("f_acf_period", period[k])
    return period[k]


def _partition(b: Inputs, k: np.ndarray, start: np.ndarray, config: DatasetConfig,
               put: Put) -> None:
    """Layers held, steps since the last repartition and the token ratio at the kept rows."""
    layers, pos = b.layers, b.pos
    put("f_layers", layers[k])
    changed = (pos > 0) & (layers != np.r_[np.nan, layers[:-1]]) & np.isfinite(layers)
    idx = np.arange(len(layers))
    last_change = np.maximum.accumulate(np.where(changed, idx, -1))[k]
    # Capped at the history so that it never encodes the run's age (a serving window sees
    # only ``history`` steps, and run age is an artefact of how a run was recorded).
    put("f_since_repartition", np.minimum(
        np.where(last_change >= start[k], k - last_change, pos[k] + 1.0), config.history))
    w = config.windows[1]
    mean = window_sum(pyramid(b.tokens, levels_for(w)), w, k) / w
    put("f_tokens_ratio", b.tokens[k] / mean)


def _horizons(b: Inputs, k: np.ndarray, start: np.ndarray, period: np.ndarray,
              since: np.ndarray, spike_period: np.ndarray, config: DatasetConfig,
              put: Put) -> None:
    """Per-horizon inputs (seasonal value, spike phase, known-ahead tokens) and the targets at
    the kept rows."""
    n, pos = len(b.y), b.pos[k]
    tokens, tok_per, cost, work = b.tokens[k], b.tok_per[k], b.cost[k], b.work[k]
    load = b.work / b.cost
    # periods are whole numbers of steps: integer arithmetic (the float formulas' values)
    has_period, has_spikes = np.isfinite(period), np.isfinite(spike_period)
    per = np.where(has_period, period, 1.0).astype(np.int64)
    spk = np.where(has_spikes, spike_period, 1.0).astype(np.int64)
    since_i = np.where(has_spikes, since, 0.0).astype(np.int64)
    for h in config.horizons:
        lag = (-h) % per  # the seasonal lag: period * ceil(h / period) - h
        ok = has_period & (lag <= pos)
        src = np.where(ok, k - lag, 0)
        put(f"x{h}_u_seasonal", np.where(ok, b.y[src], np.nan))
        phase = (since_i + h) % spk
        put(f"x{h}_spike_due", has_spikes & (phase == 0))
        put(f"x{h}_spike_phase", np.where(has_spikes, phase / spk, np.nan))
        # the value at step t + h of the same series (NaN where that step is missing)
        at = np.minimum(k + h, n - 1)
        there = (k + h < n) & (start[at] == start[k]) & (b.step[at] == b.step[k] + h)

        def ahead(values: np.ndarray, at: np.ndarray = at, there: np.ndarray = there
                  ) -> np.ndarray:
            return np.where(there, values[at], np.nan)

        put(f"x{h}_tokens_ratio", ahead(b.tokens) / tokens)
        put(f"x{h}_tokens2_ratio", ahead(b.tok_per) / tok_per)
        load_h = ahead(load)
        put(f"y_h{h}", ahead(b.y))
        put(f"s_h{h}", ahead(b.compute))
        put(f"work_h{h}", np.where(np.isfinite(tokens) & np.isfinite(load_h), cost * load_h,
                                   work))


def peer_features(series: pd.DataFrame, inputs: Inputs, kept: np.ndarray,
                  config: DatasetConfig, sink: Sink) -> None:
    """Features across series at every kept row: the delay signal over the median of the
    run's ranks at the step (of its stage's replicas, of its pipeline), their recent mean,
    the peers' median and its lags, and the stage's share of its pipeline's cost."""
    put = sink.writer(0)
    run = series["run_id"].cat.codes.to_numpy()
    step, stage = series["step"].to_numpy(), series["stage"].to_numpy()
    rep = series["replica"].to_numpy()
    y = inputs.y
    ys = pd.Series(y)
    peer = ys.groupby([run, step]).transform("median").to_numpy()
    same_stage = ys.groupby([run, stage, step]).transform("median").to_numpy()
    pipe = ys.groupby([run, rep, step]).transform("median").to_numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = y / peer
        put("f_peer_ratio", ratio[kept])
        put("f_replica_ratio", y[kept] / same_stage[kept])
        put("f_pipeline_ratio", y[kept] / pipe[kept])
        put("f_u_peer_med", peer[kept])
        for lag in range(config.lags):
            put(f"f_u_peer_lag{lag}", peer[kept - lag])
        w = config.windows[0]
        finite = np.where(np.isfinite(ratio), ratio, np.nan)  # as pandas' rolling mean
        put("f_peer_ratio_m5", window_sum(pyramid(finite, levels_for(w)), w, kept) / w)
        total = pd.Series(inputs.cost).groupby([run, rep, step]).transform("sum").to_numpy()
        put("f_cost_share", inputs.cost[kept] / total[kept])
