"""Pipeline schedules as plain data: the ordered compute ops of every pipeline rank.

A :class:`Schedule` lists, per rank (pipeline stage), its ops ``Op(kind, microbatch, chunk)``
in execution order, with ``kind`` one of ``F`` (forward), ``B`` (backward; the whole backward
where the schedule does not split it) and ``W`` (weight gradient, split schedules only), and
the placement of its model chunks (rank ``r`` chunk ``c`` is virtual stage ``c * P + r`` in
looped schedules, ``r`` and ``2P - 1 - r`` in V-shape ones). Simulable (``build_schedule``
names; every row of :data:`SCHEDULES` with ``simulable``):

- ``gpipe``: all forwards, then all backwards (Huang et al. 2019).
- ``1f1b``: ``P - r - 1`` warm-up forwards on rank ``r``, then one forward / one backward,
  then the remaining backwards (PipeDream-Flush, Narayanan et al. 2021).
- ``interleaved``: Megatron-LM's interleaved 1F1B with ``V`` model chunks per rank (torch's
  Interleaved1F1B order when ``M`` is not a multiple of ``P``).
- ``looped-bfs``: breadth-first looping (torch's ScheduleLoopedBFS).
- ``zb-h1``: the zero-bubble paper's ZB-H1 (Qi et al. 2023): 1F1B with B split from W and rank
  ``r`` deferring its first ``r`` W passes into the tail bubble (1F1B's memory).
- ``zb-h2``: ZB-H2: ``2(P - r - 1) + 1`` forwards before the first B fill the warm-up bubble,
  W passes wait as long as activation memory (``2P - 1`` microbatches) allows and fill the
  remaining gaps; the tail becomes a parallelogram.
- ``zb-interleaved``: torch's ScheduleInterleavedZeroBubble (ZB1P over ``V`` chunks).
- ``zbv`` (alias ``zb-v``): the paper's V-shape ZB-V, as torch's ScheduleZBVZeroBubble.
- ``dualpipev``: DeepSeek's DualPipe in V form, as torch's ScheduleDualPipeV.

Besides names, ``torch:<ClassName>`` simulates the order torch itself generates for one of
its multi-stage classes and ``csv:FILE`` an order in torch's CSV format
(:mod:`bubblecast.sim.torch_actions`). :func:`build_graph` turns a schedule into the engine's
:class:`OpGraph` under the SPEC §2 communication model, and :func:`to_torch_actions` exports
torch.distributed.pipelining's action-list notation.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from bubblecast.errors import BubblecastError
from bubblecast.sim import orders, vshape
from bubblecast.sim.engine import OpGraph
from bubblecast.sim.orders import Op
from bubblecast.sim.schedule_table import (
    SCHEDULES,
    SIMULABLE,
    SOURCES,
    SPLIT_BACKWARD,
    ScheduleSpec,
    is_sourced,
    lookup_schedule,
)

__all__ = ["KINDS", "SCHEDULES", "SIMULABLE", "SOURCES", "SPLIT_BACKWARD", "Op", "Schedule",
           "ScheduleGraph", "ScheduleSpec", "build_graph", "build_schedule", "check_schedule",
           "is_sourced", "lookup_schedule", "schedule_graph", "to_torch_actions", "vstage_ranks"]

KINDS: tuple[str, ...] = ("F", "B", "W")
def vstage_ranks(name: str, stages: int, chunks: int) -> np.ndarray:
    """``(stages * chunks,)``: the rank running each virtual stage of schedule ``name``
    (looped ``v % P``; V-shape ``v`` then ``2P - 1 - v``; a ``torch:``/``csv:`` order as it
    places them). Unknown names are taken as looped."""
    v = np.arange(stages * chunks)
    spec = lookup_schedule(name)
    style = spec.style if spec is not None else "loop"
    if is_sourced(name):
        from bubblecast.sim import torch_actions

        kind, _, arg = name.partition(":")
        if kind == "torch":
            style = torch_actions.TORCH_MULTI.get(arg, "loop")
        else:
            try:
                table = np.asarray(torch_actions.csv_lanes(arg)[1], dtype=np.int64)
            except BubblecastError:
                table = np.zeros(0)
            if table.shape == (stages, chunks):
                out = np.empty(stages * chunks, dtype=np.int64)
                out[table] = np.arange(stages)[:, None]
                return out
    if style == "v" and chunks == 2:
        return np.where(v < stages, v, 2 * stages - 1 - v)
    return v % stages


@dataclass(frozen=True)
class Schedule:
    """The op order of every rank; ``ranks[r]`` is rank ``r``'s ops in execution order and
    ``placement[r]`` its virtual stages in chunk order (empty: looped, ``c * P + r``)."""

    name: str
    stages: int
    microbatches: int
    chunks: int
    ranks: tuple[tuple[Op, ...], ...]
    placement: tuple[tuple[int, ...], ...] = ()

    @property
    def split_backward(self) -> bool:
        """True when B and W are separate ops (zero-bubble schedules)."""
        return any(op.kind == "W" for lane in self.ranks for op in lane)

    @property
    def n_ops(self) -> int:
        return sum(len(lane) for lane in self.ranks)

    @property
    def vstages(self) -> np.ndarray:
        """``(stages, chunks)``: the virtual stage of each rank's chunk."""
        if self.placement:
            return np.array(self.placement, dtype=np.int64).reshape(self.stages, self.chunks)
        return np.arange(self.chunks)[None, :] * self.stages + np.arange(self.stages)[:, None]

    def __post_init__(self) -> None:
        if len(self.ranks) != self.stages:
            raise ValueError(f"schedule {self.name}: {len(self.ranks)} lanes, {self.stages} stages")
        if sorted(self.vstages.reshape(-1).tolist()) != list(range(self.stages * self.chunks)):
            raise ValueError(f"schedule {self.name}: placement {self.placement} does not hold "
                             f"each virtual stage once")
        want = sorted((k, mb, c) for k in ("F", "B") for mb in range(self.microbatches)
                      for c in range(self.chunks))
        for r, lane in enumerate(self.ranks):
            got = [(op.kind, op.microbatch, op.chunk) for op in lane]
            w = [x for x in got if x[0] == "W"]
            if sorted(x for x in got if x[0] != "W") != want or len(set(w)) != len(w) or \
                    not {("B", mb, c) for _, mb, c in w} <= set(got):
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
    vstage: np.ndarray  # virtual stage (pipeline position of the chunk) of each op
    fused: np.ndarray  # B ops that carry their W too (no separate W op)

    @property
    def virtual_stage(self) -> np.ndarray:
        return self.vstage

    @property
    def rank_of_vstage(self) -> np.ndarray:
        """``(stages * chunks,)``: the rank running each virtual stage."""
        out = np.empty(self.schedule.stages * self.schedule.chunks, dtype=np.int64)
        out[self.schedule.vstages] = np.arange(self.schedule.stages)[:, None]
        return out


def check_schedule(name: str, stages: int, microbatches: int, chunks: int = 1
                   ) -> tuple[str, int]:
    """``(canonical name, chunks)`` of a simulable schedule at this shape, or a one-line
    BubblecastError naming the field. V-shape schedules always have 2 chunks (1 is read as
    the default); a ``torch:``/``csv:`` order is built to check it."""
    for field, value in (("--stages", stages), ("--microbatches", microbatches),
                         ("--chunks", chunks)):
        if isinstance(value, bool) or int(value) != value or value < 1:
            raise BubblecastError(f"{field}: must be a positive integer, got {value}")
    if is_sourced(name):
        sched = build_schedule(name, stages, microbatches, chunks)
        return name, sched.chunks
    spec = lookup_schedule(name)
    if spec is None or not spec.simulable:
        raise BubblecastError(f"--schedule: unknown schedule '{name}' (known: "
                              f"{', '.join(SIMULABLE)}, torch:<ClassName>, csv:FILE)")
    if spec.style == "v":
        if chunks not in (1, 2):
            raise BubblecastError(f"--chunks: {spec.name} holds exactly 2 chunks per rank "
                                  f"(V shape), got {chunks}")
        chunks = 2
    elif chunks != 1 and not spec.multi_chunk:
        multi = ", ".join(n for n in SIMULABLE if SCHEDULES[n].multi_chunk)
        raise BubblecastError(f"--chunks: only {multi} have model chunks "
                              f"(got --chunks {chunks} with {spec.name})")
    if spec.name in ("interleaved", "zb-interleaved") and stages > 1 and chunks > 1:
        rounds = orders.torch_rounds(stages, microbatches)[0]
        if microbatches % rounds:
            raise BubblecastError(f"--microbatches: {spec.name} needs a multiple of {rounds} "
                                  f"microbatches with {stages} stages (got {microbatches}), "
                                  f"as torch does")
    if spec.name == "dualpipev" and microbatches < 2 * stages:
        raise BubblecastError(f"--microbatches: dualpipev needs at least {2 * stages} "
                              f"microbatches with {stages} stages, got {microbatches}")
    return spec.name, int(chunks)


_check = check_schedule

_BUILDERS = {
    "gpipe": lambda p, m, v: orders.gpipe(p, m),
    "1f1b": lambda p, m, v: orders.one_f_one_b(p, m),
    "interleaved": orders.interleaved,
    "looped-bfs": orders.looped_bfs,
    "zb-h1": lambda p, m, v: orders.zb_h1(p, m),
    "zb-h2": lambda p, m, v: orders.zb_h2(p, m),
    "zb-interleaved": lambda p, m, v: orders.torch_looped_lanes(p, m, v, zero_bubble=True),
    "zbv": lambda p, m, v: vshape.zbv(p, m),
    "dualpipev": lambda p, m, v: vshape.dualpipev(p, m),
}


def build_schedule(name: str, stages: int, microbatches: int, chunks: int = 1) -> Schedule:
    """The schedule ``name`` for ``stages`` ranks, ``microbatches`` and ``chunks`` per rank
    (a name or alias of :data:`SCHEDULES`, ``torch:<ClassName>`` or ``csv:FILE``)."""
    if is_sourced(name):
        return _sourced(name, stages, microbatches, chunks)
    canon, chunks = check_schedule(name, stages, microbatches, chunks)
    lanes = _BUILDERS[canon](stages, microbatches, chunks)
    placement: tuple[tuple[int, ...], ...] = ()
    if SCHEDULES[canon].style == "v":
        placement = tuple((r, 2 * stages - 1 - r) for r in range(stages))
    return Schedule(canon, stages, microbatches, chunks, tuple(tuple(lane) for lane in lanes),
                    placement)


def _sourced(name: str, stages: int, microbatches: int, chunks: int) -> Schedule:
    """A ``torch:<ClassName>`` or ``csv:FILE`` schedule; its shape must match the given one
    (a V-shape torch class, or a file, fixes the chunks: 1 is read as "as the order says")."""
    from bubblecast.sim import torch_actions

    kind, _, arg = name.partition(":")
    if kind == "torch":
        if torch_actions.TORCH_MULTI.get(arg) == "v":
            chunks = 2 if chunks == 1 else chunks
        lanes, placement = torch_actions.torch_lanes(arg, stages, microbatches, chunks)
    else:
        lanes, placement = torch_actions.csv_lanes(arg)
    got_chunks = len(placement[0]) if placement else 1
    got_mb = 1 + max((op.microbatch for lane in lanes for op in lane), default=-1)
    for field, given, got in (("--stages", stages, len(lanes)),
                              ("--microbatches", microbatches, got_mb),
                              ("--chunks", chunks, got_chunks)):
        if given != got and not (field == "--chunks" and given == 1):
            raise BubblecastError(f"--schedule {name}: the order has {got} for {field}, "
                                  f"{given} was given")
    try:
        return Schedule(name, len(lanes), got_mb, got_chunks,
                        tuple(tuple(lane) for lane in lanes), tuple(placement))
    except ValueError as exc:
        raise BubblecastError(f"--schedule {name}: {exc}") from None


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
    table = schedule.vstages
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
    vs = table[stage_a, chunk_a]
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
    has_w = {(mb[i], int(vs[i])) for i in range(n) if kind[i] == 2}
    fused = np.array([kind[i] == 1 and (mb[i], int(vs[i])) not in has_w for i in range(n)],
                     dtype=bool)
    return ScheduleGraph(schedule, graph, stage_a, chunk_a, mb_a, kind_a, vs, fused)


def schedule_graph(name: str, stages: int, microbatches: int, chunks: int = 1) -> ScheduleGraph:
    """Cached ``build_graph(build_schedule(...))`` (the engine's plan is cached with it); a
    ``csv:FILE`` entry is rebuilt when the file changes."""
    stamp = 0.0
    if str(name).startswith("csv:"):
        try:
            stamp = Path(name[4:]).stat().st_mtime
        except OSError:
            stamp = -1.0
    else:
        spec = lookup_schedule(name)
        if spec is not None and spec.style == "v" and chunks == 1:
            chunks = 2
    return _schedule_graph(name, stages, microbatches, chunks, stamp)


@lru_cache(maxsize=64)
def _schedule_graph(name: str, stages: int, microbatches: int, chunks: int,
                    stamp: float) -> ScheduleGraph:
    try:
        return build_graph(build_schedule(name, stages, microbatches, chunks))
    except ValueError as exc:
        if is_sourced(name):
            raise BubblecastError(f"--schedule {name}: {exc}") from None
        raise


def to_torch_actions(schedule: Schedule) -> dict[int, list[str]]:
    """Per rank, the ops as torch.distributed.pipelining ``_Action`` strings.

    The format is ``{stage_index}{type}{microbatch}`` with the global (virtual) stage index
    of the op's chunk (``chunk * P + rank`` looped, ``r`` / ``2P - 1 - r`` V-shape), ``F``
    forward, ``B`` full backward, ``I`` (backward-input) and ``W`` (backward-weight) where the
    backward is split, e.g. ``"0F1"``, ``"9I0"``, ``"1W3"``;
    ``torch...schedules._Action.from_str`` parses each string.
    """
    from bubblecast.sim.torch_actions import actions_of

    return actions_of(schedule.ranks, tuple(map(tuple, schedule.vstages.tolist())))
