"""The best plan of one step's documents on one replica, by mixed-integer programming: what no
planner can beat, for offline evaluation.

A plan puts each document in one of the replica's ``M`` micro-batches (their run order is the
slot order). A micro-batch's cost is additive over its documents (:class:`~bubblecast.sim.
documents.WorkCost`: per token, per squared token, per document) plus a fixed part, so every
op's duration is linear in the 0/1 assignment. The step is the schedule's DAG
(:func:`bubblecast.sim.steptime.shape_graph`: lane order and cross-stage dependencies with
their link time) timed as the engine times it: each op starts no earlier than its lane
predecessor's end and each dependency's end plus its lag, and the step ends with the last op.
Minimising that end over assignments that keep every micro-batch non-empty and within the
token budget is a small MILP, solved by HiGHS (:func:`scipy.optimize.milp`) within a time
limit.

:func:`optimal_step` returns the best plan found and the solver's proven lower bound: the bound
holds for every plan even when the time limit stops the search, so it is the floor to quote
("no plan of these documents into ``M`` micro-batches is faster"), and the best plan's step is
what a planner could have reached. Timed against the same costs, the loader's plan comes out
exactly as :func:`~bubblecast.policy.work_timing.time_replicas` times it (a test checks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from bubblecast.errors import BubblecastError
from bubblecast.sim.documents import WorkCost
from bubblecast.sim.schedules import ScheduleGraph
from bubblecast.sim.steptime import shape_graph, timing_shape

#: Seconds HiGHS may spend on one step by default.
TIME_LIMIT_S = 2.0


@dataclass(frozen=True)
class StepOptimum:
    """One step's MILP outcome: ``best_s`` (the best plan found; NaN when none was found in
    time), ``bound_s`` (no plan is faster: the solver's proven lower bound), ``slots`` (each
    document's micro-batch in the best plan, run order; empty when none) and ``proven``
    (the best plan is optimal to the solver's tolerance)."""

    best_s: float
    bound_s: float
    slots: np.ndarray
    proven: bool

    @property
    def gap(self) -> float:
        """Relative gap between the best plan found and the bound (0 when proven)."""
        if not np.isfinite(self.best_s) or self.best_s <= 0:
            return float("inf")
        return max(0.0, (self.best_s - self.bound_s) / self.best_s)


def _op_coefficients(sg: ScheduleGraph, kinds: np.ndarray) -> np.ndarray:
    """Each op's seconds per unit of its micro-batch's cost: F, B or W of its virtual stage, a
    backward without its own W op carrying B + W."""
    coef = kinds[sg.vstage, sg.kind].copy()
    coef[sg.fused] += kinds[sg.vstage[sg.fused], 2]
    return coef


def _constraints(lengths: np.ndarray, doc_cost: np.ndarray, fixed: float, budget: int,
                 m: int, sg: ScheduleGraph, coef: np.ndarray, comm_s: float
                 ) -> tuple[Any, np.ndarray, np.ndarray, int]:
    """The MILP's rows ``(A, lower, upper)`` and its number of variables: ``x[d, j]`` (document
    ``d`` in micro-batch ``j``, index ``d * m + j``), each op's start, then the step's end."""
    from scipy.sparse import coo_matrix

    g = sg.graph
    n, nops = len(lengths), g.n_ops
    nb = n * m
    end = nb + nops
    docs = np.arange(n)
    rows, cols, vals, lo, hi = [], [], [], [], []
    r = 0

    def duration(ops: np.ndarray, sign: float) -> None:
        """Add ``sign x`` the variable part of each op's duration to rows ``r .. r+len``."""
        k = np.arange(r, r + len(ops))
        rows.append(np.repeat(k, n))
        cols.append((docs[None, :] * m + sg.microbatch[ops][:, None]).ravel())
        vals.append((sign * coef[ops][:, None] * doc_cost[None, :]).ravel())

    # precedence: start[dst] - start[src] - duration[src] >= lag (lane order, then dependencies)
    lane = np.flatnonzero(g.prev >= 0)
    src = np.concatenate([g.prev[lane], g.deps[:, 0]]).astype(np.int64)
    dst = np.concatenate([lane, g.deps[:, 1]]).astype(np.int64)
    lag = np.concatenate([np.zeros(len(lane)), g.dep_lag * comm_s])
    k = np.arange(r, r + len(src))
    rows += [k, k]
    cols += [nb + dst, nb + src]
    vals += [np.ones(len(src)), -np.ones(len(src))]
    duration(src, -1.0)
    lo.append(lag + coef[src] * fixed)
    hi.append(np.full(len(src), np.inf))
    r += len(src)
    # the step ends after every op: end - start[i] - duration[i] >= 0
    ops = np.arange(nops)
    k = np.arange(r, r + nops)
    rows += [k, k]
    cols += [np.full(nops, end), nb + ops]
    vals += [np.ones(nops), -np.ones(nops)]
    duration(ops, -1.0)
    lo.append(coef * fixed)
    hi.append(np.full(nops, np.inf))
    r += nops
    # each document once; each micro-batch within the budget and not empty
    cell = (docs[:, None] * m + np.arange(m)[None, :])
    for index, weight, low, high in (
            (np.repeat(np.arange(n), m), np.ones(nb), 1.0, 1.0),
            (np.tile(np.arange(m), n), np.repeat(lengths.astype(np.float64), m), -np.inf,
             float(budget)),
            (np.tile(np.arange(m), n), np.ones(nb), 1.0, np.inf)):
        rows.append(r + index)
        cols.append(cell.ravel())
        vals.append(weight)
        size = int(index.max()) + 1
        lo.append(np.full(size, low))
        hi.append(np.full(size, high))
        r += size
    a = coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                   shape=(r, end + 1)).tocsr()
    return a, np.concatenate(lo), np.concatenate(hi), end + 1


def optimal_step(lengths: np.ndarray, microbatches: int, token_budget: int, cost: WorkCost,
                 kinds: np.ndarray, schedule: str = "1f1b", stages: int = 1, chunks: int = 1,
                 comm_s: float = 0.0, time_limit_s: float = TIME_LIMIT_S) -> StepOptimum:
    """The best plan of ``lengths`` into ``microbatches`` micro-batches of one replica (see
    the module doc). ``kinds`` ``(V, 3)``: each virtual stage's F, B and W seconds per unit
    of cost (speed included, as :func:`~bubblecast.policy.work_timing.stage_kinds` gives).
    BubblecastError when no plan exists (a document over the budget, fewer documents than
    micro-batches) or the solver fails."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    x = np.asarray(lengths, dtype=np.int64)
    m = int(microbatches)
    if len(x) < m or (x > token_budget).any() or (x < 1).any():
        raise BubblecastError(f"lengths: {len(x)} documents (longest {int(x.max(initial=0))} "
                              f"tokens) have no plan into {m} non-empty micro-batches of "
                              f"{token_budget} tokens")
    sg = shape_graph(timing_shape(schedule, stages, m, chunks, comm_s))
    k = np.asarray(kinds, dtype=np.float64)
    if k.shape != (stages * chunks, 3):
        raise BubblecastError(f"kinds: expected shape ({stages * chunks}, 3), got {k.shape}")
    a, lo, hi, nv = _constraints(x, cost.documents_cost(x), cost.per_microbatch, token_budget,
                                 m, sg, _op_coefficients(sg, k), comm_s)
    nb = len(x) * m
    objective = np.zeros(nv)
    objective[-1] = 1.0
    integral = np.zeros(nv)
    integral[:nb] = 1
    upper = np.full(nv, np.inf)
    upper[:nb] = 1.0
    res = milp(objective, constraints=LinearConstraint(a, lo, hi), integrality=integral,
               bounds=Bounds(np.zeros(nv), upper),
               options={"time_limit": float(time_limit_s), "disp": False})
    if res.status not in (0, 1):  # 0 optimal, 1 stopped by the time limit
        raise BubblecastError(f"optimal plan: the MILP solver failed ({res.message})")
    bound = float(getattr(res, "mip_dual_bound", np.nan))
    if res.x is None:
        return StepOptimum(float("nan"), bound, np.zeros(0, dtype=np.int64), False)
    slots = res.x[:nb].reshape(len(x), m).argmax(axis=1).astype(np.int64)
    best, proven = float(res.fun), res.status == 0
    if np.isfinite(bound):
        bound = min(bound, best)
    elif proven:  # no dual bound reported, but the best plan is optimal: it is the bound
        bound = best
    return StepOptimum(best, bound, slots, proven)
