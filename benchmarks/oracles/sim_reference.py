"""Reference timing: a plain per-op Python event loop, the yardstick for the vectorised engine.

Each rank works through its lane in order; an op starts once its rank has finished the
previous op and every dependency has ended and paid its lag x ``comm``. Completions are
processed from a heap in time order, one op at a time, with no numpy and no notion of levels,
so it shares no algorithm with :mod:`bubblecast.sim.engine`. Slow by design; tests and
``benchmarks/bench_engine.py`` compare the engine against it.
"""

from __future__ import annotations

import heapq

import numpy as np

from bubblecast.sim.engine import OpGraph


def simulate_reference(graph: OpGraph, durations: np.ndarray, comm: float | np.ndarray = 0.0,
                       origin: float | np.ndarray = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Same contract as :func:`bubblecast.sim.engine.simulate`, one row and one op at a time."""
    durations = np.atleast_2d(np.asarray(durations, dtype=np.float64))
    batch, n = durations.shape
    if n != graph.n_ops:
        raise ValueError(f"durations have {n} ops, the graph {graph.n_ops}")
    comms = np.broadcast_to(np.asarray(comm, dtype=np.float64), (batch,)).tolist()
    origins = np.broadcast_to(np.asarray(origin, dtype=np.float64), (batch,)).tolist()
    prev = graph.prev.tolist()
    # Successors of each op: (dst, lag multiplier); the lane successor pays no lag.
    succ: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    waits = [0] * n
    for i, p in enumerate(prev):
        if p >= 0:
            succ[p].append((i, 0.0))
            waits[i] += 1
    for (s, d), lag in zip(graph.deps.tolist(), graph.dep_lag.tolist(), strict=True):
        succ[s].append((d, lag))
        waits[d] += 1
    start = np.empty((batch, n))
    end = np.empty((batch, n))
    for row in range(batch):
        dur = durations[row].tolist()
        c, o = comms[row], origins[row]
        remaining = list(waits)
        ready = [o] * n
        heap: list[tuple[float, int]] = []
        for i in range(n):
            if remaining[i] == 0:
                heapq.heappush(heap, (o + dur[i], i))
                start[row, i] = o
        done = 0
        while heap:
            t, i = heapq.heappop(heap)
            end[row, i] = t
            done += 1
            for d, lag in succ[i]:
                arrive = t + lag * c if lag else t
                if arrive > ready[d]:
                    ready[d] = arrive
                remaining[d] -= 1
                if remaining[d] == 0:
                    start[row, d] = ready[d]
                    heapq.heappush(heap, (ready[d] + dur[d], d))
        if done != n:
            raise ValueError("OpGraph: the dependencies form a cycle (a deadlocked schedule)")
    return start, end
