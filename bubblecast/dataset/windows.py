"""Trailing-window kernels of the batch features, in numpy.

Every value is computed from its own window's (or series') values alone, in an order that
depends only on the window: sums go up a pyramid of pairwise sums (``levels[j][i]`` is the
sum of the ``2**j`` rows ending at ``i``, each level the sum of two halves of the one below),
order statistics come from the sorted window, EWMs from a doubling scan masked by the position
in the series. So a row's features have the same bits whatever else the array holds: blocks
of series, thread counts and runs built apart or together all agree. Rows read here are those
whose windows lie inside their series (the caller's ``rows``); other entries of the
intermediate arrays are not meaningful.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

#: Rows sorted at once by :func:`order_stats` (bounds the (rows, w) scratch array).
CHUNK_ROWS = 1 << 14


def pyramid(x: np.ndarray, top: int) -> list[np.ndarray]:
    """``[x, sums of 2 rows, of 4, ..., of 2**top]`` along axis 0 (NaN before the first full
    window)."""
    levels = [x]
    for j in range(top):
        d, prev = 1 << j, levels[-1]
        nxt = np.empty_like(prev)
        nxt[:d] = np.nan
        np.add(prev[d:], prev[:-d], out=nxt[d:])
        levels.append(nxt)
    return levels


def levels_for(w: int) -> int:
    """Pyramid levels a window of ``w`` rows needs (the index of its highest bit)."""
    return int(w).bit_length() - 1


def window_sum(levels: list[np.ndarray], w: int, rows: np.ndarray) -> np.ndarray:
    """Sum of the ``w`` rows ending at each of ``rows`` (an index array of any shape), from
    :func:`pyramid` levels: the largest power of two first, then the rows before it."""
    out: np.ndarray | None = None
    off = 0
    for j in range(levels_for(w), -1, -1):
        if w >> j & 1:
            part = levels[j][rows - off] if off else levels[j][rows]
            out = part if out is None else np.add(out, part, out=out)
            off += 1 << j
    assert out is not None
    return out


def window_sums(levels: list[np.ndarray], w: int) -> np.ndarray:
    """:func:`window_sum` at every row (NaN before the first full window), from slices."""
    base = levels[0]
    out = np.full(base.shape, np.nan)
    n, off, tail = len(base), 0, out[w - 1:]
    for j in range(levels_for(w), -1, -1):
        if w >> j & 1:
            part = levels[j][w - 1 - off:n - off]
            if off:
                np.add(tail, part, out=tail)
            else:
                tail[...] = part
            off += 1 << j
    return out


def run_lengths(x: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Rows since (and including) the last change of value within the series: a window of
    ``w`` rows ending at ``i`` holds one value when ``run_lengths[i] >= w``."""
    idx = np.arange(len(x))
    change = first.copy()
    change[1:] |= x[1:] != x[:-1]
    return idx - np.maximum.accumulate(np.where(change, idx, 0)) + 1


class Moments:
    """Windowed mean and spread of a series from pyramids of ``x - x0`` (``x0`` the series'
    first value, 0 if that is not finite: sums of small numbers, the same for the series
    wherever it lies), with windows of one value (``run_lengths``) given a spread of exactly
    0. Values that are not finite count as missing (as pandas' rolling statistics take
    them): a window holding one gives NaN."""

    def __init__(self, y: np.ndarray, pos: np.ndarray, top: int) -> None:
        self.y = np.where(np.isfinite(y), y, np.nan)
        first = self.y[np.arange(len(y)) - pos]
        self.x0 = np.where(np.isfinite(first), first, 0.0)
        self.runs = run_lengths(self.y, pos == 0)
        self.c = self.y - self.x0
        self.s1 = pyramid(self.c, top)
        self.s2 = pyramid(self.c * self.c, top)

    def centred(self, w: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mean of ``x - x0``, sum of squared deviations) of the windows ending at ``rows``."""
        s1 = window_sum(self.s1, w, rows)
        mean = s1 / w
        ss = window_sum(self.s2, w, rows)
        ss -= s1 * mean
        np.maximum(ss, 0.0, out=ss)
        ss[self.runs[rows] >= w] = 0.0
        return mean, ss

    def mean_std(self, w: int, rows: np.ndarray, ddof: int = 1) -> tuple[np.ndarray,
                                                                         np.ndarray]:
        """Mean and standard deviation (``ddof``) of the windows ending at ``rows``."""
        mean, ss = self.centred(w, rows)
        mean += self.x0[rows]
        std = np.sqrt(ss / (w - ddof)) if w > ddof else np.full(len(rows), np.nan)
        return mean, std


def quantile_plan(w: int, quantiles: Sequence[float]) -> list[tuple[int, int, float]]:
    """Per quantile: the sorted positions below and above it and the fraction between them
    (linear interpolation, as pandas' rolling quantile)."""
    plan = []
    for q in quantiles:
        h = (w - 1) * float(q)
        lo = int(np.floor(h))
        plan.append((lo, min(lo + 1, w - 1), h - lo))
    return plan


def order_stats(y: np.ndarray, rows: np.ndarray, w: int, quantiles: Sequence[float],
                median: bool = False) -> list[np.ndarray]:
    """``[min, max, quantile...]`` (and the median, the mean of the middle two for even
    ``w``, with ``median``) of the ``w`` rows ending at each of ``rows``, from the sorted
    windows, :data:`CHUNK_ROWS` rows at a time; NaN for a window holding a NaN (as pandas'
    rolling statistics with a full window required)."""
    plan = quantile_plan(w, quantiles)
    outs = [np.empty(len(rows)) for _ in range(2 + len(plan) + int(median))]
    view = sliding_window_view(y, w)
    for at in range(0, len(rows), CHUNK_ROWS):
        part = slice(at, at + CHUNK_ROWS)
        s = view[rows[part] - (w - 1)]
        s.sort(axis=1)
        outs[0][part], outs[1][part] = s[:, 0], s[:, -1]
        for i, (lo, hi, frac) in enumerate(plan):
            low = s[:, lo]
            outs[2 + i][part] = low + (s[:, hi] - low) * frac
        if median:
            outs[-1][part] = (s[:, w // 2] if w % 2 else (s[:, w // 2 - 1] + s[:, w // 2]) / 2.0)
        missing = np.isnan(s[:, -1])  # NaN sorts last: a window missing a value has none
        if missing.any():
            for out in outs:
                out[part][missing] = np.nan
    return outs


def ewm_restarting(y: np.ndarray, pos: np.ndarray, alphas: Sequence[float]) -> np.ndarray:
    """``(len(alphas), n)`` EWMs (``adjust=False``: ``e0 = y0``, ``e = (1 - a) e + a y``)
    restarting at each series' first row (``pos == 0``), by a doubling scan: after the round of
    span ``d`` each row holds the EWM terms of the ``2d`` rows ending at it."""
    a = np.asarray(alphas, dtype=np.float64)[:, None]
    e = np.where(pos == 0, y, a * y)
    decay = 1.0 - a
    d, longest = 1, int(pos.max(initial=0))
    while d <= longest:
        carry = np.where(pos[d:] >= d, e[:, :-d] * decay, 0.0)
        e[:, d:] += carry
        decay = decay * decay
        d *= 2
    return e
