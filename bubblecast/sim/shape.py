"""``PipelineShape``: the one declaration of a pipeline's shape, and THE ``even_partition``.

A shape is what every layer agrees on about one pipeline replica: its schedule, its ranks
(``stages``), microbatches per step, model chunks per rank and, for timing, the point-to-point
transfer time per op. The simulator, the policies, the runtime's plans and the service all
describe a pipeline with it; whether a shape can be timed (its schedule is simulable and its
numbers fit the schedule's rules) is checked by :func:`bubblecast.sim.steptime.timing_shape`,
whether it can be run by :func:`bubblecast.runtime.plan.check_plan`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bubblecast.errors import BubblecastError
from bubblecast.sim.schedules import SCHEDULES, is_sourced, lookup_schedule


@dataclass(frozen=True)
class PipelineShape:
    """Shape of one pipeline replica: schedule, ranks, microbatches, chunks, p2p time.

    ``schedule`` is a name in :data:`bubblecast.sim.schedules.SCHEDULES` (an alias is stored
    as its name) or a ``torch:<ClassName>`` / ``csv:FILE`` order; ``stages`` the
    ranks; ``chunks`` the model chunks per rank (virtual stage ``c * stages + r`` on rank
    ``r`` for looped schedules); ``comm_s`` the seconds a cross-rank dependency waits (SPEC §2;
    0 when unknown).
    """

    schedule: str = "1f1b"
    stages: int = 1
    microbatches: int = 1
    chunks: int = 1
    comm_s: float = 0.0

    def __post_init__(self) -> None:
        spec = lookup_schedule(self.schedule)
        if spec is not None:
            object.__setattr__(self, "schedule", spec.name)
        elif not is_sourced(self.schedule):
            raise BubblecastError(f"--schedule: unknown schedule '{self.schedule}' "
                                  f"(known: {', '.join(SCHEDULES)})")
        for name in ("stages", "microbatches", "chunks"):
            value = getattr(self, name)
            if isinstance(value, bool) or int(value) != value or value < 1:
                raise BubblecastError(f"--{name}: must be a positive integer, got {value}")
            object.__setattr__(self, name, int(value))
        if not (math.isfinite(self.comm_s) and self.comm_s >= 0):
            raise BubblecastError(f"comm_s: must be finite and >= 0, got {self.comm_s}")

    @property
    def virtual_stages(self) -> int:
        """Model pieces in pipeline order: ``stages * chunks``."""
        return self.stages * self.chunks

    @property
    def split_backward(self) -> bool:
        """True when the schedule runs B and W as separate ops (some of them, for DualPipeV
        and orders that mix full and split backwards)."""
        if is_sourced(self.schedule):
            from bubblecast.sim.schedules import schedule_graph

            return schedule_graph(self.schedule, self.stages, self.microbatches,
                                  self.chunks).schedule.split_backward
        return SCHEDULES[self.schedule].split_backward


def even_partition(layers: int, parts: int) -> tuple[int, ...]:
    """``layers`` split into ``parts`` contiguous counts differing by at most one.

    Convention: the FIRST ``layers % parts`` parts take one extra layer (as the runtime has
    always placed layers, so live partitions do not change), e.g. ``(3, 3, 2)`` for 8 into 3.
    """
    if parts < 1 or layers < parts:
        raise BubblecastError(f"--partition: {layers} layers cannot fill {parts} stages "
                              f"with at least one layer each")
    base, extra = divmod(layers, parts)
    return tuple(base + (1 if i < extra else 0) for i in range(parts))
