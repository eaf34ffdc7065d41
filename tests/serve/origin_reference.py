"""Frozen copy of ``bubblecast.dataset.online.origin_matrix`` as it was before the per-request
CPU work (commit a4c3c0d), kept only as the reference the current implementation must equal
bit for bit (``test_features.py``). Not used by the service."""

# ruff: noqa
from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from bubblecast.dataset.window import Window


def _median_last(a: np.ndarray) -> np.ndarray:
    """Median over the last axis (as ``np.median``: the mean of the middle two when even)."""
    n = a.shape[-1]
    s = np.sort(a, axis=-1)
    if n % 2:
        return s[..., n // 2]
    return (s[..., n // 2 - 1] + s[..., n // 2]) / 2.0


class _Blocks:
    """Feature rows collected as blocks, written once into one float64 matrix at the end.

    A block is an array broadcastable to ``(k, P)`` or a list of ``k`` rows broadcastable to
    ``(P,)``; nothing is stacked or converted per block (many tiny numpy calls otherwise)."""

    def __init__(self, p: int) -> None:
        self.p = p
        self.names: list[str] = []
        self.blocks: list[tuple[int, Any]] = []

    def add(self, name: str, values: Any) -> None:
        self.names.append(name)
        self.blocks.append((1, [values]))

    def add_block(self, names: list[str], values: Any) -> None:
        self.blocks.append((len(names), values))
        self.names.extend(names)

    def matrix(self) -> np.ndarray:
        out = np.empty((len(self.names), self.p))
        i = 0
        for k, values in self.blocks:
            if isinstance(values, list):
                for j, row in enumerate(values):
                    out[i + j] = row
            else:
                out[i:i + k] = values
            i += k
        return out.astype(np.float32)


def _spikes(y: np.ndarray, cfg: Any, out: _Blocks) -> tuple[np.ndarray, np.ndarray]:
    """Spike features at the origin; returns (steps since the last spike, regular period)."""
    t, p = y.shape
    w = cfg.windows[1]
    prev_med = np.full((t, p), np.nan)
    if t > w:
        prev_med[w:] = _median_last(sliding_window_view(y, w, axis=0)[:-1])
    high = y > cfg.spike_ratio * prev_med
    high[:w] = False
    spike = high.copy()
    spike[1:] &= ~high[:-1]
    o = t - 1
    since, period, period2 = np.full(p, np.nan), np.full(p, np.nan), np.full(p, np.nan)
    for j in range(p):
        idx = np.flatnonzero(spike[:, j])[::-1][:3]  # latest first
        if idx.size >= 1:
            since[j] = o - idx[0]
        if idx.size >= 2:
            period[j] = idx[0] - idx[1]
        if idx.size >= 3:
            period2[j] = idx[1] - idx[2]
    regular = np.isfinite(period2) & (np.abs(period - period2) <= 1)
    out.add_block(["f_spike", "f_since_spike", "f_spike_period", "f_spike_regular",
                   "f_spike_count"],
                  [spike[o], since, period, regular, spike[-cfg.history:].sum(axis=0)])
    return since, np.where(regular, period, np.nan)


def _acf(y: np.ndarray, cfg: Any, out: _Blocks) -> np.ndarray:
    """Autocorrelation peak over lags 2..max_period (float32 as the dataset keeps it)."""
    w = cfg.history - cfg.max_period
    lags = np.arange(2, cfg.max_period + 1)
    t = y.shape[0]
    views = sliding_window_view(y, w, axis=0)  # (T - w + 1, P, w): rows ending at i + w - 1
    cur = views[t - w]  # (P, w)
    past = views[t - w - lags]  # (L, P, w)
    m = cur.sum(axis=1) / w
    sd = np.sqrt(((cur - m[:, None]) ** 2).sum(axis=1) / w)
    pm = past.sum(axis=2) / w
    psd = np.sqrt(((past - pm[:, :, None]) ** 2).sum(axis=2) / w)
    prod = (past * cur[None]).sum(axis=2) / w
    with np.errstate(invalid="ignore", divide="ignore"):
        r = ((prod - m * pm) / (sd * psd)).T.astype(np.float32)
    r = np.nan_to_num(r, nan=-1.0)
    best = r.max(axis=1)
    first = np.argmax(r >= (best - 0.05)[:, None], axis=1)
    period = np.where(best > 0.6, lags[first], np.nan).astype(np.float64)
    out.add_block(["f_acf_peak", "f_acf_period"], [best.astype(np.float64), period])
    return period


def _window_stats(y: np.ndarray, w: int, quantiles: Sequence[float], out: _Blocks) -> np.ndarray:
    """Rolling mean, std, min, max and linear-interpolated quantiles of the last ``w`` rows;
    returns the quantile rows."""
    tail = np.sort(y[-w:], axis=0)
    mean = tail.sum(axis=0) / w
    std = np.sqrt(((tail - mean) ** 2).sum(axis=0) / (w - 1)) if w > 1 else np.nan
    q = np.asarray(quantiles, dtype=np.float64)
    h = (w - 1) * q
    lo = np.floor(h).astype(np.int64)
    hi = np.minimum(lo + 1, w - 1)
    qs = tail[lo] + (h - lo)[:, None] * (tail[hi] - tail[lo])
    out.add_block([f"f_u_mean_w{w}", f"f_u_std_w{w}", f"f_u_min_w{w}", f"f_u_max_w{w}"],
                  [mean, std, tail[0], tail[-1]])
    out.add_block([f"f_u_q{round(x * 100)}_w{w}" for x in quantiles], qs)
    return qs


@lru_cache(maxsize=256)
def _ewm_weights(t: int, alphas: tuple[float, ...]) -> np.ndarray:
    """``(len(alphas), t)`` weights of an ``adjust=False`` EWMA from the first row."""
    a = np.asarray(alphas, dtype=np.float64)[:, None]
    weights = a * (1.0 - a) ** np.arange(t - 1, -1, -1, dtype=np.float64)[None, :]
    weights[:, 0] = (1.0 - a[:, 0]) ** (t - 1)
    return weights


def origin_matrix(window: Window, cfg: Any, horizons: Sequence[int]
                  ) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Every ``f_*`` and ``x{h}_*`` feature at the last step: their names, a float32
    ``(features, P)`` matrix, and ``level`` ``(P,)`` (float64, as the dataset keeps it).

    The window is one series per stage starting at its first row, as the dataset's series
    start at a run's first step.
    """
    y = window.delay
    t, p = y.shape
    out = _Blocks(p)
    lag_names = [f"f_u_lag{k}" for k in range(cfg.lags)]
    out.add_block(lag_names, y[::-1][: cfg.lags])
    level = None
    for w in cfg.windows:
        qs = _window_stats(y, w, cfg.quantiles, out)
        if level is None:
            level = qs[list(cfg.quantiles).index(0.5)]
    out.add_block([f"f_u_ewm{a:g}" for a in cfg.ewm_alphas],
                  _ewm_weights(t, tuple(cfg.ewm_alphas)) @ y)
    for w in cfg.windows[1:]:
        pos = np.arange(t - w, t, dtype=np.float64)[:, None]
        tail = y[-w:]
        slope = ((pos * tail).mean(axis=0) - pos.mean() * tail.mean(axis=0)) \
            / ((w * w - 1) / 12.0)
        out.add(f"f_slope_w{w}", slope / level)
    since_spike, spike_period = _spikes(y, cfg, out)
    acf_period = _acf(y, cfg, out)
    period = np.where(np.isfinite(spike_period), spike_period, acf_period)
    out.add("f_period", period)
    peer = _median_last(y)  # (T,): one replica, so peers are the other stages
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = y / peer[:, None]
    out.add_block(["f_peer_ratio", "f_replica_ratio", "f_pipeline_ratio", "f_u_peer_med",
                   "f_peer_ratio_m5"],
                  [ratio[-1], 1.0, ratio[-1], peer[-1], ratio[-cfg.windows[0]:].mean(axis=0)])
    out.add_block([f"f_u_peer_lag{k}" for k in range(cfg.lags)],
                  peer[::-1][: cfg.lags, None])
    layers = window.layers if window.layers is not None else np.full((t, p), np.nan)
    changed = (layers[1:] != layers[:-1]) & np.isfinite(layers[1:])
    hit = changed[::-1].argmax(axis=0)  # rows back from the origin to the latest change
    since_rep = np.minimum(np.where(changed.any(axis=0), hit, float(t)), cfg.history)
    tokens = window.tokens if window.tokens is not None else np.full((t, p), np.nan)
    out.add_block(["f_layers", "f_cost_share", "f_since_repartition", "f_tokens_ratio"],
                  [layers[-1], window.cost[-1] / window.cost[-1].sum(), since_rep,
                   tokens[-1] / tokens[-cfg.windows[1]:].mean(axis=0)])
    hz = np.asarray(horizons, dtype=np.float64)[:, None]  # (H, 1)
    ok_p = np.isfinite(period)[None, :]
    per = np.where(ok_p, period[None, :], 1.0)
    lag = np.where(ok_p, per * np.ceil(hz / per) - hz, np.nan)  # (H, P)
    ok = np.isfinite(lag) & (lag <= t - 1)
    src = np.where(ok, t - 1 - np.nan_to_num(lag).astype(np.int64), 0)
    seasonal = np.where(ok, y[src, np.arange(p)[None, :]], np.nan)
    sp = np.isfinite(spike_period)[None, :]
    spk = np.where(sp, spike_period[None, :], 1.0)
    phase = np.where(sp, np.mod(since_spike[None, :] + hz, spk), np.nan)
    due = np.where(np.isfinite(phase), (phase == 0).astype(np.float64), 0.0)
    if window.next_tokens is not None:
        ahead = np.asarray(window.next_tokens, dtype=np.float64)[:, None]
    else:
        ahead = np.full((len(hz), 1), np.nan)
    tok_h = np.where(np.isfinite(tokens[-1])[None, :], ahead, np.nan)
    mb = float(window.microbatches)
    with np.errstate(invalid="ignore", divide="ignore"):
        rows = {"u_seasonal": seasonal, "spike_due": due, "spike_phase": phase / spike_period,
                "tokens_ratio": tok_h / tokens[-1],
                # tokens2 / tokens is tokens / microbatches for equal microbatches
                "tokens2_ratio": (tok_h / mb) / (tokens[-1] / mb)}
    for i, h in enumerate(horizons):
        out.add_block([f"x{h}_{k}" for k in rows], [v[i] for v in rows.values()])
    return out.names, out.matrix(), np.maximum(level, 1e-12)


