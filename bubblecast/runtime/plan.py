"""Pipeline plans: which schedule, how many ranks, chunks and micro-batches, which layers where.

A :class:`Plan` is what the trainer runs and what an action changes. :func:`check_plan` refuses
a plan torch's schedules would reject (or that leaves a stage empty) with one line, so the CLI
can refuse a bad request before it launches anything. Pure Python: no torch import.
"""

from __future__ import annotations

from dataclasses import dataclass

from bubblecast.errors import BubblecastError
from bubblecast.sim.schedules import SCHEDULES as ALL_SCHEDULES
from bubblecast.sim.schedules import ScheduleSpec, lookup_schedule
from bubblecast.sim.shape import PipelineShape, even_partition

#: The runnable schedules (those torch ships), read from THE schedule table
#: (:data:`bubblecast.sim.schedules.SCHEDULES`); ``ScheduleInfo`` is its row type.
ScheduleInfo = ScheduleSpec
SCHEDULES: dict[str, ScheduleSpec] = {n: s for n, s in ALL_SCHEDULES.items() if s.torch_class}


def resolve_schedule(name: str) -> ScheduleSpec:
    """The schedule called ``name`` (a bubblecast name or a torch class name, any case)."""
    spec = lookup_schedule(name)
    if spec is not None and spec.torch_class is None:
        raise BubblecastError(f"--schedule: {spec.name} is not shipped by "
                              f"torch.distributed.pipelining (runnable: {', '.join(SCHEDULES)})")
    if spec is None:
        raise BubblecastError(f"--schedule: unknown schedule '{name}' "
                              f"(choose from {', '.join(SCHEDULES)})")
    return spec


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
    def info(self) -> ScheduleSpec:
        return SCHEDULES[self.schedule]

    @property
    def shape(self) -> PipelineShape:
        """The plan's schedule, stages, microbatches and chunks."""
        return PipelineShape(self.schedule, self.stages, self.microbatches, self.chunks)

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


def _check_schedule_fit(info: ScheduleSpec, stages: int, m: int, chunks: int) -> None:
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
