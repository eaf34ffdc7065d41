"""The oracle's least-time path over partitions (moved out of :mod:`policies` for size)."""

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
