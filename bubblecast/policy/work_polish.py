"""Local search on one replica's packed micro-batches: single-document moves, each round the
best of all of them, timed by the pipeline's own step time.

The planner's packing and candidate orders (:mod:`bubblecast.policy.work_plan`) reason about a
replica's time through a proxy (sum of loads plus the fill and drain of its heaviest or end
micro-batches). The true step of a 1F1B-like pipeline also waits inside the schedule: a
heavy micro-batch in the middle stalls the next stage's forward. :func:`polish` closes part of
that gap: it moves one document at a time to another micro-batch of the same replica (within
the token budget, never emptying a micro-batch), scoring every such move at once with the
caller's timer (the planner passes :mod:`bubblecast.sim.steptime` at the replica's speeds), and
keeps the best move while it shortens the step. Every document stays placed exactly once.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

#: Relative improvement below which a move is not taken (ties and float noise).
MIN_GAIN = 1e-9


def polish(slot: np.ndarray, lengths: np.ndarray, doc_cost: np.ndarray, microbatches: int,
           budget: int, fixed: float, timer: Callable[[np.ndarray], np.ndarray],
           rounds: int) -> tuple[np.ndarray, float]:
    """Improve one replica's packing by single-document moves.

    ``slot``: each document's micro-batch (run order, ``0..microbatches-1``; every
    micro-batch holds at least one document); ``lengths`` and ``doc_cost``: each document's
    tokens and additive cost; ``fixed``: the cost of a non-empty micro-batch beyond its
    documents'; ``timer``: step seconds of ``K`` rows of micro-batch costs ``(K,
    microbatches)``. At most ``rounds`` moves. Returns the new slots (a copy) and the step
    time of the result (the input's when no move helps)."""
    slot = np.asarray(slot, dtype=np.int64).copy()
    x = np.asarray(lengths, dtype=np.int64)
    a = np.asarray(doc_cost, dtype=np.float64)
    m = int(microbatches)
    tokens = np.bincount(slot, x, m)
    load = np.bincount(slot, a, m) + fixed
    count = np.bincount(slot, None, m)
    now = float(timer(load[None, :])[0])
    n = len(x)
    doc = np.repeat(np.arange(n), m)
    to = np.tile(np.arange(m), n)
    for _ in range(rounds):
        src = slot[doc]
        ok = (to != src) & (tokens[to] + x[doc] <= budget) & (count[src] > 1)
        d, j, s = doc[ok], to[ok], src[ok]
        if not len(d):
            break
        rows = np.repeat(load[None, :], len(d), axis=0)
        k = np.arange(len(d))
        rows[k, s] -= a[d]
        rows[k, j] += a[d]
        times = timer(rows)
        best = int(np.argmin(times))
        if not times[best] < now * (1.0 - MIN_GAIN):
            break
        dd, jj, ss = int(d[best]), int(j[best]), int(s[best])
        tokens[ss] -= x[dd]
        tokens[jj] += x[dd]
        load[ss] -= a[dd]
        load[jj] += a[dd]
        count[ss] -= 1
        count[jj] += 1
        slot[dd] = jj
        now = float(times[best])
    return slot, now
