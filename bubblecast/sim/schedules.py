"""Pipeline schedules as plain data: the ordered compute ops of every pipeline rank.

A :class:`Schedule` lists, per rank (pipeline stage), its ops ``Op(kind, microbatch, chunk)``
in execution order, with ``kind`` one of ``F`` (forward), ``B`` (backward; the whole backward
where the schedule does not split it) and ``W`` (weight gradient, split schedules only).
Supported (``build_schedule`` names):

- ``gpipe``: all forwards, then all backwards (Huang et al. 2019).
- ``1f1b``: ``P - r - 1`` warm-up forwards on rank ``r``, then one forward / one backward,
  then the remaining backwards (PipeDream-Flush, Narayanan et al. 2021).
- ``interleaved``: Megatron-LM's interleaved 1F1B with ``V`` model chunks per rank; rank ``r``
  chunk ``c`` is virtual stage ``c * P + r``. Needs ``M % P == 0`` as Megatron does.
- ``zb-h1``: the zero-bubble paper's ZB-H1 (Qi et al. 2023): 1F1B with B split from W and rank
  ``r`` deferring its first ``r`` W passes into the tail bubble (1F1B's memory).
- ``zb-h2``: ZB-H2: ``2(P - r - 1) + 1`` forwards before the first B fill the warm-up bubble,
  W passes wait as long as activation memory (``2P - 1`` microbatches) allows and fill the
  remaining gaps; the tail becomes a parallelogram.

:func:`build_graph` turns a schedule into the engine's :class:`OpGraph` under the SPEC §2
communication model, and :func:`to_torch_actions` exports torch.distributed.pipelining's
action-list notation.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from bubblecast.errors import BubblecastError
from bubblecast.sim.engine import OpGraph

KINDS: tuple[str, ...] = ("F", "B", "W")


@dataclass(frozen=True)
class ScheduleSpec:
    """One pipeline schedule and what can be done with it: THE schedule table's row.

    ``simulable``: this module builds its op order (the simulator, replay and policies can time
    it); ``torch_class``: its class in ``torch.distributed.pipelining`` (None: torch does not
    ship it, so the runtime cannot run it); ``multi``: the torch class takes a list of stages
    (``PipelineScheduleMulti``); ``style``: ``"loop"`` (virtual stage ``v`` on rank
    ``v % P``) or ``"v"`` (rank ``r`` holds ``r`` and ``2P - 1 - r``); ``split_backward``:
    backward split into input (B) and weight (W) passes; ``multi_chunk``: may run more than one
    model chunk per rank; ``default_chunks``: chunks per rank when none is given;
    ``aliases``: other names it is known by (torch class names, lower case, no separators).
    """

    name: str
    simulable: bool
    torch_class: str | None
    multi: bool
    style: str
    split_backward: bool
    multi_chunk: bool
    default_chunks: int
    aliases: tuple[str, ...] = ()


#: Every schedule bubblecast knows. A new schedule gets a row here (and a builder below when
#: it is simulable).
SCHEDULES: dict[str, ScheduleSpec] = {s.name: s for s in (
    ScheduleSpec("gpipe", True, "ScheduleGPipe", False, "loop", False, False, 1,
                 ("schedulegpipe",)),
    ScheduleSpec("1f1b", True, "Schedule1F1B", False, "loop", False, False, 1,
                 ("schedule1f1b",)),
    ScheduleSpec("interleaved", True, "ScheduleInterleaved1F1B", True, "loop", False, True, 2,
                 ("interleaved1f1b", "scheduleinterleaved1f1b")),
    ScheduleSpec("zb-h1", True, "ScheduleInterleavedZeroBubble", True, "loop", True, False, 1,
                 ("zbh1",)),
    ScheduleSpec("zb-h2", True, None, False, "loop", True, False, 1, ("zbh2",)),
    ScheduleSpec("zb-interleaved", False, "ScheduleInterleavedZeroBubble", True, "loop", True,
                 True, 2, ("interleaved-zb", "interleavedzerobubble",
                           "scheduleinterleavedzerobubble")),
    ScheduleSpec("zbv", False, "ScheduleZBVZeroBubble", True, "v", True, True, 2,
                 ("zbvzerobubble", "schedulezbvzerobubble")),
    ScheduleSpec("dualpipev", False, "ScheduleDualPipeV", True, "v", True, True, 2,
                 ("scheduledualpipev",)),
)}  # fmt: skip
#: Names of the schedules this module builds (the simulator's ``--schedule`` choices).
SIMULABLE: tuple[str, ...] = tuple(n for n, s in SCHEDULES.items() if s.simulable)
SPLIT_BACKWARD: frozenset[str] = frozenset(n for n in SIMULABLE if SCHEDULES[n].split_backward)
_ALIASES: dict[str, str] = {a: s.name for s in SCHEDULES.values() for a in (s.name, *s.aliases)}


def lookup_schedule(name: str) -> ScheduleSpec | None:
    """The schedule called ``name`` (its name or an alias, any case), or None."""
    key = _ALIASES.get(str(name).strip().lower())
    return None if key is None else SCHEDULES[key]


class Op(NamedTuple):
    """One compute op of a rank: ``kind`` in F/B/W, its microbatch and model chunk."""

    kind: str
    microbatch: int
    chunk: int = 0


@dataclass(frozen=True)
class Schedule:
    """The op order of every rank; ``ranks[r]`` is rank ``r``'s ops in execution order."""

    name: str
    stages: int
    microbatches: int
    chunks: int
    ranks: tuple[tuple[Op, ...], ...]

    @property
    def split_backward(self) -> bool:
        """True when B and W are separate ops (zero-bubble schedules)."""
        return any(op.kind == "W" for lane in self.ranks for op in lane)

    @property
    def n_ops(self) -> int:
        return sum(len(lane) for lane in self.ranks)

    def __post_init__(self) -> None:
        kinds = ("F", "B", "W") if self.split_backward else ("F", "B")
        want = sorted((k, mb, c) for k in kinds for mb in range(self.microbatches)
                      for c in range(self.chunks))
        for r, lane in enumerate(self.ranks):
            if sorted((op.kind, op.microbatch, op.chunk) for op in lane) != want:
                raise ValueError(f"schedule {self.name}: rank {r} does not run every op once")


@dataclass(frozen=True)
class ScheduleGraph:
    """A schedule's ops as flat arrays (lane order, rank by rank) plus its dependency graph."""

    schedule: Schedule
    graph: OpGraph
    stage: np.ndarray  # rank (pipeline stage) of each op
    chunk: np.ndarray
    microbatch: np.ndarray
    kind: np.ndarray  # index into KINDS

    @property
    def virtual_stage(self) -> np.ndarray:
        return self.chunk * self.schedule.stages + self.stage


def _check(name: str, stages: int, microbatches: int, chunks: int) -> None:
    if name not in SIMULABLE:
        raise BubblecastError(f"--schedule: unknown schedule '{name}' "
                              f"(known: {', '.join(SIMULABLE)})")
    for field, value in (("--stages", stages), ("--microbatches", microbatches),
                         ("--chunks", chunks)):
        if int(value) != value or value < 1:
            raise BubblecastError(f"{field}: must be a positive integer, got {value}")
    if chunks != 1 and not SCHEDULES[name].multi_chunk:
        raise BubblecastError(f"--chunks: only the interleaved schedule has model chunks "
                              f"(got --chunks {chunks} with {name})")
    if name == "interleaved" and stages > 1 and microbatches % stages:
        raise BubblecastError(f"--microbatches: interleaved needs a multiple of --stages "
                              f"({microbatches} is not a multiple of {stages}), as Megatron does")


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
    """Megatron-LM's ``forward_backward_pipelining_with_interleaving`` order."""
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


def build_schedule(name: str, stages: int, microbatches: int, chunks: int = 1) -> Schedule:
    """The schedule ``name`` for ``stages`` ranks, ``microbatches`` and ``chunks`` per rank."""
    _check(name, stages, microbatches, chunks)
    if name == "interleaved":
        lanes = interleaved(stages, microbatches, chunks)
    else:
        builders = {"gpipe": gpipe, "1f1b": one_f_one_b, "zb-h1": zb_h1, "zb-h2": zb_h2}
        lanes = builders[name](stages, microbatches)
    return Schedule(name, stages, microbatches, chunks, tuple(tuple(lane) for lane in lanes))


def build_graph(schedule: Schedule) -> ScheduleGraph:
    """The schedule's dependency graph under SPEC §2 (deps with lag 1 pay ``comm``).

    F of virtual stage ``s`` waits for F of the same microbatch at ``s - 1`` (the order wraps
    from the last rank's chunk ``c`` to the first rank's chunk ``c + 1``); B waits for B at
    ``s + 1``, and the last virtual stage's B for its own F; W waits for its own B. Same-rank
    dependencies pay no communication; a schedule whose order contradicts its dependencies
    raises ``ValueError`` (a deadlock).
    """
    p, v = schedule.stages, schedule.chunks
    last = p * v - 1
    stage, chunk, mb, kind = [], [], [], []
    for r, lane in enumerate(schedule.ranks):
        for op in lane:
            stage.append(r)
            chunk.append(op.chunk)
            mb.append(op.microbatch)
            kind.append(KINDS.index(op.kind))
    stage_a, chunk_a = np.array(stage, dtype=np.int64), np.array(chunk, dtype=np.int64)
    mb_a, kind_a = np.array(mb, dtype=np.int64), np.array(kind, dtype=np.int64)
    n = len(stage)
    vs = chunk_a * p + stage_a
    index = {key: i for i, key in enumerate(zip(kind, mb, vs.tolist(), strict=True))}
    lane_start = np.r_[0, np.cumsum([len(lane) for lane in schedule.ranks])[:-1]]
    prev = np.arange(n) - 1
    prev[lane_start] = -1
    deps, lags = [], []
    for i in range(n):
        k, m_, s = kind[i], mb[i], int(vs[i])
        if k == 0 and s > 0:
            src = (0, m_, s - 1)
        elif k == 1:
            src = (1, m_, s + 1) if s < last else (0, m_, s)
        elif k == 2:
            src = (1, m_, s)
        else:
            continue
        j = index[src]
        deps.append((j, i))
        lags.append(0.0 if stage[j] == stage[i] else 1.0)
    graph = OpGraph(stage_a, prev, np.array(deps, dtype=np.int64).reshape(-1, 2),
                    np.array(lags, dtype=np.float64))
    graph.levels()  # raises on a deadlocked order
    return ScheduleGraph(schedule, graph, stage_a, chunk_a, mb_a, kind_a)


@lru_cache(maxsize=64)
def schedule_graph(name: str, stages: int, microbatches: int, chunks: int = 1) -> ScheduleGraph:
    """Cached ``build_graph(build_schedule(...))`` (the engine's plan is cached with it)."""
    return build_graph(build_schedule(name, stages, microbatches, chunks))


def to_torch_actions(schedule: Schedule) -> dict[int, list[str]]:
    """Per rank, the ops as torch.distributed.pipelining ``_Action`` strings.

    The format is ``{stage_index}{type}{microbatch}`` with the global (virtual) stage index
    ``chunk * P + rank`` (torch's looped placement), ``F`` forward, ``B`` full backward and,
    for split schedules, ``I`` (backward-input) and ``W`` (backward-weight), e.g. ``"0F1"``,
    ``"9I0"``, ``"1W3"``; ``torch...schedules._Action.from_str`` parses each string.
    """
    b = "I" if schedule.split_backward else "B"
    names = {"F": "F", "B": b, "W": "W"}
    return {r: [f"{op.chunk * schedule.stages + r}{names[op.kind]}{op.microbatch}"
                for op in lane] for r, lane in enumerate(schedule.ranks)}
