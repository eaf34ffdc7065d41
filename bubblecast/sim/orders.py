"""Op orders of the looped schedules: per rank, its compute ops in execution order.

Each builder returns one list of :class:`Op` per rank; :mod:`bubblecast.sim.schedules` wraps
them in a :class:`~bubblecast.sim.schedules.Schedule` and builds the dependency graph. Chunk
``c`` of rank ``r`` is virtual stage ``c * P + r`` here (the looped placement). The V-shape
schedules are in :mod:`bubblecast.sim.vshape`.

:func:`torch_looped_lanes` is a pure-Python port of torch.distributed.pipelining's
``_get_1f1b_rank_ops`` (torch 2.13), the generator behind ScheduleInterleaved1F1B and
ScheduleInterleavedZeroBubble; ``tests/sim/test_torch_orders.py`` checks it against torch.
"""

from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple


class Op(NamedTuple):
    """One compute op of a rank: ``kind`` in F/B/W, its microbatch and model chunk.

    In a split-backward schedule ``B`` is the input backward and ``W`` the weight gradient; a
    ``B`` with no ``W`` of the same microbatch and chunk is a full backward (B + W in one op,
    as DualPipeV runs some of them).
    """

    kind: str
    microbatch: int
    chunk: int = 0


def gpipe(p: int, m: int) -> list[list[Op]]:
    return [[Op("F", i) for i in range(m)] + [Op("B", i) for i in range(m)] for _ in range(p)]


def one_f_one_b(p: int, m: int) -> list[list[Op]]:
    out = []
    for r in range(p):
        warm = min(p - r - 1, m)
        lane = [Op("F", i) for i in range(warm)]
        for i in range(m - warm):
            lane += [Op("F", warm + i), Op("B", i)]
        lane += [Op("B", i) for i in range(m - warm, m)]
        out.append(lane)
    return out


def interleaved(p: int, m: int, v: int) -> list[list[Op]]:
    """Megatron-LM's ``forward_backward_pipelining_with_interleaving`` order (``M % P == 0``;
    torch's Interleaved1F1B gives the same order then, and its own otherwise)."""
    if m % p:
        return torch_looped_lanes(p, m, v, zero_bubble=False)
    total = m * v
    group = p * v

    def fwd(k: int) -> Op:
        return Op("F", (k // group) * p + k % p, (k % group) // p)

    def bwd(k: int) -> Op:
        return Op("B", (k // group) * p + k % p, v - 1 - (k % group) // p)

    out = []
    for r in range(p):
        warm = min((p - r - 1) * 2 + (v - 1) * p, total)
        lane = [fwd(k) for k in range(warm)]
        for k in range(total - warm):
            lane += [fwd(k + warm), bwd(k)]
        lane += [bwd(k) for k in range(total - warm, total)]
        out.append(lane)
    return out


def zb_h1(p: int, m: int) -> list[list[Op]]:
    """ZB-H1: 1F1B order of F and B; rank r keeps its first r W passes for the tail."""
    out = []
    for r in range(p):
        warm = min(p - r - 1, m)
        lane = [Op("F", i) for i in range(warm)]
        nb = nw = 0
        for i in range(m - warm):
            lane += [Op("F", warm + i), Op("B", nb)]
            nb += 1
            if i >= r:
                lane.append(Op("W", nw))
                nw += 1
        for i in range(warm):
            lane.append(Op("B", nb))
            nb += 1
            if m - warm + i >= r:
                lane.append(Op("W", nw))
                nw += 1
        lane += [Op("W", i) for i in range(nw, m)]
        out.append(lane)
    return out


def zb_h2(p: int, m: int) -> list[list[Op]]:
    """ZB-H2, as the order a unit-cost run (F = B = W = 1, no comm) of its rules produces.

    Each rank, when free, runs its next B if ready; else its next F if ready and fewer than
    ``2P - 1`` microbatches hold activations (F done, W not yet); else its oldest pending W.
    Rank 0 thus runs ``2P - 1`` forwards before its first B and every rank ends with the W
    passes it deferred: the zero-bubble paper's parallelogram, whose bubble (equal op times,
    no comm) is the unavoidable ``(P - 1) F`` per rank.
    """
    limit = 2 * p - 1
    lanes: list[list[Op]] = [[] for _ in range(p)]
    f_end = [[-1] * m for _ in range(p)]  # integer end times, -1 = not run yet
    b_end = [[-1] * m for _ in range(p)]
    nf, nb, nw = [0] * p, [0] * p, [0] * p
    t, left = 0, 3 * m * p
    while left:
        for r in range(p):  # every rank is free at integer t: each op lasts one unit
            i, j = nb[r], nf[r]
            src_b = (b_end[r + 1][i] if r < p - 1 else f_end[r][i]) if i < j else -1
            if i < j and 0 <= src_b <= t and 0 <= f_end[r][i] <= t:
                lanes[r].append(Op("B", i))
                b_end[r][i], nb[r] = t + 1, i + 1
            elif j < m and j - nw[r] < limit and (r == 0 or 0 <= f_end[r - 1][j] <= t):
                lanes[r].append(Op("F", j))
                f_end[r][j], nf[r] = t + 1, j + 1
            elif nw[r] < nb[r]:
                lanes[r].append(Op("W", nw[r]))
                nw[r] += 1
            else:
                continue
            left -= 1
        t += 1
    return lanes


def looped_bfs(p: int, m: int, v: int) -> list[list[Op]]:
    """Breadth-first looping (Lamy-Poirier 2023; torch's ScheduleLoopedBFS): every forward of
    chunk 0, then of chunk 1, ...; then the backwards, last chunk and last microbatch first."""
    return [[Op("F", i, c) for c in range(v) for i in range(m)]
            + [Op("B", i, c) for c in reversed(range(v)) for i in reversed(range(m))]
            for _ in range(p)]


def torch_rounds(p: int, m: int) -> tuple[int, int]:
    """torch's ``(number_of_rounds, microbatches_per_round)`` for the interleaved classes."""
    rounds = max(1, m // p)
    return rounds, m // rounds


def torch_looped_lanes(p: int, m: int, v: int, zero_bubble: bool) -> list[list[Op]]:
    """Per rank, the compute ops torch's ``_get_1f1b_rank_ops`` generates for
    ScheduleInterleaved1F1B (``zero_bubble=False``) or ScheduleInterleavedZeroBubble."""
    _, per_round = torch_rounds(p, m)
    out = []
    for r in range(p):
        warm = min((v - 1) * per_round + (1 if zero_bubble else 2) * (p - 1 - r), m * v)
        total = m * v

        def fwd_chunk(step: int) -> int:
            return (step // per_round) % v

        def bwd_chunk(step: int, warm: int = warm) -> int:
            return v - 1 - ((step - warm) // per_round) % v

        out.append(_rank_ops_1f1b(warm, total, r if zero_bubble else None, fwd_chunk, bwd_chunk))
    return out


def _rank_ops_1f1b(warm: int, total: int, n_1f1b: int | None, fwd_chunk, bwd_chunk) -> list[Op]:
    """torch's ``_get_1f1b_rank_ops`` without its padding: ``warm`` forwards, then
    forward/backward pairs, then backwards; with zero bubble (``n_1f1b`` not None) a W of the
    oldest backward follows each backward from the ``n_1f1b``-th steady op on."""
    nxt: dict[tuple[str, int], int] = defaultdict(int)
    lane: list[Op] = []
    backward_steps: list[int] = []
    weights = 0

    def emit(kind: str, chunk: int) -> None:
        lane.append(Op(kind, nxt[kind, chunk], chunk))
        nxt[kind, chunk] += 1

    for step in range(total + warm):
        if step < total:
            emit("F", fwd_chunk(step))
            if step < warm:
                continue
        emit("B", bwd_chunk(step))
        backward_steps.append(step)
        if n_1f1b is not None and step - warm >= n_1f1b:
            emit("W", bwd_chunk(backward_steps[weights]))
            weights += 1
    while n_1f1b is not None and weights < len(backward_steps):
        emit("W", bwd_chunk(backward_steps[weights]))
        weights += 1
    return lane
