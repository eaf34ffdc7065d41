"""The dataset's features at one origin, in numpy: the online (serving) hot path.

:func:`bubblecast.dataset.features.build_features` computes every feature at every step with
pandas; a forecast needs them only at the window's last step, per stage, which this module
computes with numpy at a small fraction of that cost, mirroring ``build_features`` feature by
feature; ``tests/serve/test_features.py`` holds the two equal on random windows with spikes,
periods, tokens and repartitions; a model needing a column not computed here is served the
pandas way.
Names, positions and constants are cached, each feature written once into one matrix; the
arithmetic (every bit) is the first numpy version's, kept as a frozen test reference. The
forecaster adapters over this matrix are in :mod:`bubblecast.dataset.online_frame`."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from bubblecast.dataset.window import Window

HORIZON_ROWS = ("u_seasonal", "spike_due", "spike_phase", "tokens_ratio", "tokens2_ratio")


def _median_last(a: np.ndarray) -> np.ndarray:
    """Median over the last axis (as ``np.median``: the mean of the middle two when even)."""
    n = a.shape[-1]
    s = a.copy(order="K")  # np.sort without its wrapper (same layout, same values)
    s.sort(axis=-1)
    if n % 2:
        return s[..., n // 2]
    return (s[..., n // 2 - 1] + s[..., n // 2]) / 2.0


def _windows(y: np.ndarray, w: int) -> np.ndarray:
    """``sliding_window_view(y, w, axis=0)`` (the same strided view, without its checks)."""
    t, p = y.shape
    s0, s1 = y.strides
    return as_strided(y, shape=(t - w + 1, p, w), strides=(s0, s1, s0), writeable=False)


def _config_key(cfg: Any) -> tuple:
    return (int(cfg.lags), tuple(int(w) for w in cfg.windows),
            tuple(float(q) for q in cfg.quantiles), tuple(float(a) for a in cfg.ewm_alphas),
            int(cfg.max_period), float(cfg.spike_ratio))


_KEYS: dict[int, tuple[Any, tuple]] = {}


def _cached_key(cfg: Any) -> tuple:
    """:func:`_config_key` of a config object seen before (configs are not changed after
    they are built; the object is held, so its id stays its own)."""
    hit = _KEYS.get(id(cfg))
    if hit is not None and hit[0] is cfg:
        return hit[1]
    key = _config_key(cfg)
    if len(_KEYS) >= 16:
        _KEYS.pop(next(iter(_KEYS)))
    _KEYS[id(cfg)] = (cfg, key)
    return key


#: ``ndarray.sum`` is ``np.add.reduce`` behind a Python wrapper; the same reduction, called
#: directly (per-request feature code makes ~20 such calls).
_sum = np.add.reduce
_F32_MAX = np.float32(np.finfo(np.float32).max)


@lru_cache(maxsize=64)
def _names(key: tuple, horizons: tuple[int, ...]) -> tuple[str, ...]:
    """Feature names in matrix row order for a config key and the requested horizons."""
    lags, windows, quantiles, alphas = key[:4]
    names = [f"f_u_lag{k}" for k in range(lags)]
    for w in windows:
        names += [f"f_u_mean_w{w}", f"f_u_std_w{w}", f"f_u_min_w{w}", f"f_u_max_w{w}"]
        names += [f"f_u_q{round(x * 100)}_w{w}" for x in quantiles]
    names += [f"f_u_ewm{a:g}" for a in alphas]
    names += [f"f_slope_w{w}" for w in windows[1:]]
    names += ["f_spike", "f_since_spike", "f_spike_period", "f_spike_regular", "f_spike_count",
              "f_acf_peak", "f_acf_period", "f_period", "f_peer_ratio", "f_replica_ratio",
              "f_pipeline_ratio", "f_u_peer_med", "f_peer_ratio_m5"]
    names += [f"f_u_peer_lag{k}" for k in range(lags)]
    names += ["f_layers", "f_cost_share", "f_since_repartition", "f_tokens_ratio"]
    for h in horizons:
        names += [f"x{h}_{k}" for k in HORIZON_ROWS]
    return tuple(names)


@lru_cache(maxsize=64)
def _quantile_plan(w: int, quantiles: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray,
                                                                  np.ndarray]:
    """Rows below and above each linear-interpolated quantile of ``w`` sorted values, and
    the fraction between them."""
    h = (w - 1) * np.asarray(quantiles, dtype=np.float64)
    lo = np.floor(h).astype(np.int64)
    return lo, np.minimum(lo + 1, w - 1), (h - lo)[:, None]


@lru_cache(maxsize=256)
def _positions(t: int, w: int) -> tuple[np.ndarray, float]:
    """Step positions of the last ``w`` of ``t`` rows as a column, and their mean."""
    pos = np.arange(t - w, t, dtype=np.float64)[:, None]
    return pos, pos.mean()


@lru_cache(maxsize=256)
def _ewm_weights(t: int, alphas: tuple[float, ...]) -> np.ndarray:
    """``(len(alphas), t)`` weights of an ``adjust=False`` EWMA from the first row."""
    a = np.asarray(alphas, dtype=np.float64)[:, None]
    weights = a * (1.0 - a) ** np.arange(t - 1, -1, -1, dtype=np.float64)[None, :]
    weights[:, 0] = (1.0 - a[:, 0]) ** (t - 1)
    return weights


def _window_stats(y: np.ndarray, w: int, quantiles: tuple[float, ...], out: np.ndarray,
                  i: int) -> np.ndarray:
    """Rolling mean, std, min, max and quantiles of the last ``w`` rows into ``out[i:]``;
    returns the quantile rows."""
    tail = y[-w:].copy(order="K")
    tail.sort(axis=0)
    mean = _sum(tail, 0) / w
    out[i] = mean
    out[i + 1] = np.sqrt(_sum((tail - mean) ** 2, 0) / (w - 1)) if w > 1 else np.nan
    out[i + 2] = tail[0]
    out[i + 3] = tail[-1]
    lo, hi, frac = _quantile_plan(w, quantiles)
    qs = tail[lo] + frac * (tail[hi] - tail[lo])
    out[i + 4:i + 4 + len(quantiles)] = qs
    return qs


def _spikes(y: np.ndarray, w: int, ratio: float, history: int, out: np.ndarray, i: int
            ) -> tuple[np.ndarray, np.ndarray]:
    """Spike features at the origin into ``out[i:i + 5]``; returns (steps since the last
    spike, regular period)."""
    t, p = y.shape
    high = np.zeros((t, p), dtype=bool)
    if t > w:
        high[w:] = y[w:] > ratio * _median_last(_windows(y, w)[:-1])
    spike = high.copy()
    spike[1:] &= ~high[:-1]
    o = t - 1
    marks = np.where(spike, np.arange(t)[:, None], -1)
    marks.sort(axis=0)
    last = np.full((3, p), -1, dtype=np.int64)
    k = min(3, t)
    last[:k] = marks[::-1][:k]  # latest first, -1 where fewer spikes
    nan = np.nan
    since = np.where(last[0] >= 0, o - last[0], nan)
    period = np.where(last[1] >= 0, last[0] - last[1], nan)
    period2 = np.where(last[2] >= 0, last[1] - last[2], nan)
    regular = np.isfinite(period2) & (np.abs(period - period2) <= 1)
    out[i] = spike[o]
    out[i + 1] = since
    out[i + 2] = period
    out[i + 3] = regular
    out[i + 4] = _sum(spike[-history:], 0)
    return since, np.where(regular, period, nan)


@lru_cache(maxsize=64)
def _lags(max_period: int) -> np.ndarray:
    return np.arange(2, max_period + 1)  # cached: one array per max_period


def _acf(y: np.ndarray, history: int, max_period: int, out: np.ndarray, i: int) -> np.ndarray:
    """Autocorrelation peak over lags 2..max_period (float32 as the dataset keeps it) into
    ``out[i:i + 2]``; returns the period."""
    w = history - max_period
    lags = _lags(max_period)
    t = y.shape[0]
    views = _windows(y, w)  # (T - w + 1, P, w): rows ending at i + w - 1
    cur = views[t - w]  # (P, w)
    past = views[t - w - lags]  # (L, P, w)
    m = _sum(cur, 1) / w
    sd = np.sqrt(_sum((cur - m[:, None]) ** 2, 1) / w)
    pm = _sum(past, 2) / w
    psd = np.sqrt(_sum((past - pm[:, :, None]) ** 2, 2) / w)
    prod = _sum(past * cur[None], 2) / w
    r = ((prod - m * pm) / (sd * psd)).T.astype(np.float32)  # the caller ignores 0/0
    # np.nan_to_num(r, nan=-1.0) without its wrapper: NaN -> -1, +-inf -> the finite extremes
    np.copyto(r, np.float32(-1.0), where=np.isnan(r))
    np.minimum(r, _F32_MAX, out=r)
    np.maximum(r, -_F32_MAX, out=r)
    best = r.max(axis=1)
    first = np.argmax(r >= (best - 0.05)[:, None], axis=1)
    period = np.where(best > 0.6, lags[first], np.nan)
    out[i] = best
    out[i + 1] = period
    return period


def origin_matrix(window: Window, cfg: Any, horizons: Sequence[int]
                  ) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Every ``f_*`` and ``x{h}_*`` feature at the last step: their names, a float32
    ``(features, P)`` matrix, and ``level`` ``(P,)`` (float64, as the dataset keeps it).

    The window is one series per stage starting at its first row, as the dataset's series
    start at a run's first step. A flat or zero series gives NaN features where the dataset
    has them (0/0), silently.
    """
    with np.errstate(invalid="ignore", divide="ignore"):  # once, not per feature block
        return _origin_matrix(window, cfg, horizons)


def _origin_matrix(window: Window, cfg: Any, horizons: Sequence[int]
                   ) -> tuple[list[str], np.ndarray, np.ndarray]:
    key = _cached_key(cfg)
    hzs = tuple(int(h) for h in horizons)
    names = _names(key, hzs)
    lags, windows, quantiles, alphas, max_period, ratio = key
    history = windows[-1]
    y = window.delay
    t, p = y.shape
    out = np.empty((len(names), p))
    out[:lags] = y[::-1][:lags]
    i = lags
    level = None
    for w in windows:
        qs = _window_stats(y, w, quantiles, out, i)
        i += 4 + len(quantiles)
        if level is None:
            level = qs[quantiles.index(0.5)]
    out[i:i + len(alphas)] = _ewm_weights(t, alphas) @ y
    i += len(alphas)
    for w in windows[1:]:
        pos, pos_mean = _positions(t, w)
        tail = y[-w:]
        slope = (_sum(pos * tail, 0) / w - pos_mean * (_sum(tail, 0) / w)) \
            / ((w * w - 1) / 12.0)
        out[i] = slope / level
        i += 1
    since_spike, spike_period = _spikes(y, windows[1], ratio, history, out, i)
    acf_period = _acf(y, history, max_period, out, i + 5)
    i += 7
    period = np.where(np.isfinite(spike_period), spike_period, acf_period)
    out[i] = period
    peer = _median_last(y)  # (T,): one replica, so peers are the other stages
    ratio_ = y / peer[:, None]
    out[i + 1] = ratio_[-1]
    out[i + 2] = 1.0
    out[i + 3] = ratio_[-1]
    out[i + 4] = peer[-1]
    out[i + 5] = _sum(ratio_[-windows[0]:], 0) / windows[0]
    i += 6
    out[i:i + lags] = peer[::-1][:lags, None]
    i += lags
    nan = np.nan
    if window.layers is None:
        out[i] = nan
        out[i + 2] = min(float(t), history)
    else:
        layers = window.layers
        changed = (layers[1:] != layers[:-1]) & np.isfinite(layers[1:])
        hit = changed[::-1].argmax(axis=0)  # rows back from the origin to the latest change
        out[i] = layers[-1]
        out[i + 2] = np.minimum(np.where(changed.any(axis=0), hit, float(t)), history)
    out[i + 1] = window.cost[-1] / window.cost[-1].sum()
    tokens = window.tokens
    if tokens is None:
        out[i + 3] = nan
    else:
        out[i + 3] = tokens[-1] / (_sum(tokens[-windows[1]:], 0) / windows[1])
    i += 4
    _horizon_rows(out[i:].reshape(len(hzs), len(HORIZON_ROWS), p), window, y, hzs, period,
                  since_spike, spike_period)
    return list(names), out.astype(np.float32), np.maximum(level, 1e-12)


def _horizon_rows(rows: np.ndarray, window: Window, y: np.ndarray, hzs: tuple[int, ...],
                  period: np.ndarray, since_spike: np.ndarray, spike_period: np.ndarray
                  ) -> None:
    """The ``x{h}_*`` features into ``rows`` ``(H, len(HORIZON_ROWS), P)``."""
    t, p = y.shape
    nan = np.nan
    tokens = window.tokens
    hz = np.asarray(hzs, dtype=np.float64)[:, None]  # (H, 1)
    ok_p = np.isfinite(period)[None, :]
    per = np.where(ok_p, period[None, :], 1.0)
    lag = np.where(ok_p, per * np.ceil(hz / per) - hz, nan)  # (H, P)
    ok = np.isfinite(lag) & (lag <= t - 1)
    src = np.where(ok, t - 1 - np.where(ok, lag, 0.0).astype(np.int64), 0)
    rows[:, 0] = np.where(ok, y[src, np.arange(p)[None, :]], nan)
    sp = np.isfinite(spike_period)[None, :]
    spk = np.where(sp, spike_period[None, :], 1.0)
    phase = np.where(sp, np.mod(since_spike[None, :] + hz, spk), nan)
    rows[:, 1] = np.where(np.isfinite(phase), (phase == 0).astype(np.float64), 0.0)
    rows[:, 2] = phase / spike_period
    if tokens is None:
        rows[:, 3:] = nan
    else:
        if window.next_tokens is not None:
            ahead = np.asarray(window.next_tokens, dtype=np.float64)[:, None]
        else:
            ahead = np.full((len(hzs), 1), nan)
        tok_h = np.where(np.isfinite(tokens[-1])[None, :], ahead, nan)
        mb = float(window.microbatches)
        rows[:, 3] = tok_h / tokens[-1]
        # tokens2 / tokens is tokens / microbatches for equal microbatches
        rows[:, 4] = (tok_h / mb) / (tokens[-1] / mb)


def origin_features(window: Window, cfg: Any, horizons: Sequence[int]) -> dict[str, np.ndarray]:
    """:func:`origin_matrix` as ``{name: (P,) values}`` (float32 features, float64 level)."""
    names, matrix, level = origin_matrix(window, cfg, horizons)
    out = dict(zip(names, matrix, strict=True))
    out["level"] = level
    return out
