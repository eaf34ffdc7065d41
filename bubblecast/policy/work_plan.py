"""THE per-step work planner: which documents go into which micro-batch of which data-parallel
replica, in what order, and how many micro-batches each replica runs.

Framework-neutral: it takes a step's document lengths (what the data loader holds), a
:class:`~bubblecast.sim.documents.WorkCost` (a learned cost model's coefficients, the true
costs for the oracle, or ``WorkCost(per_token=1)`` for token balancing) and optional per-replica
speed multipliers (forecast; 1.5 = 50% slower), and returns a :class:`WorkPlan`. Every document
is placed exactly once, no micro-batch exceeds the token budget and the micro-batch total stays
``replicas * microbatches``: the step trains on exactly its documents.

How (:func:`plan_batch`):

1. **Micro-batches per replica** (GREYHOUND's S2). A replica with ``M_r`` micro-batches of
   load ``c`` at speed ``s_r`` takes about ``s_r * c * (M_r + P - 1)`` under 1F1B-like
   schedules (``P`` stages: fill and drain), so with loads free to adapt all replicas finish
   together at ``C / R`` with ``R = sum_r M_r / (s_r (M_r + P - 1))`` (``C``: the step's
   total load). Counts maximise ``R`` (concave in each ``M_r``: greedy marginal allocation is
   exact), within the schedule's rules.
2. **Packing**: a replica's time is about ``s_r * (sum of its loads + (P - 1) * its
   heaviest load)`` (exact for 1F1B with equal stages). Documents by decreasing cost each go
   to the replica whose time grows least, into its least-loaded micro-batch with room (LPT
   with capacities); then single documents move out of the slowest replica while that
   lowers the slowest replica's time.
3. **Order** within each replica: the candidate orders (as packed, ascending, cheapest at
   both ends) and a repacking of the replica's documents with light ends (the documents
   costliest per token fill the middle micro-batches, the rest go first and last, either way
   round: a stage's total work does not depend on the packing, only the pipeline's fill and
   drain do) are timed
   with :mod:`bubblecast.sim.steptime` and the fastest kept.
4. **Polish** (:mod:`bubblecast.policy.work_polish`): single documents move between the
   replica's micro-batches while the best such move, timed by steptime, shortens its step
   (the schedule's own waits, which the proxy of step 2 leaves out: a heavy micro-batch
   mid-pipeline stalls the next stage). Only the replica that sets the step is polished,
   then the one that sets it after that, and so on: the plan's predicted step time is its
   slowest replica's.

If packing with uneven counts leaves a document no room, equal counts are packed instead; if
that fails too (no micro-batch has room), the plan falls back to the data loader's packing
and says so in :attr:`WorkPlan.fallback` -- never silently.
:func:`plan_static` is the data loader's own plan (sequential first-fit, in order, replica
``r`` taking micro-batches ``r*M .. r*M+M-1``).
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bubblecast.errors import BubblecastError
from bubblecast.policy.work_polish import polish
from bubblecast.sim.documents import WorkCost, check_lengths, microbatch_stats, next_fit
from bubblecast.sim.schedules import check_schedule
from bubblecast.sim.steptime import op_durations, step_times, timing_shape

#: Token balancing, the hand-written heuristic (verl, fairseq, Megatron's packed sequences).
TOKENS = WorkCost(per_token=1.0)


@dataclass(frozen=True)
class PlanConfig:
    """The step's shape: ``replicas`` data-parallel pipelines of ``stages`` stages under
    ``schedule``, ``microbatches`` micro-batches each by default (``replicas * microbatches``
    in total, always), each at most ``token_budget`` tokens. ``kind_weights`` splits a
    micro-batch's cost over F, B and W (as ``--f/--b/--w``) for the step-time check.
    ``rebalance_counts``: let replicas run different numbers of micro-batches;
    ``refine_moves``: the most single-document moves after packing (between replicas);
    ``polish_rounds``: the most single-document moves within a replica after its order is
    chosen, each timed by steptime (step 4 of the module doc; 0 turns it off);
    ``polish_max_moves``: the polish stops at a slowest replica with more candidate moves a
    round than this (documents x other micro-batches), which keeps large plans' decision
    time at the packing's (a fleet-scale step: 1,024 documents into 8 x 16 micro-batches)."""

    token_budget: int
    replicas: int = 1
    microbatches: int = 8
    stages: int = 1
    schedule: str = "1f1b"
    kind_weights: tuple[float, float, float] = (1.0, 1.0, 1.0)
    rebalance_counts: bool = True
    min_microbatches: int = 1
    refine_moves: int = 64
    polish_rounds: int = 8
    polish_max_moves: int = 512

    def __post_init__(self) -> None:
        for name in ("token_budget", "replicas", "microbatches", "stages", "min_microbatches"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise BubblecastError(f"{name}: must be an integer >= 1, got {value!r}")
        if self.min_microbatches > self.microbatches:
            raise BubblecastError(f"min_microbatches: {self.min_microbatches} is above "
                                  f"microbatches {self.microbatches}")
        for name in ("refine_moves", "polish_rounds", "polish_max_moves"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise BubblecastError(f"{name}: must be an integer >= 0, got {value!r}")
        weights = tuple(float(x) for x in self.kind_weights)
        if len(weights) != 3 or min(weights) < 0 or sum(weights) <= 0:
            raise BubblecastError(f"kind_weights: three numbers >= 0, not all 0, "
                                  f"got {self.kind_weights}")
        object.__setattr__(self, "kind_weights", weights)
        name, _ = check_schedule(self.schedule, self.stages, self.microbatches, 1)
        object.__setattr__(self, "schedule", name)

    @property
    def total(self) -> int:
        """Micro-batches per step over all replicas."""
        return self.replicas * self.microbatches

    def counts_ok(self, m: int) -> bool:
        """Whether a replica may run ``m`` micro-batches under the schedule."""
        return m >= 0 and _allowed_counts(self.schedule, self.stages, m,
                                          self.min_microbatches)[m]


@dataclass(frozen=True)
class WorkPlan:
    """One step's plan. ``microbatches[r][j]``: indices (into the step's lengths) of the
    documents of replica ``r``'s ``j``-th micro-batch, in run order. ``cost[r][j]``: that
    micro-batch's cost under the planner's :class:`WorkCost`; ``predicted_step``: the step's
    predicted time in cost units x speed (None for the loader's plan); ``fallback``: why the
    plan is the loader's instead of a planned one (None when planned)."""

    microbatches: tuple[tuple[tuple[int, ...], ...], ...]
    cost: tuple[tuple[float, ...], ...] = ()
    predicted_step: float | None = None
    fallback: str | None = None
    method: str = "balance"

    @property
    def counts(self) -> list[int]:
        """Micro-batches per replica."""
        return [len(r) for r in self.microbatches]

    def assignment(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Each of the ``n`` documents' ``(replica, global micro-batch slot)``; slots number the
        plan's micro-batches replica by replica, in run order."""
        replica = np.full(n, -1, dtype=np.int64)
        slot = np.full(n, -1, dtype=np.int64)
        k = 0
        for r, mbs in enumerate(self.microbatches):
            for docs in mbs:
                idx = np.asarray(docs, dtype=np.int64)
                replica[idx], slot[idx] = r, k
                k += 1
        return replica, slot

    def to_json(self) -> dict[str, Any]:
        return {"method": self.method, "counts": self.counts,
                "microbatches": [[list(mb) for mb in r] for r in self.microbatches],
                "cost": [list(c) for c in self.cost], "predicted_step": self.predicted_step,
                "fallback": self.fallback}


def _speeds(speeds: Any, replicas: int, stages: int) -> np.ndarray:
    """Per-rank time multipliers ``(replicas, stages)`` from None, ``(R,)`` or ``(R, P)``."""
    if speeds is None:
        return np.ones((replicas, stages))
    s = np.asarray(speeds, dtype=np.float64)
    if s.ndim == 1 and s.shape == (replicas,):
        s = np.repeat(s[:, None], stages, axis=1)
    if s.shape != (replicas, stages):
        raise BubblecastError(f"speeds: expected {replicas} values (one per replica) or "
                              f"{replicas}x{stages}, got shape {s.shape}")
    if not np.all(np.isfinite(s)) or (s <= 0).any():
        raise BubblecastError("speeds: must be finite and > 0")
    return s


@functools.lru_cache(maxsize=64)
def _allowed_counts(schedule: str, stages: int, total: int, least: int) -> tuple[bool, ...]:
    """Whether a replica may run ``m`` micro-batches, for ``m`` in ``0..total``."""
    def ok(m: int) -> bool:
        try:
            check_schedule(schedule, stages, m, 1)
        except BubblecastError:
            return False
        return m >= least
    return tuple(ok(m) for m in range(total + 1))


def replica_counts(speeds: np.ndarray, config: PlanConfig) -> list[int]:
    """Micro-batches per replica maximising ``sum_r M_r / (s_r (M_r + P - 1))`` with
    ``sum M_r = replicas * microbatches`` (step 1 of the module doc); ``speeds`` ``(R,)``."""
    r, p, total = config.replicas, config.stages, config.total
    if not config.rebalance_counts or r == 1 or np.allclose(speeds, speeds[0]):
        return [config.microbatches] * r
    counts = [config.min_microbatches] * r
    ok = _allowed_counts(config.schedule, config.stages, total, config.min_microbatches)
    sp = [float(x) for x in speeds]

    def offer(i: int) -> tuple[float, int, int] | None:
        """Replica ``i``'s next allowed count and its gain per micro-batch, as a heap item."""
        m = counts[i] + 1
        while m <= total and not ok[m]:
            m += 1  # the next count the schedule allows
        if m > total:
            return None
        now, nxt = counts[i], m
        gain = (nxt / (sp[i] * (nxt + p - 1)) - now / (sp[i] * (now + p - 1))) / (nxt - now)
        return (-gain, i, nxt)

    heap = [item for i in range(r) if (item := offer(i)) is not None]
    heapq.heapify(heap)
    left = total - sum(counts)
    while left > 0 and heap:
        _, i, nxt = heapq.heappop(heap)
        if nxt - counts[i] > left:
            continue  # does not fit what is left: this replica is done
        left -= nxt - counts[i]
        counts[i] = nxt
        if (item := offer(i)) is not None:
            heapq.heappush(heap, item)
    if left or not all(ok[m] for m in counts):
        return [config.microbatches] * r
    return counts


def _pack(lengths: np.ndarray, costs: np.ndarray, counts: list[int], speed: np.ndarray,
          stages: int, budget: int, moves: int) -> np.ndarray | None:
    """Replica-aware LPT with capacities (step 2 of the module doc): each document's bin
    (bins numbered replica by replica), or None if a document finds no bin with room."""
    fill = float(stages - 1)
    heaps: list[list[tuple[float, int]]] = []
    first = 0
    for m in counts:
        heaps.append([(0.0, j) for j in range(first, first + m)])
        first += m
    load = [0.0] * first
    room = [budget] * first
    total = [0.0] * len(counts)  # per replica: sum of its bins' loads
    peak = [0.0] * len(counts)  # per replica: its heaviest bin
    sp = speed.tolist()
    order = np.lexsort((np.arange(len(costs)), -lengths, -costs))
    bin_of = np.empty(len(costs), dtype=np.int64)
    # Lengths never grow along `order` (a document's cost grows with its length): a bin without
    # room for this document is parked until the documents get short enough for its room.
    parked: list[list[tuple[int, int]]] = [[] for _ in counts]  # (-room, bin)
    wmax = [-1] * len(counts)  # per replica: the most room a parked bin has (-1: none)
    push, pop, replace = heapq.heappush, heapq.heappop, heapq.heapreplace
    replicas = list(zip(range(len(counts)), heaps, parked, sp, strict=True))
    inf = float("inf")
    for i, c, n in zip(order.tolist(), costs[order].tolist(), lengths[order].tolist(),
                       strict=True):
        best, best_t, best_l = None, inf, inf
        for r, heap, wait, s in replicas:
            if wmax[r] >= n:  # documents got short enough for parked bins: back in play
                while wait and -wait[0][0] >= n:
                    j = pop(wait)[1]
                    push(heap, (load[j], j))
                wmax[r] = -wait[0][0] if wait else -1
            while heap and room[heap[0][1]] < n:
                j = pop(heap)[1]
                push(wait, (-room[j], j))
                wmax[r] = -wait[0][0]
            if not heap:
                continue
            lj = heap[0][0]
            x, pk = lj + c, peak[r]
            t = s * (total[r] + c + fill * (pk if pk > x else x))
            if t < best_t or (t == best_t and lj < best_l):
                best, best_t, best_l = r, t, lj
        if best is None:
            return None
        heap = heaps[best]
        j = heap[0][1]
        lj = load[j] = load[j] + c
        room[j] -= n
        replace(heap, (lj, j))
        total[best] += c
        if lj > peak[best]:
            peak[best] = lj
        bin_of[i] = j
    if moves:
        _refine(bin_of, costs, lengths, np.asarray(load), np.asarray(room), counts, speed,
                fill, moves)
    return bin_of


def _replica_time(load: np.ndarray, starts: np.ndarray, speed: np.ndarray, fill: float
                  ) -> np.ndarray:
    """Each replica's time, ``speed * (sum + fill * max)`` of its bins' loads."""
    return speed * (np.add.reduceat(load, starts) + fill * np.maximum.reduceat(load, starts))


def _refine(bin_of: np.ndarray, costs: np.ndarray, lengths: np.ndarray, load: np.ndarray,
            room: np.ndarray, counts: list[int], speed: np.ndarray, fill: float,
            moves: int) -> None:
    """Move single documents out of the slowest replica while that lowers the slowest
    replica's time (in place); every candidate move of the slowest replica's documents to
    every other replica's bins is scored at once."""
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    owner = np.repeat(np.arange(len(counts)), counts)
    for _ in range(moves):
        times = _replica_time(load, starts, speed, fill)
        slow = int(np.argmax(times))
        others = np.delete(times, slow).max() if len(times) > 1 else 0.0
        docs = np.flatnonzero(owner[bin_of] == slow)
        targets = np.flatnonzero(owner != slow)
        if not len(docs) or not len(targets):
            return
        c, n = costs[docs], lengths[docs]
        # the slow replica without each document: its bins' loads with that one reduced
        own = load[bin_of[docs]] - c
        lo, hi = starts[slow], starts[slow] + counts[slow]
        rest = load[lo:hi]
        top2 = np.sort(rest)[-2:] if len(rest) > 1 else np.r_[0.0, rest]
        peak_wo = np.where(load[bin_of[docs]] >= top2[-1], np.maximum(top2[0], own), top2[-1])
        t_src = speed[slow] * (times[slow] / speed[slow] - c + fill * (peak_wo - rest.max()))
        # each target replica with the document added to one of its bins
        tr = owner[targets]
        base = times[tr] / speed[tr]
        peak_t = np.maximum.reduceat(load, starts)[tr]
        new_l = load[targets][None, :] + c[:, None]
        t_dst = speed[tr][None, :] * (base[None, :] + c[:, None]
                                       + fill * (np.maximum(peak_t[None, :], new_l)
                                                 - peak_t[None, :]))
        fits = room[targets][None, :] >= n[:, None]
        score = np.where(fits, np.maximum(np.maximum(t_dst, t_src[:, None]), others), np.inf)
        k = int(np.argmin(score))
        if not score.flat[k] < times[slow] - 1e-12:
            return
        d, t = docs[k // len(targets)], targets[k % len(targets)]
        load[bin_of[d]] -= costs[d]
        room[bin_of[d]] += lengths[d]
        load[t] += costs[d]
        room[t] -= lengths[d]
        bin_of[d] = t


def _orders(cost: np.ndarray) -> list[np.ndarray]:
    """Candidate run orders of one replica's micro-batches: as packed, ascending, and the
    cheapest first, the next cheapest last, the rest by decreasing cost between them."""
    asc = np.argsort(cost, kind="stable")
    if len(cost) < 3:
        return [np.arange(len(cost)), asc]
    ends = np.concatenate([asc[:1], asc[2:][::-1], asc[1:2]])
    return [np.arange(len(cost)), asc, ends]


def _replica_times(config: PlanConfig, m: int, rows: list[np.ndarray],
                   speeds: list[np.ndarray]) -> np.ndarray:
    """Predicted pipeline time of each candidate (a row of ``m`` micro-batch costs in run
    order, at per-stage ``speeds``) through :func:`bubblecast.sim.steptime.step_times`."""
    shape = timing_shape(config.schedule, config.stages, m, 1)
    w = np.asarray(config.kind_weights) / sum(config.kind_weights)
    cost = np.stack(rows)[:, None, :]  # (K, 1, M)
    speed = np.stack(speeds)[:, :, None]  # (K, P, 1)
    f, b, ww = (cost * speed * w[k] for k in range(3))
    return step_times(shape, op_durations(shape, f, b, ww))[0]


def _light_ends(docs: list[int], x: np.ndarray, per_token: np.ndarray, m: int, budget: int
                ) -> list[list[int]] | None:
    """One replica's documents repacked with light ends (``m >= 3``): by decreasing cost per
    token (``per_token``: each document's cost over its length; long documents pay for
    attention, very short ones for their per-document overhead), then decreasing length, each
    document goes to the emptiest of the ``m - 2`` middle micro-batches with room, else to the
    ends; the ends take the longest of those first, then the other. The middle micro-batches
    run between the ends by decreasing token count. None when the ends overflow. Per-stage work
    does not depend on the packing, only the fill and drain do: a pipeline's first forwards and
    last backwards wait on the end micro-batches."""
    mids: list[list[int]] = [[] for _ in range(m - 2)]
    room = [budget] * (m - 2)
    ends: list[int] = []
    for i in sorted(docs, key=lambda i: (-per_token[i], -x[i], i)):
        k = max(range(m - 2), key=lambda k: room[k])
        if room[k] >= x[i]:
            mids[k].append(i)
            room[k] -= int(x[i])
        else:
            ends.append(i)
    first: list[int] = []
    last: list[int] = []
    space = [budget, budget]
    for i in sorted(ends, key=lambda i: (-x[i], i)):
        side = 0 if space[0] >= x[i] else 1 if space[1] >= x[i] else -1
        if side < 0:
            return None
        (first, last)[side].append(i)
        space[side] -= int(x[i])
    if not first or not last:
        return None
    mids.sort(key=lambda mb: -int(x[mb].sum()))  # an empty one sums to 0
    return [sorted(first), *(sorted(mb) for mb in mids), sorted(last)]


def _candidates(bins: list[list[int]], bin_cost: np.ndarray, x: np.ndarray,
                per_token: np.ndarray, config: PlanConfig, cost: WorkCost
                ) -> list[tuple[list[list[int]], np.ndarray]]:
    """One replica's candidate plans in run order, with their micro-batch costs: the packed
    micro-batches in each of :func:`_orders`, and their documents repacked with light ends
    (:func:`_light_ends`) both ways round."""
    out = [([bins[j] for j in o.tolist()], bin_cost[o]) for o in _orders(bin_cost)]
    if len(bins) >= 3:
        ends = _light_ends([i for b in bins for i in b], x, per_token, len(bins),
                           config.token_budget)
        if ends is not None and all(ends):
            owner = np.concatenate([np.full(len(b), j) for j, b in enumerate(ends)])
            tokens, sq, docs = microbatch_stats(x[np.concatenate(ends)], owner, len(ends))
            c = cost.microbatch(tokens, sq, docs)
            out += [(ends, c), (ends[::-1], c[::-1])]
    return out


def _finish(config: PlanConfig, bins: list[list[int]], bin_cost: np.ndarray,
            counts: list[int], speeds: np.ndarray, x: np.ndarray, cost: WorkCost
            ) -> tuple[list[list[list[int]]], list[list[float]], float]:
    """Pick each replica's fastest candidate (:func:`_candidates`, timed by steptime,
    replicas with the same count in one call); the plan, its costs and its predicted step
    time (the slowest replica)."""
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(int).tolist()
    per_token = np.round(cost.documents_cost(x) / x, 12)  # ties: by length
    chosen: dict[int, tuple[list[list[int]], np.ndarray]] = {}
    seconds: dict[int, float] = {}
    for m in sorted(set(counts)):
        group = [r for r, c in enumerate(counts) if c == m]
        rows, speed, cands_of = [], [], {}
        for r in group:
            lo, hi = starts[r], starts[r + 1]
            cands_of[r] = _candidates(bins[lo:hi], bin_cost[lo:hi], x, per_token, config, cost)
            for _, c in cands_of[r]:
                rows.append(c)
                speed.append(speeds[r])
        times = _replica_times(config, m, rows, speed)
        k = 0
        for r in group:
            n = len(cands_of[r])
            best = int(np.argmin(times[k:k + n]))
            chosen[r], seconds[r] = cands_of[r][best], float(times[k + best])
            k += n
    _polish_slowest(config, chosen, seconds, counts, speeds, x, cost)
    worst = max(seconds.values(), default=0.0)
    plan = [chosen[r][0] for r in range(len(counts))]
    costs = [[float(v) for v in chosen[r][1]] for r in range(len(counts))]
    return plan, costs, worst


def _polish_slowest(config: PlanConfig, chosen: dict[int, tuple[list[list[int]], np.ndarray]],
                    seconds: dict[int, float], counts: list[int], speeds: np.ndarray,
                    x: np.ndarray, cost: WorkCost) -> None:
    """Polish (:func:`_polished`, in place) the replica that sets the step, then the one that
    sets it after that, until the slowest one has been polished already or has more
    candidate moves than ``polish_max_moves``: a replica faster than the step's slowest
    cannot shorten the step, so its polish would be CPU for nothing."""
    if not config.polish_rounds:
        return
    done: set[int] = set()
    while seconds:
        r = max(seconds, key=seconds.__getitem__)
        moves = sum(map(len, chosen[r][0])) * (counts[r] - 1)
        if r in done or not 0 < moves <= config.polish_max_moves:
            return
        done.add(r)
        chosen[r], seconds[r] = _polished(config, chosen[r], speeds[r], x, cost)


def _polished(config: PlanConfig, chosen: tuple[list[list[int]], np.ndarray],
              speed: np.ndarray, x: np.ndarray, cost: WorkCost
              ) -> tuple[tuple[list[list[int]], np.ndarray], float]:
    """One replica's chosen candidate after :func:`~bubblecast.policy.work_polish.polish`
    (single-document moves timed by steptime at the replica's speeds) with its micro-batch
    costs recomputed, and its predicted time."""
    mbs, _ = chosen
    m = len(mbs)
    docs = np.array([i for mb in mbs for i in mb], dtype=np.int64)
    slot = np.repeat(np.arange(m), [len(mb) for mb in mbs])

    def timer(rows: np.ndarray) -> np.ndarray:
        return _replica_times(config, m, list(rows), [speed] * len(rows))

    slot, _ = polish(slot, x[docs], cost.documents_cost(x[docs]), m, config.token_budget,
                     cost.per_microbatch, timer, config.polish_rounds)
    out = [sorted(docs[slot == j].tolist()) for j in range(m)]
    tokens, sq, n = microbatch_stats(x[docs], slot, m)
    c = cost.microbatch(tokens, sq, n)
    return (out, c), float(timer(c[None, :])[0])


def _members(bin_of: np.ndarray, bins: int) -> list[list[int]]:
    """Each bin's document indices, in document order."""
    order = np.argsort(bin_of, kind="stable")
    starts = np.searchsorted(bin_of[order], np.arange(bins + 1))
    return [order[starts[j]:starts[j + 1]].tolist() for j in range(bins)]


def plan_static(lengths: Any, config: PlanConfig, cost: WorkCost = TOKENS) -> WorkPlan:
    """The data loader's plan: sequential first-fit in arrival order, ``microbatches``
    consecutive micro-batches per replica; BubblecastError when the lengths do not pack into
    exactly ``replicas * microbatches`` micro-batches."""
    x = check_lengths(lengths, config.token_budget, "lengths", config.total)
    owner = next_fit(x, config.token_budget)
    if owner[-1] + 1 != config.total:
        raise BubblecastError(f"lengths: the loader's packing makes {owner[-1] + 1} "
                              f"micro-batches, expected {config.total}")
    tokens, tokens_sq, docs = microbatch_stats(x, owner, config.total)
    c = cost.microbatch(tokens, tokens_sq, docs)
    m = config.microbatches
    bins = _members(owner, config.total)
    plan = tuple(tuple(tuple(bins[r * m + j]) for j in range(m)) for r in range(config.replicas))
    return WorkPlan(plan, tuple(tuple(float(v) for v in c[r * m:(r + 1) * m])
                                for r in range(config.replicas)), None, None, "static")


def _planned(x: np.ndarray, config: PlanConfig, cost: WorkCost, speeds: np.ndarray,
             counts: list[int]) -> tuple[list, list, float] | None:
    """Pack and order for given counts; None when packing fails."""
    bin_of = _pack(x, cost.documents_cost(x), counts, speeds.max(axis=1), config.stages,
                   config.token_budget, config.refine_moves)
    if bin_of is None:
        return None
    tokens, tokens_sq, docs = microbatch_stats(x, bin_of, config.total)
    bin_cost = cost.microbatch(tokens, tokens_sq, docs)
    return _finish(config, _members(bin_of, config.total), bin_cost, counts, speeds, x, cost)


def plan_batch(lengths: Sequence[int] | np.ndarray, config: PlanConfig,
               cost: WorkCost = TOKENS, speeds: Any = None, method: str = "balance"
               ) -> WorkPlan:
    """Plan one step's documents (see the module doc). ``speeds``: per-replica (or per-rank,
    ``(replicas, stages)``) time multipliers, None for equal; ``cost``: the per-layer cost of
    a packed micro-batch (default: token counts). BubblecastError on bad lengths (empty,
    fewer documents than micro-batches, non-integer, < 1 or longer than the budget)."""
    x = check_lengths(lengths, config.token_budget, "lengths", config.total)
    s = _speeds(speeds, config.replicas, config.stages)
    equal = [config.microbatches] * config.replicas
    counts = replica_counts(s.max(axis=1), config)
    best = _planned(x, config, cost, s, counts)
    if best is None and counts != equal:  # uneven counts left a document no room
        best = _planned(x, config, cost, s, equal)
    if best is None:
        try:
            static = plan_static(x, config, cost)
        except BubblecastError as exc:
            raise BubblecastError(f"lengths: no packing into {config.total} micro-batches of "
                                  f"{config.token_budget} tokens ({exc})") from None
        return WorkPlan(static.microbatches, static.cost, None,
                        "a document found no micro-batch with room: the loader's packing",
                        method)
    plan, costs, step = best
    return WorkPlan(tuple(tuple(tuple(mb) for mb in r) for r in plan),
                    tuple(tuple(c) for c in costs), step, None, method)
