"""Split conformal calibration of quantile intervals (conformalised quantile regression), and
adaptive conformal inference online (:class:`AdaptiveConformal`).

Models fitted now apply their shifts in ``interval`` mode (the median is clipped into the
calibrated bounds, not the bounds to the median); models saved before keep ``shift`` mode.

Mondrian groups: a model's shifts of one horizon are a dict of per-group ``(lo, hi)`` pairs
plus ``"all"`` (pooled). Two schemes. The *regime* scheme (:func:`regime_shifts`; the dict
also holds ``"edges"`` and ``"window"``) groups rows by the series' recent volatility,
``f_u_std_w20 / level`` (or the nearest window the features have), binned at quantiles of
the calibration rows, so that quiet and volatile stretches, and quiet and volatile runs, are
each covered about ``coverage`` (a single pooled shift over-covers the quiet ones and
under-covers the volatile ones). The *token* scheme of models fitted before
(:func:`grouped_shifts`) groups rows by whether the step's token load is known ahead.
:func:`row_groups` picks the scheme from the dict, so either kind of model applies its own.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable

import numpy as np


def conformal_shifts(lo: np.ndarray, hi: np.ndarray, y: np.ndarray, coverage: float = 0.8
                     ) -> tuple[float, float]:
    """``(shift_lo, shift_hi)`` to apply as ``lo - shift_lo`` and ``hi + shift_hi``.

    Each tail gets ``(1 - coverage) / 2``: shift_lo is the conformal quantile of ``lo - y`` at
    level ``ceil((n + 1)(1 - a)) / n`` (likewise ``y - hi``). Shifts may be negative, which
    narrows an interval that was too wide. NaN rows are ignored; with no rows, no shift.
    """
    if not 0.0 < coverage < 1.0:
        raise ValueError(f"coverage must be in (0, 1), got {coverage}")
    ok = np.isfinite(lo) & np.isfinite(hi) & np.isfinite(y)
    n = int(ok.sum())
    if n == 0:
        return 0.0, 0.0
    tail = (1.0 - coverage) / 2.0
    level = min(1.0, np.ceil((n + 1) * (1.0 - tail)) / n)
    s_lo = float(np.quantile(lo[ok] - y[ok], level, method="higher"))
    s_hi = float(np.quantile(y[ok] - hi[ok], level, method="higher"))
    return s_lo, s_hi


def apply_shifts(q: np.ndarray, shifts: tuple[float, float]) -> np.ndarray:
    """Shift columns 0 and 2 of an ``(n, 3)`` quantile array; keep p10 <= p50 <= p90."""
    out = np.array(q, dtype=np.float64, copy=True)
    out[:, 0] -= shifts[0]
    out[:, 2] += shifts[1]
    out[:, 0] = np.minimum(out[:, 0], out[:, 1])
    out[:, 2] = np.maximum(out[:, 2], out[:, 1])
    return out


#: Fewest calibration rows a group needs for its own shifts (else the pooled shifts apply).
MIN_GROUP_ROWS = 200


def calibration_groups(frame: object) -> np.ndarray:
    """Mondrian groups: 1 where the row has known-ahead token load (data-dependent work),
    else 0. Such rows are less predictable in a different way, so each group gets its own
    shifts and the 80% holds within each, not only on average."""
    cols = getattr(frame, "columns", [])
    if "f_tokens_ratio" not in cols:
        return np.zeros(len(frame), dtype=np.int64)  # type: ignore[arg-type]
    return np.isfinite(frame["f_tokens_ratio"].to_numpy(dtype=np.float64)).astype(np.int64)


def grouped_shifts(lo: np.ndarray, hi: np.ndarray, y: np.ndarray, groups: np.ndarray,
                   coverage: float = 0.8) -> dict[str, tuple[float, float]]:
    """Shifts per group (keys ``"0"``, ``"1"``...) plus ``"all"`` (pooled, the fallback)."""
    out = {"all": conformal_shifts(lo, hi, y, coverage)}
    for g in np.unique(groups):
        sel = (groups == g) & np.isfinite(y)
        if sel.sum() >= MIN_GROUP_ROWS:
            out[str(int(g))] = conformal_shifts(lo[sel], hi[sel], y[sel], coverage)
    return out


#: Volatility bins of the regime scheme (quantiles of the calibration rows).
REGIME_BINS = 5
#: Preferred window (steps) of the rolling standard deviation a row's regime is read from.
REGIME_WINDOW = 20
_STD = re.compile(r"^f_u_std_w(\d+)$")


def regime_window(columns: Iterable[object]) -> int | None:
    """The window of the volatility column regimes are read from: of the ``f_u_std_w<w>``
    in ``columns``, the ``w`` closest to :data:`REGIME_WINDOW` (the longer of two as close);
    None without any."""
    found = [int(m.group(1)) for c in columns if (m := _STD.match(str(c)))]
    return min(found, key=lambda w: (abs(w - REGIME_WINDOW), -w)) if found else None


def regime_columns(shifts: dict[str, tuple[float, ...]]) -> tuple[str, str]:
    """The two columns regime shifts read (rolling std, level); known when forecasting."""
    window = shifts.get("window", ())
    return f"f_u_std_w{int(window[0]) if window else REGIME_WINDOW}", "level"


def regime_values(std: np.ndarray, level: np.ndarray) -> np.ndarray:
    """Each row's regime value: ``log(std / level)``, the series' recent volatility relative
    to its level (NaN where either is missing or not positive)."""
    std = np.asarray(std, dtype=np.float64)
    level = np.asarray(level, dtype=np.float64)
    ok = np.isfinite(std) & np.isfinite(level) & (std > 0) & (level > 0)
    out = np.full(std.shape, np.nan)
    out[ok] = np.log(std[ok] / level[ok])
    return out


def frame_regimes(frame: object, window: int | None) -> np.ndarray:
    """:func:`regime_values` of a features frame's rows from its ``f_u_std_w<window>`` and
    ``level`` columns (all NaN without them)."""
    cols = getattr(frame, "columns", [])
    std_col = f"f_u_std_w{window}"
    if window is None or std_col not in cols or "level" not in cols:
        return np.full(len(frame), np.nan)  # type: ignore[arg-type]
    return regime_values(frame[std_col].to_numpy(dtype=np.float64),  # type: ignore[index]
                         frame["level"].to_numpy(dtype=np.float64))  # type: ignore[index]


def regime_ids(shifts: dict[str, tuple[float, ...]], values: np.ndarray) -> np.ndarray:
    """Group of each row under regime shifts: its volatility bin ``0..len(edges)``, and
    ``len(edges) + 1`` where the value is unknown (NaN: the pooled shifts apply unless the
    calibration rows had enough such rows)."""
    edges = np.asarray(shifts["edges"], dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    known = np.isfinite(values)
    return np.where(known, np.digitize(np.where(known, values, 0.0), edges), len(edges) + 1)


def regime_shifts(lo: np.ndarray, hi: np.ndarray, y: np.ndarray, values: np.ndarray,
                  coverage: float = 0.8, bins: int = REGIME_BINS, window: int | None = None
                  ) -> dict[str, tuple[float, ...]]:
    """Mondrian shifts by volatility regime: ``"all"`` (pooled), ``"edges"`` (the bin edges,
    quantiles of the calibration rows' regime ``values``, :func:`frame_regimes` of
    ``window``; fewer bins when there are too few rows for each to hold
    :data:`MIN_GROUP_ROWS`), ``"window"`` (``(window,)``, or ``()`` for None) and one
    ``(lo, hi)`` per group with enough rows (:func:`regime_ids`)."""
    ok = np.isfinite(lo) & np.isfinite(hi) & np.isfinite(y)
    known = ok & np.isfinite(values)
    n_bins = max(1, min(bins, int(known.sum()) // MIN_GROUP_ROWS))
    edges = np.quantile(values[known], np.linspace(0, 1, n_bins + 1)[1:-1]) \
        if n_bins > 1 else np.zeros(0)
    out: dict[str, tuple[float, ...]] = {"all": conformal_shifts(lo, hi, y, coverage),
                                         "edges": tuple(float(e) for e in np.unique(edges)),
                                         "window": () if window is None else (float(window),)}
    ids = regime_ids(out, values)
    for g in np.unique(ids[ok]):
        sel = ok & (ids == g)
        if sel.sum() >= MIN_GROUP_ROWS:
            out[str(int(g))] = conformal_shifts(lo[sel], hi[sel], y[sel], coverage)
    return out


def row_groups(shifts: dict[str, tuple[float, ...]], frame: object) -> np.ndarray:
    """The group of each of ``frame``'s rows under ``shifts`` (one horizon's): regime groups
    where the shifts hold ``"edges"`` (:func:`regime_shifts`), else the token groups of
    :func:`calibration_groups` (models fitted before)."""
    if "edges" in shifts:
        window = shifts.get("window", ())
        return regime_ids(shifts, frame_regimes(frame, int(window[0]) if window else None))
    return calibration_groups(frame)


def matrix_groups(shifts: dict[str, tuple[float, ...]], tokens: np.ndarray, std: np.ndarray,
                  level: np.ndarray) -> np.ndarray:
    """:func:`row_groups` from plain columns (a model's matrix fast path): ``tokens`` the
    ``f_tokens_ratio`` column, ``std`` and ``level`` the :func:`regime_columns`."""
    if "edges" in shifts:
        return regime_ids(shifts, regime_values(std, level))
    return np.isfinite(np.asarray(tokens, dtype=np.float64)).astype(np.int64)


def apply_grouped(q: np.ndarray, shifts: dict[str, tuple[float, ...]], groups: np.ndarray,
                  mode: str = "shift") -> np.ndarray:
    """:func:`apply_shifts` with each row's group shifts (pooled ones for unknown groups).

    ``mode="shift"`` (models saved before): a bound that would cross the median is clipped to
    it, which undoes part of a narrowing (and over-covers where the median is biased);
    ``mode="interval"`` (models fitted now): the calibrated bounds stay as they are and the
    median is clipped into them instead (bounds that would cross meet at their middle), so the
    interval covers what the calibration runs say.
    """
    out = np.array(q, dtype=np.float64, copy=True)
    if not len(groups):
        return apply_bounds(out, None, None, mode)
    lo, hi = group_bounds(shifts, int(groups.max()) + 1)
    return apply_bounds(out, lo[groups], hi[groups], mode)


def group_bounds(shifts: dict[str, tuple[float, ...]], n_groups: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """``(lo, hi)`` shifts of groups ``0..n_groups-1`` (the pooled ``"all"`` ones for a group
    without its own)."""
    pairs = [shifts.get(str(g), shifts["all"]) for g in range(n_groups)]
    return np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])


def apply_bounds(out: np.ndarray, lo: np.ndarray | None, hi: np.ndarray | None,
                 mode: str = "shift") -> np.ndarray:
    """:func:`apply_grouped` in place on sorted quantiles ``out`` ``(..., 3)`` (any leading
    shape), ``lo`` and ``hi`` the shifts of each row (shaped like ``out[..., 0]``; None: no
    shift); returns ``out``. Element by element, so a stack of horizons at once gives the
    numbers one call per horizon gives."""
    if lo is not None:
        out[..., 0] -= lo
        out[..., 2] += hi
    p10, p50, p90 = out[..., 0], out[..., 1], out[..., 2]  # views into out
    if mode == "interval":
        middle = (p10 + p90) / 2
        crossed = p10 > p90
        p10[crossed] = p90[crossed] = middle[crossed]
        out[..., 1] = np.clip(p50, p10, p90)
        return out
    out[..., 0] = np.minimum(p10, p50)
    out[..., 2] = np.maximum(p90, p50)
    return out


class AdaptiveConformal:
    """Adaptive conformal inference online (Gibbs & Candes 2021), on the interval's scale.

    Per horizon ``h`` it keeps a log scale factor ``theta_h`` (start 0: the model's own
    interval) and, each time the target of an interval it issued is observed, updates
    ``theta_h += gamma x (miss - (1 - coverage))`` (``miss``: the share of ranks whose value
    fell outside): a miss widens the next intervals, a hit narrows them, and the long-run miss
    rate is driven to ``1 - coverage`` whatever the model's calibration on the run at hand
    (ACI's update applied to the score quantile, as in conformal quantile tracking,
    Angelopoulos et al. 2023). Intervals are rescaled around the median in log space by
    ``exp(theta_h)``; ``theta_h`` stays within ``[-3, 3]``. ``gamma`` is the step: at the
    default 0.02 and 80% coverage, a miss by every rank widens that horizon's next intervals
    by about 1.6% and a hit narrows them by 0.4%. With ``gamma_start`` above it the step
    decays per horizon (:meth:`step`), as in online conformal prediction with decaying step
    sizes (Angelopoulos et al. 2024): ``gamma_start`` on a run's first update, falling
    exponentially (scale ``decay`` updates) to ``gamma``, which moves a badly calibrated
    interval within the first hundred or so steps (the policy layer serves intervals that way:
    :data:`bubblecast.policy.speeds.SERVED_ACI`). An issued interval whose target is ``keep`` steps
    past the newest origin without being observed is dropped. The state does not grow with the
    run: per horizon a scale, a count of scored intervals and the sum of their misses
    (``scored``, ``miss_sum``), and the intervals issued but not yet scored.

    Use: :meth:`adjust` the ``(H, P, 3)`` forecast made at origin ``t`` (step index) for
    ``horizons``, then :meth:`observe` the ``(T, P)`` history at later origins; origins must
    increase (a call at an earlier one, e.g. a backtest, is passed through unrecorded).
    """

    def __init__(self, coverage: float = 0.8, gamma: float = 0.02,
                 gamma_start: float | None = None, decay: float = 60.0, keep: int = 64) -> None:
        if not 0.0 < coverage < 1.0 or not gamma > 0:
            raise ValueError(f"ACI: coverage in (0, 1) and gamma > 0, got {coverage}, {gamma}")
        gamma_start = gamma if gamma_start is None else gamma_start
        if not gamma_start >= gamma or not decay > 0:
            raise ValueError(f"ACI: gamma_start >= gamma and decay > 0, got {gamma_start}, "
                             f"{decay}")
        self.coverage = coverage
        self.gamma = gamma
        self.gamma_start = gamma_start
        self.decay = decay
        self.keep = keep
        self.log_scale: dict[int, float] = {}
        # per horizon, the intervals issued and not yet scored, oldest origin first:
        # (origin, (P, 2) lo, hi)
        self._pending: dict[int, deque[tuple[int, np.ndarray]]] = {}
        self.last_origin: int | None = None
        # per horizon: intervals scored and the sum of their miss shares (constant memory
        # over a run of any length: the service keeps one of these per run)
        self.scored: dict[int, int] = {}
        self.miss_sum: dict[int, float] = {}

    def adjust(self, q: np.ndarray, horizons: np.ndarray | list[int], origin: int
               ) -> np.ndarray:
        """``q`` ``(H, P, 3)`` (positive values) with each horizon's interval rescaled; the
        result is recorded for :meth:`observe` when ``origin`` is a new, later one."""
        q = np.asarray(q, dtype=np.float64)
        logs = np.log(np.maximum(q, 1e-300))
        hz = [int(x) for x in horizons]
        # exp of every horizon's scale at once (numpy's exp gives each element its own bits)
        k = np.exp(np.array([self.log_scale.get(h, 0.0) for h in hz], dtype=np.float64))[:, None]
        out = logs.copy()
        mid = logs[:, :, 1]
        out[:, :, 0] = mid - k * (mid - logs[:, :, 0])
        out[:, :, 2] = mid + k * (logs[:, :, 2] - mid)
        result = np.exp(out)
        if self.last_origin is None or origin > self.last_origin:
            self.last_origin = int(origin)
            bounds = result[:, :, ::2].copy()
            for h, j in {h: j for j, h in enumerate(hz)}.items():  # a repeated h: its last
                self._pending.setdefault(h, deque()).append((int(origin), bounds[j]))
            oldest = origin - self.keep  # targets this far back were never observed
            for h, queue in self._pending.items():
                while queue and queue[0][0] + h < oldest:
                    queue.popleft()
        return result

    def observe(self, history: np.ndarray, now: int) -> None:
        """Score every issued interval whose target step (``origin + h`` <= ``now``, the
        index of ``history``'s last row) is now observed, and update the scales (each
        horizon's in the order of its origins)."""
        hist = np.asarray(history, dtype=np.float64)
        offset = now - (len(hist) - 1)
        rows: list[int] = []
        bounds: list[np.ndarray] = []
        owners: list[int] = []  # each scored interval's horizon, its origins in order
        ranks: list[int] = []  # and its number among its horizon's updates (for its step)
        for h, queue in self._pending.items():
            rank = self.scored.get(h, 0)
            while queue and queue[0][0] + h <= now:
                origin, b = queue.popleft()
                if origin + h - offset >= 0:  # else its target is before the history
                    rows.append(origin + h - offset)
                    bounds.append(b)
                    owners.append(h)
                    ranks.append(rank)
                    rank += 1
        if not rows:
            return
        y, b = hist[rows], np.stack(bounds)
        misses = np.mean((y < b[:, :, 0]) | (y > b[:, :, 1]), axis=1).tolist()
        steps = self._steps(np.asarray(ranks, dtype=np.int64)).tolist()
        target = 1.0 - self.coverage
        for h, miss, step in zip(owners, misses, steps, strict=True):
            theta = self.log_scale.get(h, 0.0) + step * (miss - target)
            self.log_scale[h] = float(min(max(theta, -3.0), 3.0))
            self.scored[h] = self.scored.get(h, 0) + 1
            self.miss_sum[h] = self.miss_sum.get(h, 0.0) + miss

    def pending(self) -> int:
        """How many issued intervals wait for their target step."""
        return sum(len(queue) for queue in self._pending.values())

    def step(self, scored: int) -> float:
        """The step of a horizon's update after ``scored`` earlier ones: ``gamma_start``
        decaying exponentially (scale ``decay`` updates) to ``gamma``."""
        return float(self._steps(np.array([scored], dtype=np.int64))[0])

    def _steps(self, scored: np.ndarray) -> np.ndarray:
        """:meth:`step` of each count in ``scored`` (numpy's exp gives an array's elements
        the bits it gives each alone)."""
        return self.gamma + (self.gamma_start - self.gamma) * np.exp(-scored / self.decay)

    def coverage_by_horizon(self) -> dict[int, float]:
        """Realised coverage of the intervals scored so far, per horizon."""
        return {h: 1.0 - self.miss_sum[h] / n for h, n in self.scored.items() if n}
