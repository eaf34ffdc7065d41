"""Step times of work plans, batched: many replicas' pipelines, each with its own micro-batch
costs in run order, timed with :mod:`bubblecast.sim.steptime` (one call per micro-batch count).

A replica row is ``costs`` (``(m,)``: each micro-batch's cost, in run order) and ``kinds``
(``(V, 3)``: each virtual stage's F, B and W seconds per unit of cost, the rank's speed and
layers included); its op durations are ``kinds[v, kind] * costs[j]`` (a backward without its own
W op carries B + W, as everywhere). Offline evaluation times plans against the truth this way,
policies predict their plans' step times this way, and ``whatif``'s ``balanced_work`` too.
:func:`critical_path_floor` (with :func:`least_end_costs`) bounds from below what any plan of a
step's documents can reach on one replica.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bubblecast.sim.documents import WorkCost
from bubblecast.sim.schedules import vstage_ranks
from bubblecast.sim.steptime import op_durations, step_times, timing_shape


def time_replicas(schedule: str, stages: int, chunks: int, comm_s: float,
                  costs: Sequence[np.ndarray], kinds: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """``(window_s, bubble_fraction)``, each ``(N,)``, of ``N`` replica rows (see the module
    doc); ``kinds`` is ``(N, V, 3)``. Rows with the same micro-batch count share one engine
    call."""
    n = len(costs)
    kinds = np.asarray(kinds, dtype=np.float64)
    counts = np.fromiter((len(c) for c in costs), dtype=np.int64, count=n)
    window, bubble = np.zeros(n), np.zeros(n)
    for m in np.unique(counts).tolist():
        if m == 0:
            continue
        idx = np.flatnonzero(counts == m)
        shape = timing_shape(schedule, stages, m, chunks, comm_s)
        c = np.stack([np.asarray(costs[i], dtype=np.float64) for i in idx.tolist()])  # (n, m)
        k = kinds[idx]  # (n, V, 3)
        f, b, w = (k[:, :, j, None] * c[:, None, :] for j in range(3))
        window[idx], bubble[idx] = step_times(shape, op_durations(shape, f, b, w))
    return window, bubble


def stage_kinds(schedule: str, stages: int, chunks: int, per_rank: np.ndarray,
                vstage_kind: np.ndarray) -> np.ndarray:
    """``(..., V, 3)`` kinds from per-rank multipliers ``(..., P)`` (speeds, times layers
    where the unit is per layer) and each virtual stage's F, B, W seconds per unit of cost at
    multiplier 1, ``(V, 3)`` or ``(..., V, 3)``."""
    owner = vstage_ranks(schedule, stages, chunks)
    per_v = np.asarray(per_rank, dtype=np.float64)[..., owner]  # (..., V)
    return per_v[..., None] * np.asarray(vstage_kind, dtype=np.float64)


def predicted_plan_step(schedule: str, stages: int, costs: Sequence[Sequence[float]],
                        speeds: np.ndarray, kind_weights: Sequence[float],
                        comm_s: float = 0.0) -> float:
    """A plan's predicted step time as the planner models it (one chunk per rank, each
    micro-batch's cost split over F, B, W by ``kind_weights``, times the rank's multiplier in
    ``speeds`` ``(R, P)``): the slowest replica's pipeline time."""
    w = np.asarray(kind_weights, dtype=np.float64)
    w = w / w.sum()
    s = np.asarray(speeds, dtype=np.float64)
    kinds = s[:, :, None] * w[None, None, :]  # (R, P, 3): one virtual stage per rank
    window, _ = time_replicas(schedule, stages, 1, comm_s,
                              [np.asarray(c, dtype=np.float64) for c in costs], kinds)
    return float(window.max()) if len(window) else 0.0


def critical_path_floor(kinds: np.ndarray, total_cost: float, end_costs: tuple[float, float],
                        comm_s: float = 0.0) -> float:
    """A lower bound on one replica's step over *every* plan of the same documents into the
    same number (>= 2) of micro-batches, on a one-chunk pipeline (1F1B or GPipe).

    ``kinds`` is ``(P, 3)`` (each stage's F, B, W seconds per unit of cost, speed included).
    The work is additive over documents, so stage ``s`` runs ``total_cost x sum(kinds[s])``
    whatever the plan; it cannot start before the first micro-batch's forwards on the stages
    before it, nor finish before the last micro-batch's backwards on them (W excluded: it may
    be deferred), each crossing a link of ``comm_s`` seconds per stage. ``end_costs`` are the
    least those two micro-batches can cost, the smaller and the larger
    (:func:`least_end_costs`); the smaller goes where it saves most. The bound is the largest
    over stages."""
    k = np.asarray(kinds, dtype=np.float64)
    small, large = sorted(end_costs)
    floor = 0.0
    for s in range(k.shape[0]):
        a, b = float(k[:s, 0].sum()), float(k[:s, 1].sum())
        ends = min(a, b) * large + max(a, b) * small
        floor = max(floor, total_cost * float(k[s].sum()) + ends + 2 * s * comm_s)
    return floor


def least_end_costs(lengths: np.ndarray, microbatches: int, token_budget: int,
                    cost: WorkCost) -> tuple[float, float]:
    """The least the first and last micro-batches of any plan of ``lengths`` into
    ``microbatches`` (>= 2) can cost: together they hold every token the other micro-batches
    cannot (``sum - (microbatches - 2) x budget``), at most a budget each, and take the
    cheapest tokens, those of the documents with the lowest cost per token; documents may be
    split here, so this is a lower bound. ``(smaller, larger)``."""
    x = np.asarray(lengths, dtype=np.float64)
    per_token = cost.documents_cost(x) / x  # each document's cost per token
    order = np.argsort(per_token, kind="stable")
    x, per_token = x[order], per_token[order]
    need = max(0.0, float(x.sum()) - (microbatches - 2) * token_budget)
    edges = np.concatenate([[0.0], np.cumsum(x)])

    def tokens_cost(lo: float, hi: float) -> float:
        """Cost of the tokens from ``lo`` to ``hi`` of the documents cheapest per token first."""
        take = np.clip(np.minimum(edges[1:], hi) - np.maximum(edges[:-1], lo), 0.0, None)
        return float((take * per_token).sum())

    small = max(0.0, need - token_budget)
    large = min(need, float(token_budget))
    fixed = cost.per_microbatch
    return ((fixed if small > 0 else 0.0) + tokens_cost(0.0, small),
            (fixed if large > 0 else 0.0) + tokens_cost(small, small + large))
