"""Split conformal calibration of quantile intervals (conformalised quantile regression).

On held-out runs, the lower and upper quantile forecasts are shifted so that, with the usual
finite-sample correction, at most ``(1 - coverage) / 2`` of the held-out targets fall below the
lower and above the upper bound: the p10-p90 interval then covers ``coverage`` of new runs drawn
like the calibration runs. Works in whatever space the model predicts (here log(y / level)).
"""

from __future__ import annotations

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


def apply_grouped(q: np.ndarray, shifts: dict[str, tuple[float, float]], groups: np.ndarray
                  ) -> np.ndarray:
    """:func:`apply_shifts` with each row's group shifts (pooled ones for unknown groups)."""
    lo = np.array([shifts.get(str(int(g)), shifts["all"])[0] for g in range(groups.max() + 1)]) \
        if len(groups) else np.zeros(0)
    hi = np.array([shifts.get(str(int(g)), shifts["all"])[1] for g in range(groups.max() + 1)]) \
        if len(groups) else np.zeros(0)
    out = np.array(q, dtype=np.float64, copy=True)
    if len(groups):
        out[:, 0] -= lo[groups]
        out[:, 2] += hi[groups]
    out[:, 0] = np.minimum(out[:, 0], out[:, 1])
    out[:, 2] = np.maximum(out[:, 2], out[:, 1])
    return out
