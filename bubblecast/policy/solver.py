"""Exact contiguous partition of ``L`` layers over ``P`` pipeline stages.

Stage ``p`` holding layers ``[j, i)`` takes ``speed[p] * (fixed[p] + sum(costs[j:i]))`` (``speed``
is a time multiplier: 1 nominal, 2 twice as slow; ``fixed`` the stage's per-op cost that does not
move with the layers, in the same units as ``costs``, 0 by default: with it, moving layers off
a slow stage pays less than their cost says); with a memory model it must also fit
``sum(memory[j:i]) <= memory_cap[p]``. Every stage holds at least one layer.

:func:`min_bottleneck` finds the smallest achievable largest stage time by dynamic programming
over stages, vectorised over every (first layer, end layer) pair: ``O(P L^2)`` numpy work, about
a millisecond for ``L=128, P=16``. :func:`solve` then picks, among the partitions whose every
stage stays within a threshold (the optimum, or the optimum plus a slack), the one that
minimises a secondary additive cost: the weighted total ``sum_p speed[p] * load[p]`` (fast
stages take more) or the bytes that change owner against a current partition (fewest moves).
Ties are broken deterministically: the later stage takes more layers. :func:`candidates` lists
a handful of such partitions for a caller to score with the pipeline engine, where schedule
bubbles (not only the largest stage) decide.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bubblecast.errors import BubblecastError

Partition = tuple[int, ...]


@dataclass(frozen=True)
class PartitionProblem:
    """Inputs of the solver, validated: per-layer costs, per-stage speeds, optional memory and
    per-stage fixed costs (None: 0)."""

    costs: np.ndarray
    speeds: np.ndarray
    memory: np.ndarray | None = None
    memory_cap: np.ndarray | None = None
    fixed: np.ndarray | None = None

    def __post_init__(self) -> None:
        costs = np.asarray(self.costs, dtype=np.float64).ravel()
        speeds = np.asarray(self.speeds, dtype=np.float64).ravel()
        if costs.size == 0 or not np.all(np.isfinite(costs)) or np.any(costs < 0):
            raise BubblecastError("costs: need one finite, non-negative cost per layer")
        if speeds.size == 0 or not np.all(np.isfinite(speeds)) or np.any(speeds <= 0):
            raise BubblecastError("speeds: need one finite, positive speed factor per stage")
        if costs.size < speeds.size:
            raise BubblecastError(f"partition: {costs.size} layers cannot fill {speeds.size} "
                                  "stages (each stage needs >= 1 layer)")
        object.__setattr__(self, "costs", costs)
        object.__setattr__(self, "speeds", speeds)
        if self.fixed is not None:
            fixed = np.broadcast_to(np.asarray(self.fixed, dtype=np.float64).ravel(),
                                    speeds.shape).copy()
            if not np.all(np.isfinite(fixed)) or np.any(fixed < 0):
                raise BubblecastError("fixed: need one finite, non-negative cost per stage")
            object.__setattr__(self, "fixed", fixed)
        if (self.memory is None) != (self.memory_cap is None):
            raise BubblecastError("memory: give both per-layer memory and a memory cap, or neither")
        if self.memory is not None:
            mem = np.asarray(self.memory, dtype=np.float64).ravel()
            if mem.shape != costs.shape or np.any(mem < 0) or not np.all(np.isfinite(mem)):
                raise BubblecastError(f"memory: need {costs.size} finite, non-negative byte counts")
            cap = np.broadcast_to(np.asarray(self.memory_cap, dtype=np.float64), speeds.shape)
            if np.any(np.isnan(cap)):
                raise BubblecastError("memory_cap: NaN cap")
            object.__setattr__(self, "memory", mem)
            object.__setattr__(self, "memory_cap", cap.copy())

    @property
    def layers(self) -> int:
        return int(self.costs.size)

    @property
    def stages(self) -> int:
        return int(self.speeds.size)


class SolverTables:
    """Pairwise sums over layer ranges, shared by the dynamic programmes of one problem."""

    def __init__(self, prob: PartitionProblem) -> None:
        n = prob.layers + 1
        c = np.concatenate([[0.0], np.cumsum(prob.costs)])
        self.prob = prob
        self.work = c[None, :] - c[:, None]  # work[j, i] = sum(costs[j:i])
        self.valid = np.triu(np.ones((n, n), dtype=bool), 1)  # j < i: at least one layer
        self.mem = None
        if prob.memory is not None:
            m = np.concatenate([[0.0], np.cumsum(prob.memory)])
            self.mem = m[None, :] - m[:, None]
        self._time: dict[int, np.ndarray] = {}
        self._allowed: dict[int, np.ndarray] = {}
        self._moves: dict[tuple, list[np.ndarray]] = {}

    def stage_time(self, p: int) -> np.ndarray:
        out = self._time.get(p)
        if out is None:
            fixed = 0.0 if self.prob.fixed is None else float(self.prob.fixed[p])
            out = self._time[p] = self.prob.speeds[p] * (self.work + fixed)
        return out

    def allowed(self, p: int) -> np.ndarray:
        out = self._allowed.get(p)
        if out is None:
            out = self.valid
            if self.mem is not None:
                cap = self.prob.memory_cap[p]  # type: ignore[index]
                out = self.valid & (self.mem <= cap * (1 + 1e-12))
            self._allowed[p] = out
        return out

    def moves(self, current: Partition, move_bytes: np.ndarray | None) -> list[np.ndarray]:
        """Per stage ``p``: bytes of layers ``[j, i)`` not owned by ``p`` under ``current``."""
        key = (tuple(current), None if move_bytes is None else np.asarray(move_bytes).tobytes())
        out = self._moves.get(key)
        if out is None:
            layers = self.prob.layers
            owner = _owner(tuple(current), layers)
            if len(current) != self.prob.stages:
                owner = np.full(layers, -1)  # a different stage count: everything moves
            w = np.ones(layers) if move_bytes is None else np.asarray(move_bytes, float)
            out = []
            for p in range(self.prob.stages):
                d = np.concatenate([[0.0], np.cumsum(w * (owner != p))])
                out.append(d[None, :] - d[:, None])
            self._moves[key] = out
        return out


def _infeasible(prob: PartitionProblem) -> BubblecastError:
    if prob.memory is None:
        return BubblecastError(f"partition: no contiguous partition of {prob.layers} layers over "
                               f"{prob.stages} stages keeps every stage within the limit")
    biggest = float(prob.memory.max())
    return BubblecastError(
        f"memory_cap: no contiguous partition of {prob.layers} layers over {prob.stages} stages "
        f"fits the cap (largest layer {biggest:.4g} bytes, caps "
        f"{float(np.min(prob.memory_cap)):.4g}..{float(np.max(prob.memory_cap)):.4g} bytes, "
        f"total {float(prob.memory.sum()):.4g} bytes)")


def min_bottleneck(prob: PartitionProblem, tables: SolverTables | None = None) -> float:
    """The smallest achievable largest stage time; BubblecastError if nothing is feasible."""
    t = tables or SolverTables(prob)
    best = np.full(prob.layers + 1, np.inf)
    best[0] = 0.0  # zero stages cover zero layers
    for p in range(prob.stages):
        stage = np.where(t.allowed(p), t.stage_time(p), np.inf)
        best = np.maximum(best[:, None], stage).min(axis=0)
    if not np.isfinite(best[-1]):
        raise _infeasible(prob)
    return float(best[-1])


def _owner(partition: Partition, layers: int) -> np.ndarray:
    if sum(partition) != layers or any(n < 1 for n in partition):
        raise BubblecastError(f"current partition {list(partition)}: must hold {layers} layers, "
                              ">= 1 per stage")
    return np.repeat(np.arange(len(partition)), partition)


def solve(prob: PartitionProblem, *, slack: float = 0.0, objective: str = "sum",
          current: Partition | None = None, move_bytes: np.ndarray | None = None,
          tables: SolverTables | None = None, bottleneck: float | None = None) -> Partition:
    """The partition with every stage within ``(1 + slack)`` x the optimal bottleneck that
    minimises ``objective``: ``"sum"`` (weighted total stage time) or ``"moves"`` (bytes that
    change owner against ``current``; ``move_bytes`` per layer, default 1 per layer)."""
    if slack < 0:
        raise BubblecastError(f"slack: must be >= 0, got {slack}")
    if objective not in ("sum", "moves"):
        raise BubblecastError(f"objective: expected 'sum' or 'moves', got {objective!r}")
    t = tables or SolverTables(prob)
    limit = min_bottleneck(prob, t) if bottleneck is None else bottleneck
    limit = limit * (1.0 + slack)
    if objective == "moves":
        if current is None:
            raise BubblecastError("objective 'moves' needs the current partition")
        second = t.moves(tuple(current), move_bytes)
    else:
        second = [t.stage_time(p) for p in range(prob.stages)]
    n = prob.layers + 1
    cols = np.arange(n)
    best = np.full(n, np.inf)
    best[0] = 0.0
    choice = np.zeros((prob.stages, n), dtype=np.int64)
    for p in range(prob.stages):
        ok = t.allowed(p) & (t.stage_time(p) <= limit)
        cand = np.where(ok, best[:, None] + second[p], np.inf)
        choice[p] = cand.argmin(axis=0)  # smallest first layer: this stage takes the most
        best = cand[choice[p], cols]
    if not np.isfinite(best[-1]):
        raise _infeasible(prob)
    sizes, end = [], prob.layers
    for p in range(prob.stages - 1, -1, -1):
        start = int(choice[p, end])
        sizes.append(end - start)
        end = start
    return tuple(reversed(sizes))


def candidates(prob: PartitionProblem, *, current: Partition | None = None,
               move_bytes: np.ndarray | None = None,
               slacks: tuple[float, ...] = (0.0, 0.01, 0.03, 0.08),
               tables: SolverTables | None = None, bottleneck: float | None = None,
               neighbours: bool = False) -> list[Partition]:
    """Distinct good partitions for engine scoring: per slack, the min-sum one and (with
    ``current``) the fewest-moves one. The first is the exact min-bottleneck, min-sum one.
    ``neighbours``: then every one's one-layer shifts across each stage boundary (a
    pipeline's fill and drain can make a split the bottleneck ranks worse the faster one:
    2 stages, the last slowed 2x, 9|3 against the bottleneck's 8|4; and the engine-fastest
    split can be a shift from a candidate other than the first; memory caps kept)."""
    t = tables or SolverTables(prob)
    opt = min_bottleneck(prob, t) if bottleneck is None else bottleneck
    out: list[Partition] = []
    for slack in slacks:
        found = [solve(prob, slack=slack, tables=t, bottleneck=opt)]
        if current is not None and len(current) == prob.stages:
            found.append(solve(prob, slack=slack, objective="moves", current=current,
                               move_bytes=move_bytes, tables=t, bottleneck=opt))
        out.extend(p for p in found if p not in out)
    if neighbours:
        for p in list(out):
            out.extend(q for q in _shifts(p, t) if q not in out)
    return out


def _shifts(partition: Partition, tables: SolverTables) -> list[Partition]:
    """``partition`` with one layer moved across one stage boundary, each way (every stage
    keeps >= 1 layer and fits its memory cap)."""
    out = []
    for b in range(len(partition) - 1):
        for d in (1, -1):
            p = list(partition)
            p[b], p[b + 1] = p[b] + d, p[b + 1] - d
            edges = np.concatenate([[0], np.cumsum(p)])
            if min(p) >= 1 and all(tables.allowed(k)[edges[k], edges[k + 1]]
                                   for k in range(len(p))):
                out.append(tuple(p))
    return out


def stage_work(partition: Partition, costs: np.ndarray) -> np.ndarray:
    """Summed per-layer cost each stage holds under ``partition``."""
    edges = np.concatenate([[0], np.cumsum(partition)])
    c = np.concatenate([[0.0], np.cumsum(np.asarray(costs, dtype=np.float64))])
    if edges[-1] != len(c) - 1:
        raise BubblecastError(f"partition {list(partition)} holds {edges[-1]} layers, "
                              f"the model has {len(c) - 1}")
    return c[edges[1:]] - c[edges[:-1]]


def bottleneck_of(partition: Partition, costs: np.ndarray, speeds: np.ndarray,
                  fixed: np.ndarray | float = 0.0) -> float:
    """Largest stage time of ``partition`` (``fixed``: per-stage cost that stays put)."""
    return float(np.max(np.asarray(speeds, dtype=np.float64)
                        * (stage_work(partition, costs) + fixed)))
