"""The dataset's features at one origin, in numpy: the online (serving) hot path.

:func:`bubblecast.dataset.features.build_features` computes every feature at every step with
pandas (about 20 ms); a forecast needs them only at the window's last step, per stage, which
numpy gives in a few hundred microseconds, mirroring ``build_features`` feature by feature;
``tests/serve/test_features.py`` holds the two equal on random windows with spikes, periods,
tokens and repartitions; a model needing a column not computed here is served the pandas way.
Names, positions and constants are cached, each feature written once into one matrix; the
arithmetic (every bit) is the first numpy version's, kept as a frozen test reference."""

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
    s = np.sort(a, axis=-1)
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
    tail = np.sort(y[-w:], axis=0)
    mean = tail.sum(axis=0) / w
    out[i] = mean
    out[i + 1] = np.sqrt(((tail - mean) ** 2).sum(axis=0) / (w - 1)) if w > 1 else np.nan
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
    out[i + 4] = spike[-history:].sum(axis=0)
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
    period = np.where(best > 0.6, lags[first], np.nan)
    out[i] = best
    out[i + 1] = period
    return period


def origin_matrix(window: Window, cfg: Any, horizons: Sequence[int]
                  ) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Every ``f_*`` and ``x{h}_*`` feature at the last step: their names, a float32
    ``(features, P)`` matrix, and ``level`` ``(P,)`` (float64, as the dataset keeps it).

    The window is one series per stage starting at its first row, as the dataset's series
    start at a run's first step.
    """
    key = _config_key(cfg)
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
        slope = ((pos * tail).sum(axis=0) / w - pos_mean * (tail.sum(axis=0) / w)) \
            / ((w * w - 1) / 12.0)
        out[i] = slope / level
        i += 1
    since_spike, spike_period = _spikes(y, windows[1], ratio, history, out, i)
    acf_period = _acf(y, history, max_period, out, i + 5)
    i += 7
    period = np.where(np.isfinite(spike_period), spike_period, acf_period)
    out[i] = period
    peer = _median_last(y)  # (T,): one replica, so peers are the other stages
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio_ = y / peer[:, None]
    out[i + 1] = ratio_[-1]
    out[i + 2] = 1.0
    out[i + 3] = ratio_[-1]
    out[i + 4] = peer[-1]
    out[i + 5] = ratio_[-windows[0]:].sum(axis=0) / windows[0]
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
        out[i + 3] = tokens[-1] / (tokens[-windows[1]:].sum(axis=0) / windows[1])
    i += 4
    with np.errstate(invalid="ignore", divide="ignore"):
        _horizon_rows(out[i:].reshape(len(hzs), len(HORIZON_ROWS), p), window, y, hzs,
                      period, since_spike, spike_period)
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


class _Column:
    """One column of a :class:`ColumnFrame`: what ``frame[name].to_numpy(...)`` returns."""

    __slots__ = ("values",)

    def __init__(self, values: np.ndarray) -> None:
        self.values = values

    def to_numpy(self, dtype: Any = None, copy: bool = False, **_: Any) -> np.ndarray:
        return self.values.astype(dtype) if dtype is not None else self.values


class _Names(list):
    """Column names with an O(1) ``in``."""

    def __init__(self, names: list[str]) -> None:
        super().__init__(names)
        self._set = frozenset(names)

    def __contains__(self, name: object) -> bool:
        return name in self._set


class ColumnFrame:
    """The read-only slice of the pandas DataFrame API a forecaster's ``predict_signal``
    uses on its inputs (``columns``, ``frame[name].to_numpy()``, ``len``), over the origin
    matrix without building a DataFrame. Whether a model's ``predict_signal`` is content with
    it is checked when the model loads (:class:`bubblecast.forecast.served.FeatureModel`)."""

    def __init__(self, names: list[str], matrix: np.ndarray, level: np.ndarray) -> None:
        self._index = {n: i for i, n in enumerate(names)}
        self._matrix = matrix
        self._level = level
        self.columns = _Names(names + ["level"])

    def __len__(self) -> int:
        return int(self._level.shape[0])

    def __getitem__(self, name: str) -> _Column:
        if name == "level":
            return _Column(self._level)
        i = self._index.get(name)
        if i is None:
            raise KeyError(name)
        return _Column(self._matrix[i])


class FastFeatures:
    """Origin rows from :func:`origin_matrix`, predicted by the forecaster: straight from the
    matrix by its ``predict_matrix`` (``mode="matrix"``: no frame at all), or by its own
    ``predict_signal`` on a :class:`ColumnFrame` (``"light"``) or a small pandas frame
    (``"frame"``)."""

    MODES = ("matrix", "light", "frame")

    def __init__(self, forecaster: Any, cfg: Any, light: bool = True,
                 mode: str | None = None) -> None:
        mode = mode or ("light" if light else "frame")
        if mode not in self.MODES:
            raise ValueError(f"mode must be one of {self.MODES}, got {mode!r}")
        self.forecaster = forecaster
        self.cfg = cfg
        self.mode = mode
        self.light = mode != "frame"
        self._plans: dict[tuple[int, ...], np.ndarray] = {}
        self._predict_matrix = forecaster.predict_matrix if mode == "matrix" else None

    @staticmethod
    def needed(forecaster: Any) -> set[str]:
        """Input columns the forecaster reads, as far as its fitted attributes tell."""
        need = set(getattr(forecaster, "features_", []))
        for h in getattr(forecaster, "horizons_", []):
            need |= {f"x{h}_{g[2:]}" for g in getattr(forecaster, "horizon_features_", [])}
        need |= set(getattr(forecaster, "column_", {}).values())
        return need

    @classmethod
    def covers(cls, forecaster: Any, cfg: Any) -> bool:
        """True when every column the forecaster names is computed here."""
        hz = [int(h) for h in forecaster.horizons_]
        t = cfg.history
        probe = Window(compute=1.0 + np.random.default_rng(0).random((t, 2)),
                       cost=np.ones((t, 2)), microbatches=2)
        need = cls.needed(forecaster)
        return bool(need) and need <= set(origin_matrix(probe, cfg, hz)[0])

    def rows(self, window: Window, horizons: Sequence[int]) -> Any:
        names, matrix, level = origin_matrix(window, self.cfg, horizons)
        if self.light:
            return ColumnFrame(names, matrix, level)
        import pandas as pd

        frame = pd.DataFrame(matrix.T, columns=names)
        frame["level"] = level
        return frame

    def _plan(self, names: list[str], horizons: tuple[int, ...]) -> np.ndarray:
        """Rows of ``[origin matrix; level]`` in the forecaster's ``matrix_columns`` order
        (NaN row where the origin has no such column); cached per horizons."""
        plan = self._plans.get(horizons)
        if plan is None:
            where = {n: i for i, n in enumerate(names)}
            where["level"] = len(names)
            cols = self.forecaster.matrix_columns(list(horizons))
            plan = np.array([where.get(c, len(names) + 1) for c in cols], dtype=np.intp)
            self._plans[horizons] = plan
        return plan

    def predict(self, window: Window, horizons: Sequence[int]) -> np.ndarray:
        if self.mode == "matrix":
            names, matrix, level = origin_matrix(window, self.cfg, horizons)
            full = np.empty((matrix.shape[0] + 2, matrix.shape[1]))
            full[:-2] = matrix
            full[-2] = level
            full[-1] = np.nan
            X = full[self._plan(names, tuple(int(h) for h in horizons))].T
            return np.asarray(self._predict_matrix(X, list(horizons)), dtype=np.float64)
        preds = self.forecaster.predict_signal(self.rows(window, horizons), list(horizons))
        return np.stack([np.asarray(preds[h], dtype=np.float64) for h in horizons], axis=1)
