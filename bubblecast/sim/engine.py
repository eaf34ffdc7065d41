"""Vectorised timing engine: start and end times of every op of a dependency graph.

The graph is fixed (op order per rank and cross-rank dependencies); durations come as a
``(batch, ops)`` matrix, one row per (step, replica) that shares the graph. Each op starts at
the latest of: the end of the previous op on its rank, and the end of each dependency plus its
lag (the SPEC §2 communication time). The loop runs over topological levels of the graph and
is vectorised across every op of a level and every row of the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class OpGraph:
    """A pipeline step as a DAG.

    ``rank[i]`` is the lane of op ``i``; ``prev[i]`` the op before it on that lane (-1 if none);
    ``deps`` lists ``(src, dst)`` cross-lane dependencies (dst waits for src's end plus the
    lag); ``dep_lag[k]`` is 1 where dependency ``k`` pays the communication time, else 0.
    """

    rank: np.ndarray
    prev: np.ndarray
    deps: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), dtype=np.int64))
    dep_lag: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float64))

    def __post_init__(self) -> None:
        self.rank = np.asarray(self.rank, dtype=np.int64)
        self.prev = np.asarray(self.prev, dtype=np.int64)
        self.deps = np.asarray(self.deps, dtype=np.int64).reshape(-1, 2)
        if self.dep_lag.size == 0 and len(self.deps):
            self.dep_lag = np.ones(len(self.deps))
        self.dep_lag = np.asarray(self.dep_lag, dtype=np.float64)
        n = len(self.rank)
        if self.prev.shape != (n,):
            raise ValueError("OpGraph: prev must have one entry per op")
        if len(self.dep_lag) != len(self.deps):
            raise ValueError("OpGraph: dep_lag must have one entry per dependency")
        if n and (self.deps.size and (self.deps.min() < 0 or self.deps.max() >= n)):
            raise ValueError("OpGraph: dependency index out of range")

    @property
    def n_ops(self) -> int:
        return len(self.rank)

    def levels(self) -> list[np.ndarray]:
        """Ops grouped by longest-path depth; raises ValueError on a cycle."""
        n = self.n_ops
        src = np.concatenate([self.prev[self.prev >= 0], self.deps[:, 0]])
        dst = np.concatenate([np.flatnonzero(self.prev >= 0), self.deps[:, 1]])
        indeg = np.bincount(dst, minlength=n)
        order = np.argsort(src, kind="stable")
        src_sorted, dst_sorted = src[order], dst[order]
        starts = np.searchsorted(src_sorted, np.arange(n + 1))
        depth = np.zeros(n, dtype=np.int64)
        frontier = np.flatnonzero(indeg == 0)
        levels, seen = [], 0
        while frontier.size:
            levels.append(frontier)
            seen += frontier.size
            nxt = np.concatenate([dst_sorted[starts[i]:starts[i + 1]] for i in frontier]) \
                if frontier.size else np.zeros(0, dtype=np.int64)
            np.subtract.at(indeg, nxt, 1)
            depth[nxt] = len(levels)
            frontier = np.unique(nxt[indeg[nxt] == 0])
        if seen != n:
            raise ValueError("OpGraph: the dependencies form a cycle (a deadlocked schedule)")
        return levels


def simulate(graph: OpGraph, durations: np.ndarray, comm: float | np.ndarray = 0.0,
             origin: np.ndarray | float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Start and end times, each ``(batch, ops)``, for ``durations`` of shape ``(batch, ops)``.

    ``comm`` is a scalar or a per-row ``(batch,)`` array of communication times; ``origin`` is
    the earliest start of every op (per row or scalar).
    """
    durations = np.atleast_2d(np.asarray(durations, dtype=np.float64))
    batch, n = durations.shape
    if n != graph.n_ops:
        raise ValueError(f"durations have {n} ops, the graph {graph.n_ops}")
    comm_col = np.broadcast_to(np.asarray(comm, dtype=np.float64), (batch,))[:, None]
    origin_col = np.broadcast_to(np.asarray(origin, dtype=np.float64), (batch,))[:, None]
    end = np.zeros((batch, n + 1))  # column n is a sentinel "no op" ending at -inf
    end[:, n] = -np.inf
    start = np.zeros((batch, n))
    prev = np.where(graph.prev >= 0, graph.prev, n)
    # Dependencies per destination, padded to the widest fan-in with the sentinel.
    if len(graph.deps):
        order = np.argsort(graph.deps[:, 1], kind="stable")
        d_src, d_dst, d_lag = graph.deps[order, 0], graph.deps[order, 1], graph.dep_lag[order]
        counts = np.bincount(d_dst, minlength=n)
        width = int(counts.max())
        slot = np.arange(len(d_dst)) - np.repeat(np.cumsum(counts) - counts, counts)
        dep_src = np.full((n, width), n, dtype=np.int64)
        dep_lag = np.zeros((n, width))
        dep_src[d_dst, slot] = d_src
        dep_lag[d_dst, slot] = d_lag
    else:
        dep_src = np.full((n, 0), n, dtype=np.int64)
        dep_lag = np.zeros((n, 0))
    for ops in graph.levels():
        ready = np.maximum(end[:, prev[ops]], origin_col)
        if dep_src.shape[1]:
            src = dep_src[ops]  # (k, width)
            arrive = end[:, src] + comm_col[:, :, None] * dep_lag[ops][None]
            ready = np.maximum(ready, arrive.max(axis=2))
        start[:, ops] = ready
        end[:, ops] = ready + durations[:, ops]
    return start, end[:, :n]
