"""Least-time paths over partitions: the oracle's over a run, the predictive policy's over a
forecast (moved out of :mod:`policies` for size)."""

from __future__ import annotations

import numpy as np


def viterbi(times: np.ndarray, migration: np.ndarray, start: int = 0) -> list[int]:
    """Least-total-time path over states: ``times`` is ``(K, T)`` step time of each state at
    each step; switching ``a -> b`` before step ``t`` adds ``migration[a, b]`` to step ``t``.
    Step 0 runs in state ``start``. Returns the state of every step."""
    k, T = times.shape
    total = np.full(k, np.inf)
    total[start] = times[start, 0]
    back = np.zeros((T, k), dtype=np.int64)
    back[0] = start
    for t in range(1, T):
        via = total[:, None] + migration  # (from, to)
        frm = np.argmin(via, axis=0)
        total = via[frm, np.arange(k)] + times[:, t]
        back[t] = frm
    path = [int(np.argmin(total))]
    for t in range(T - 1, 0, -1):
        path.append(int(back[t, path[-1]]))
    return path[::-1]


def first_move(step: np.ndarray, weight: np.ndarray, grid: np.ndarray,
               migration: np.ndarray) -> tuple[int, int]:
    """Where and when a forecast's least-time path goes: ``step`` is ``(K, H)`` predicted
    step seconds of each option (0 the current) at each horizon ``grid`` point, each standing
    for ``weight`` steps; ``migration`` ``(K, K)`` the seconds of each move. Returns the option
    the path runs first (0: stay for now) and the step (1: the next) at which it first leaves
    option 0 (0: it never does)."""
    k = step.shape[0]
    times = np.concatenate([np.zeros((k, 1)), step * weight[None, :]], axis=1)
    path = viterbi(times, migration, start=0)[1:]  # the option of each grid point's steps
    moved = next((i for i, o in enumerate(path) if o != 0), None)
    later = 0 if moved is None else int(grid[moved] - weight[moved]) + 1
    return int(path[0]), later
