"""Pipeline plans: which schedule, how many ranks, chunks and micro-batches, which layers where.

A :class:`Plan` is what the trainer runs and what an action changes. :func:`check_plan` refuses
a plan torch's schedules would reject (or that leaves a stage empty) with one line, so the CLI
can refuse a bad request before it launches anything. Pure Python: no torch import.
"""

from __future__ import annotations

from dataclasses import dataclass

from bubblecast.errors import BubblecastError


@dataclass(frozen=True)
class ScheduleInfo:
    """One schedule torch ships, under its bubblecast name."""

    name: str  # bubblecast name, written to RunMeta.schedule
    torch_class: str  # class in torch.distributed.pipelining
    multi: bool  # takes a list of stages (PipelineScheduleMulti)
    style: str  # "loop" (stage v on rank v % P) or "v" (rank r holds r and 2P-1-r)
    split_backward: bool  # backward split into input (B) and weight (W) passes
    default_chunks: int


SCHEDULES: dict[str, ScheduleInfo] = {
    s.name: s
    for s in (
        ScheduleInfo("gpipe", "ScheduleGPipe", False, "loop", False, 1),
        ScheduleInfo("1f1b", "Schedule1F1B", False, "loop", False, 1),
        ScheduleInfo("interleaved", "ScheduleInterleaved1F1B", True, "loop", False, 2),
        ScheduleInfo("zb-h1", "ScheduleInterleavedZeroBubble", True, "loop", True, 1),
        ScheduleInfo("zb-interleaved", "ScheduleInterleavedZeroBubble", True, "loop", True, 2),
        ScheduleInfo("zbv", "ScheduleZBVZeroBubble", True, "v", True, 2),
        ScheduleInfo("dualpipev", "ScheduleDualPipeV", True, "v", True, 2),
    )
}
_ALIASES: dict[str, str] = {
    "gpipe": "gpipe", "schedulegpipe": "gpipe", "1f1b": "1f1b", "schedule1f1b": "1f1b",
    "interleaved": "interleaved", "interleaved1f1b": "interleaved",
    "scheduleinterleaved1f1b": "interleaved", "zb-h1": "zb-h1", "zbh1": "zb-h1",
    "zb-interleaved": "zb-interleaved", "interleaved-zb": "zb-interleaved",
    "interleavedzerobubble": "zb-interleaved", "scheduleinterleavedzerobubble": "zb-interleaved",
    "zbv": "zbv", "zbvzerobubble": "zbv",
    "schedulezbvzerobubble": "zbv", "dualpipev": "dualpipev", "scheduledualpipev": "dualpipev",
}  # fmt: skip


def resolve_schedule(name: str) -> ScheduleInfo:
    """The schedule called ``name`` (a bubblecast name or a torch class name, any case)."""
    key = str(name).strip().lower()
    if key in ("zb-h2", "zbh2"):
        raise BubblecastError("--schedule: zb-h2 is not shipped by torch.distributed.pipelining "
                              f"(runnable: {', '.join(SCHEDULES)})")
    if key not in _ALIASES:
        raise BubblecastError(f"--schedule: unknown schedule '{name}' "
                              f"(choose from {', '.join(SCHEDULES)})")
    return SCHEDULES[_ALIASES[key]]


def even_partition(layers: int, parts: int) -> tuple[int, ...]:
    """``layers`` split into ``parts`` contiguous counts differing by at most one."""
    if parts < 1 or layers < parts:
        raise BubblecastError(f"cannot split {layers} layers into {parts} non-empty stages")
    base, extra = divmod(layers, parts)
    return tuple(base + (1 if i < extra else 0) for i in range(parts))


@dataclass(frozen=True)
class Plan:
    """A validated pipeline plan; build it with :func:`check_plan`.

    ``partition[v]`` is the number of contiguous layers of virtual stage ``v`` (model order);
    there are ``stages * chunks`` virtual stages, ``stages`` ranks.
    """

    schedule: str
    stages: int
    chunks: int
    microbatches: int
    partition: tuple[int, ...]

    @property
    def info(self) -> ScheduleInfo:
        return SCHEDULES[self.schedule]

    @property
    def virtual_stages(self) -> int:
        return self.stages * self.chunks

    @property
    def layers(self) -> int:
        return sum(self.partition)

    def rank_of(self, vstage: int) -> int:
        """The rank that runs virtual stage ``vstage``."""
        p = self.stages
        if self.info.style == "v":
            return vstage if vstage < p else 2 * p - 1 - vstage
        return vstage % p

    def vstages_of(self, rank: int) -> list[int]:
        """Virtual stages of ``rank``, in chunk order (chunk c is the c-th entry)."""
        return [v for v in range(self.virtual_stages) if self.rank_of(v) == rank]

    def chunk_of(self, vstage: int) -> int:
        return self.vstages_of(self.rank_of(vstage)).index(vstage)

    def layer_range(self, vstage: int) -> range:
        start = sum(self.partition[:vstage])
        return range(start, start + self.partition[vstage])

    def owner(self) -> list[int]:
        """``owner()[i]`` is the rank holding global layer ``i``."""
        out: list[int] = []
        for v, n in enumerate(self.partition):
            out += [self.rank_of(v)] * n
        return out

    def layers_of(self, rank: int) -> list[int]:
        return [i for v in self.vstages_of(rank) for i in self.layer_range(v)]


def check_plan(schedule: str, stages: int, microbatches: int, layers: int,
               partition: list[int] | tuple[int, ...] | None = None, chunks: int | None = None,
               batch_size: int | None = None) -> Plan:
    """Validate a plan against the rules torch's schedules enforce; one-line error if not.

    ``partition`` defaults to an even split; ``chunks`` to the schedule's default.
    """
    info = resolve_schedule(schedule)
    for name, value in (("--stages", stages), ("--microbatches", microbatches),
                        ("--layers", layers)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise BubblecastError(f"{name}: must be a positive integer, got {value!r}")
    chunks = info.default_chunks if chunks is None else int(chunks)
    if info.style == "v" and chunks != 2:
        raise BubblecastError(f"--chunks: schedule '{info.name}' needs exactly 2 chunks per rank, "
                              f"got {chunks}")
    if not info.multi and chunks != 1:
        raise BubblecastError(f"--chunks: schedule '{info.name}' runs one chunk per rank, "
                              f"got {chunks}")
    if chunks < 1:
        raise BubblecastError(f"--chunks: must be >= 1, got {chunks}")
    virtual = stages * chunks
    if virtual > layers:
        what = f"{stages} stages" if chunks == 1 else f"{stages} stages x {chunks} chunks"
        raise BubblecastError(f"--stages: {what} need at least {virtual} layers, "
                              f"the model has {layers}")
    if partition is None:
        part = even_partition(layers, virtual)
    else:
        part = tuple(int(x) for x in partition)
        if len(part) != virtual:
            raise BubblecastError(f"--partition: {len(part)} entries for {virtual} "
                                  f"{'stages' if chunks == 1 else 'virtual stages'}")
        if any(x < 1 for x in part):
            raise BubblecastError(f"--partition: {list(part)} leaves a stage empty")
        if sum(part) != layers:
            raise BubblecastError(f"--partition: {list(part)} sums to {sum(part)}, "
                                  f"the model has {layers} layers")
    _check_schedule_fit(info, stages, microbatches, chunks)
    if batch_size is not None and (batch_size < microbatches or batch_size % microbatches):
        raise BubblecastError(f"--batch-size: {batch_size} does not split into "
                              f"{microbatches} equal micro-batches")
    return Plan(info.name, stages, chunks, microbatches, part)


def _check_schedule_fit(info: ScheduleInfo, stages: int, m: int, chunks: int) -> None:
    name = info.name
    if name == "1f1b" and m < stages:
        raise BubblecastError(f"--microbatches: 1f1b needs at least as many micro-batches as "
                              f"stages ({m} < {stages})")
    if name in ("interleaved", "zb-h1", "zb-interleaved"):
        rounds = max(1, m // stages)
        if m % rounds:
            raise BubblecastError(f"--microbatches: {name} needs a multiple of "
                                  f"{rounds} micro-batches with {stages} stages, got {m}")
    if name == "dualpipev" and m < 2 * stages:
        raise BubblecastError(f"--microbatches: dualpipev needs at least {2 * stages} "
                              f"micro-batches with {stages} stages, got {m}")
