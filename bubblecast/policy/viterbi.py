"""Least-time paths over partitions: the oracle's over a run, the predictive policy's over a
forecast (moved out of :mod:`policies` for size)."""

from __future__ import annotations

import numpy as np


def viterbi(times: np.ndarray, migration: np.ndarray, start: int = 0,
            switch: np.ndarray | None = None) -> list[int]:
    """Least-total-time path over states: ``times`` is ``(K, T)`` step time of each state at
    each step; switching ``a -> b`` before step ``t`` adds ``migration[a, b]`` to step ``t``,
    where ``switch[t]`` allows it (default: at every step). Step 0 runs in state ``start``.
    Returns the state of every step."""
    k, T = times.shape
    total = np.full(k, np.inf)
    total[start] = times[start, 0]
    back = np.zeros((T, k), dtype=np.int64)
    back[0] = start
    stay = np.arange(k)
    for t in range(1, T):
        if switch is not None and not switch[t]:
            back[t] = stay
            total = total + times[:, t]
            continue
        via = total[:, None] + migration  # (from, to)
        frm = np.argmin(via, axis=0)
        total = via[frm, stay] + times[:, t]
        back[t] = frm
    path = [int(np.argmin(total))]
    for t in range(T - 1, 0, -1):
        path.append(int(back[t, path[-1]]))
    return path[::-1]


def first_move(step: np.ndarray, weight: np.ndarray, grid: np.ndarray,
               migration: np.ndarray, every: int = 1) -> tuple[int, int]:
    """Where and when a forecast's least-time path goes: ``step`` is ``(K, H)`` predicted
    step seconds of each option (0 the current) at each horizon ``grid`` point, each standing
    for ``weight`` steps (the steps counted: the first ``weight.sum()``); ``migration``
    ``(K, K)`` the seconds of each move. Step times are interpolated between the grid points
    to every step, and the path may change option only where a decision can act (steps 1,
    ``1 + every``, ...). Returns the option the path runs in the first ``every`` steps (0: stay
    for now) and the step (1: the next) at which it first leaves option 0 (0: it never does)."""
    n = int(round(float(np.sum(weight))))
    if n < 1:
        return 0, 0
    grid = np.asarray(grid, dtype=np.float64)
    hs = np.arange(1, n + 1, dtype=np.float64)
    times = np.array([np.interp(hs, grid, row) for row in np.asarray(step, dtype=np.float64)])
    times = np.concatenate([np.zeros((len(times), 1)), times], axis=1)  # step 0: now, no time
    switch = (np.arange(n + 1) - 1) % every == 0  # steps 1, 1 + every, ...
    path = viterbi(times, migration, start=0, switch=switch)[1:]
    moved = next((i for i, o in enumerate(path) if o != 0), None)
    return int(path[0]), 0 if moved is None else moved + 1
