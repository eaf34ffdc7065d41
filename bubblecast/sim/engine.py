"""Vectorised timing engine: start and end times of every op of a dependency graph.

The graph is fixed (op order per rank and cross-rank dependencies); durations come as a
``(batch, ops)`` matrix, one row per (step, replica) that shares the graph. Each op starts at
the latest of: the end of the previous op on its rank, and the end of each dependency plus its
lag (the SPEC §2 communication time). The loop runs over topological levels of the graph and
is vectorised across every op of a level and every row of the batch.

Internally ops are renumbered in level order and rows processed in cache-sized blocks held
op-major (``(ops, rows)``): a level gathers the end (or end + lag x comm) rows of its
predecessors, takes their maximum, writes one contiguous slice and copies its start and end
rows to the results (in the caller's op order) while they are in cache; no per-op arithmetic
on arrivals. A C-ordered ``(batch, ops)`` input is transposed and reordered in small tiles.
The per-graph preparation (levels, renumbering, padded fan-in) is cached on the graph, so
calling :func:`simulate` repeatedly with one graph pays it once.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

_WORKSPACE = threading.local()


def _buffer(name: str, shape: tuple[int, int]) -> np.ndarray:
    """A reusable per-thread scratch array (fresh large arrays cost page faults on every
    call); it grows to the largest block seen, at most a few ``BLOCK_CELLS`` x 8 bytes."""
    size = shape[0] * shape[1]
    buf = getattr(_WORKSPACE, name, None)
    if buf is None or buf.size < size:
        buf = np.empty(max(size, 1))
        setattr(_WORKSPACE, name, buf)
    return buf[:size].reshape(shape)


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` of a 1-d array without NaN, by a sort: ``np.unique`` asks
    ``np.ma.is_masked`` first, and importing ``numpy.ma`` costs ~0.01 s of a command."""
    ordered = np.sort(values)
    if ordered.size < 2:
        return ordered
    keep = np.empty(ordered.size, dtype=bool)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]


@dataclass
class _Level:
    """One topological level: positions ``[lo, hi)`` and, per op, the rows of ``E`` whose
    maximum is its start (lane predecessor or origin first, then dependency arrivals)."""

    lo: int
    hi: int
    preds: np.ndarray  # (k, width) row indices into E
    ops: np.ndarray  # (k,) the level's ops in the graph's numbering


@dataclass
class _Plan:
    """Ops renumbered in level order. The engine's working array ``E`` holds, op-major, the
    end times (rows ``0..n-1``), then for each distinct nonzero lag ``l`` the arrival times
    ``end + l * comm`` (``n`` rows each), then one row with the origin."""

    order: np.ndarray  # position -> op
    lags: np.ndarray  # distinct nonzero lag multipliers
    levels: list[_Level]
    _no_comm: list[np.ndarray] | None = field(default=None, repr=False)

    @property
    def origin_row(self) -> int:
        return (len(self.lags) + 1) * len(self.order)

    def no_comm_preds(self) -> list[np.ndarray]:
        """Each level's ``preds`` for a communication time of 0, where every arrival is its
        source's end (``end + lag x 0`` is ``end`` exactly: ends are never -0.0): rows into
        an ``E`` of the ``n`` end rows and the origin (row ``n``), no arrival rows."""
        if self._no_comm is None:
            n = len(self.order)
            self._no_comm = [np.where(lv.preds == self.origin_row, n, lv.preds % n)
                             for lv in self.levels]
        return self._no_comm


@dataclass
class OpGraph:
    """A pipeline step as a DAG.

    ``rank[i]`` is the lane of op ``i``; ``prev[i]`` the op before it on that lane (-1 if none);
    ``deps`` lists ``(src, dst)`` cross-lane dependencies (dst waits for src's end plus the
    lag); ``dep_lag[k]`` is 1 where dependency ``k`` pays the communication time, else 0
    (any other value multiplies the communication time).
    """

    rank: np.ndarray
    prev: np.ndarray
    deps: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), dtype=np.int64))
    dep_lag: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float64))
    _plan: _Plan | None = field(default=None, init=False, repr=False, compare=False)
    _levels: list[np.ndarray] | None = field(default=None, init=False, repr=False,
                                             compare=False)

    def __post_init__(self) -> None:
        self.rank = np.asarray(self.rank, dtype=np.int64)
        self.prev = np.asarray(self.prev, dtype=np.int64)
        self.deps = np.asarray(self.deps, dtype=np.int64).reshape(-1, 2)
        self.dep_lag = np.asarray(self.dep_lag, dtype=np.float64).reshape(-1)
        if self.dep_lag.size == 0 and len(self.deps):
            self.dep_lag = np.ones(len(self.deps))
        n = len(self.rank)
        if self.prev.shape != (n,):
            raise ValueError("OpGraph: prev must have one entry per op")
        if len(self.dep_lag) != len(self.deps):
            raise ValueError("OpGraph: dep_lag must have one entry per dependency")
        if n and (self.deps.size and (self.deps.min() < 0 or self.deps.max() >= n)):
            raise ValueError("OpGraph: dependency index out of range")
        if n and (self.prev.min() < -1 or self.prev.max() >= n):
            raise ValueError("OpGraph: prev index out of range")
        if (self.dep_lag < 0).any() or not np.isfinite(self.dep_lag).all():
            raise ValueError("OpGraph: dep_lag must be finite and >= 0")

    @property
    def n_ops(self) -> int:
        return len(self.rank)

    def levels(self) -> list[np.ndarray]:
        """Ops grouped by longest-path depth (computed once per graph; the arrays are shared,
        not to be modified); raises ValueError on a cycle."""
        if self._levels is None:
            self._levels = self._find_levels()
        return self._levels

    def _find_levels(self) -> list[np.ndarray]:
        n = self.n_ops
        has_prev = self.prev >= 0
        src = np.concatenate([self.prev[has_prev], self.deps[:, 0]])
        dst = np.concatenate([np.flatnonzero(has_prev), self.deps[:, 1]])
        indeg = np.bincount(dst, minlength=n)
        order = np.argsort(src, kind="stable")
        dst_sorted = dst[order]
        bounds = np.searchsorted(src[order], np.arange(n + 1))
        levels, seen = [], 0
        frontier = np.flatnonzero(indeg == 0)
        while frontier.size:
            levels.append(frontier)
            seen += frontier.size
            lo, hi = bounds[frontier], bounds[frontier + 1]
            lengths = hi - lo
            total = int(lengths.sum())
            if total == 0:
                break
            # Concatenate the CSR slices [lo, hi) of every frontier op without a Python loop.
            offsets = np.repeat(lo - np.cumsum(lengths) + lengths, lengths)
            nxt = dst_sorted[offsets + np.arange(total)]
            np.subtract.at(indeg, nxt, 1)
            cand = sorted_unique(nxt)
            frontier = cand[indeg[cand] == 0]
        if seen != n:
            raise ValueError("OpGraph: the dependencies form a cycle (a deadlocked schedule)")
        return levels

    def plan(self) -> _Plan:
        """The cached level plan the engine runs (built on first use)."""
        if self._plan is None:
            self._plan = _build_plan(self)
        return self._plan


def _build_plan(graph: OpGraph) -> _Plan:
    n = graph.n_ops
    levels = graph.levels()
    order = np.concatenate(levels) if levels else np.zeros(0, dtype=np.int64)
    inv = np.empty(n, dtype=np.int64)
    inv[order] = np.arange(n)
    lags = sorted_unique(graph.dep_lag[graph.dep_lag != 0])
    origin = (len(lags) + 1) * n
    first = np.where(graph.prev >= 0, inv[np.maximum(graph.prev, 0)], origin)  # by op
    # Each dependency as a row of E: its source's end, or its arrival for a nonzero lag.
    block = np.searchsorted(lags, graph.dep_lag) + 1
    block[graph.dep_lag == 0] = 0
    dep_row = block * n + inv[graph.deps[:, 0]]
    dst_pos = inv[graph.deps[:, 1]]
    srt = np.argsort(dst_pos, kind="stable")
    dst_pos, dep_row = dst_pos[srt], dep_row[srt]
    counts = np.bincount(dst_pos, minlength=n)
    width = int(counts.max()) + 1 if len(dst_pos) else 1
    preds = np.repeat(first[order][:, None], width, axis=1)  # padding repeats column 0
    slot = np.arange(len(dst_pos)) - np.repeat(np.cumsum(counts) - counts, counts) + 1
    preds[dst_pos, slot] = dep_row
    out, lo = [], 0
    for ops in levels:
        hi = lo + len(ops)
        w = int(counts[lo:hi].max()) + 1
        out.append(_Level(lo, hi, np.ascontiguousarray(preds[lo:hi, :w]), order[lo:hi]))
        lo = hi
    return _Plan(order, lags, out)


#: Rows are timed in blocks of about this many (row, op) cells, so that a block's op-major
#: working arrays stay small (a few MB: the first touch of fresh memory costs as much as the
#: arithmetic); tuned on 8-stage, 16- and 32-microbatch schedules (5,000-20,000 rows).
BLOCK_CELLS = 1 << 18


def simulate(graph: OpGraph, durations: np.ndarray, comm: float | np.ndarray = 0.0,
             origin: np.ndarray | float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Start and end times, each ``(batch, ops)``, for ``durations`` of shape ``(batch, ops)``.

    ``comm`` is a scalar or a per-row ``(batch,)`` array of communication times; ``origin`` is
    the earliest start of every op (per row or scalar). Durations and comm must be >= 0.
    The results are transposed views of op-major arrays (Fortran-ordered); a Fortran-ordered
    ``durations`` (e.g. ``x.T`` of an ``(ops, batch)`` array) skips one transposition.
    """
    durations = np.atleast_2d(np.asarray(durations, dtype=np.float64))
    batch, n = durations.shape
    if n != graph.n_ops:
        raise ValueError(f"durations have {n} ops, the graph {graph.n_ops}")
    comm_row = np.ascontiguousarray(np.broadcast_to(np.asarray(comm, dtype=np.float64), (batch,)))
    origin_row = np.ascontiguousarray(
        np.broadcast_to(np.asarray(origin, dtype=np.float64), (batch,)))
    if durations.size and (durations.min() < 0 or comm_row.min() < 0):
        raise ValueError("durations and comm must be >= 0")
    plan = graph.plan()
    op_major = durations.T if durations.T.flags.c_contiguous else None
    # One allocation for both results: at >= 4 MB numpy asks for transparent huge pages, and
    # the first write into fresh memory then costs far fewer page faults than two separate
    # arrays would.
    start, end = np.empty((2, n, batch))
    block = max(16, BLOCK_CELLS // max(n, 1))
    for lo in range(0, batch, block):
        hi = min(batch, lo + block)
        if op_major is not None:
            dur = np.take(op_major[:, lo:hi], plan.order, axis=0, mode="clip",
                          out=_buffer("dur", (n, hi - lo)))
        else:
            dur = _buffer("dur", (n, hi - lo))
            _transpose_into(dur, durations[lo:hi], plan.order)
        _run_block(plan, dur, comm_row[lo:hi], origin_row[lo:hi], start[:, lo:hi], end[:, lo:hi])
    return start.T, end.T


def simulate_rows(graph: OpGraph, durations: np.ndarray, comm: float = 0.0,
                  dur_rows: np.ndarray | None = None, *, row_major: bool = False) -> np.ndarray:
    """Start times as a C-ordered ``(batch, ops)`` array from op-major ``(ops, batch)``
    durations (``row_major``: C-ordered ``(batch, ops)`` ones, the events table's order):
    filled block by block while each block is in cache (no full-size ``end`` array, no
    full-size transposition). With ``dur_rows`` (``(batch, ops)``, C-ordered) op-major
    durations are copied there row-major too. Same times as :func:`simulate`
    (``simulate(graph, op_major.T, comm)[0]``)."""
    durations = np.asarray(durations, dtype=np.float64)
    if row_major:
        durations = np.ascontiguousarray(durations)
        if dur_rows is not None:
            raise ValueError("dur_rows: the durations are row-major already")
    batch, n = durations.shape if row_major else durations.shape[::-1]
    if n != graph.n_ops:
        raise ValueError(f"durations have {n} ops, the graph {graph.n_ops}")
    comm_row = np.full(batch, float(comm))
    if durations.size and (durations.min() < 0 or float(comm) < 0):
        raise ValueError("durations and comm must be >= 0")
    plan = graph.plan()
    out = np.empty((batch, n))
    block = max(16, BLOCK_CELLS // max(n, 1))
    pad = block + 8  # row stride off a power of two: the tiled transpositions stay in cache
    zero = np.zeros(block)
    no_comm = float(comm) == 0.0  # arrivals are ends: no arrival rows in E
    for lo in range(0, batch, block):
        hi = min(batch, lo + block)
        w = hi - lo
        if row_major:
            dur = _buffer("dur", (n, w))
            _transpose_into(dur, durations[lo:hi], plan.order)
        else:
            dur = np.take(durations[:, lo:hi], plan.order, axis=0, mode="clip",
                          out=_buffer("dur", (n, w)))
        start = _buffer("rows_start", (n, pad))[:, :w]
        _run_block(plan, dur, comm_row[lo:hi], zero[:w], start, None, no_comm=no_comm)
        for t in range(0, w, TRANSPOSE_TILE):
            u = min(w, t + TRANSPOSE_TILE)
            np.copyto(out[lo + t:lo + u], start[:, t:u].T)
            if dur_rows is not None:
                np.copyto(dur_rows[lo + t:lo + u], durations[:, lo + t:lo + u].T)
    return out


#: Rows per tile when transposing a C-ordered ``(rows, ops)`` block: a whole-array
#: ``copyto(dst, src.T)`` walks the source with a stride of ``ops`` x 8 bytes, which thrashes
#: the cache when that is a power of two.
TRANSPOSE_TILE = 64


def _transpose_into(dst: np.ndarray, src: np.ndarray, order: np.ndarray) -> None:
    """``dst[:] = src[:, order].T`` in tiles of :data:`TRANSPOSE_TILE` source rows (each tile
    is reordered while it is in cache, so the large arrays are crossed once)."""
    rows = src.shape[0]
    tile = _buffer("tile", (min(TRANSPOSE_TILE, rows), src.shape[1]))
    for lo in range(0, rows, TRANSPOSE_TILE):
        hi = min(rows, lo + TRANSPOSE_TILE)
        part = np.take(src[lo:hi], order, axis=1, mode="clip", out=tile[:hi - lo])
        np.copyto(dst[:, lo:hi], part.T)


def _run_block(plan: _Plan, dur: np.ndarray, comm_row: np.ndarray, origin_row: np.ndarray,
               start: np.ndarray, end: np.ndarray | None, *, no_comm: bool = False) -> None:
    """Fill op-major ``start`` and ``end`` (``(ops, rows)``, the graph's op order; ``end``
    None: not wanted) of one block from level-ordered op-major durations; each level's rows
    are written while in cache. ``no_comm``: ``comm_row`` is all 0, so ``E`` holds no arrival
    rows (:meth:`_Plan.no_comm_preds`), the same times."""
    n, rows = dur.shape
    if no_comm:
        shifts: list[np.ndarray] = []
        E = _buffer("E", (n + 1, rows))
        E[n] = origin_row
        all_preds = plan.no_comm_preds()
    else:
        shifts = [lag * comm_row for lag in plan.lags]
        E = _buffer("E", (plan.origin_row + 1, rows))
        E[plan.origin_row] = origin_row
        all_preds = [lv.preds for lv in plan.levels]
    for lv, preds in zip(plan.levels, all_preds, strict=True):
        lo, hi = lv.lo, lv.hi
        ready = E[preds[:, 0]]
        for c in range(1, preds.shape[1]):
            np.maximum(ready, E[preds[:, c]], out=ready)
        start[lv.ops] = ready
        np.add(ready, dur[lo:hi], out=E[lo:hi])
        if end is not None:
            end[lv.ops] = E[lo:hi]
        for j, shift in enumerate(shifts, 1):
            np.add(E[lo:hi], shift, out=E[j * n + lo:j * n + hi])
