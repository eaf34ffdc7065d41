"""THE schedule table: every pipeline schedule bubblecast knows, as plain data.

No numpy or torch here, so the CLI's option help (``simulate --schedule``) can list the
schedules from this table at start-up; :mod:`bubblecast.sim.schedules` builds their orders.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SCHEDULES", "SIMULABLE", "SOURCES", "SPLIT_BACKWARD", "ScheduleSpec",
           "is_sourced", "lookup_schedule", "schedule_help"]


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


#: Every schedule bubblecast knows. A new schedule gets a row here (and a builder in
#: ``_BUILDERS`` when it is simulable).
SCHEDULES: dict[str, ScheduleSpec] = {s.name: s for s in (
    ScheduleSpec("gpipe", True, "ScheduleGPipe", False, "loop", False, False, 1,
                 ("schedulegpipe",)),
    ScheduleSpec("1f1b", True, "Schedule1F1B", False, "loop", False, False, 1,
                 ("schedule1f1b",)),
    ScheduleSpec("interleaved", True, "ScheduleInterleaved1F1B", True, "loop", False, True, 2,
                 ("interleaved1f1b", "scheduleinterleaved1f1b")),
    ScheduleSpec("looped-bfs", True, "ScheduleLoopedBFS", True, "loop", False, True, 2,
                 ("loopedbfs", "scheduleloopedbfs")),
    ScheduleSpec("zb-h1", True, "ScheduleInterleavedZeroBubble", True, "loop", True, False, 1,
                 ("zbh1",)),
    ScheduleSpec("zb-h2", True, None, False, "loop", True, False, 1, ("zbh2",)),
    ScheduleSpec("zb-interleaved", True, "ScheduleInterleavedZeroBubble", True, "loop", True,
                 True, 2, ("interleaved-zb", "interleavedzerobubble",
                           "scheduleinterleavedzerobubble")),
    ScheduleSpec("zbv", True, "ScheduleZBVZeroBubble", True, "v", True, True, 2,
                 ("zb-v", "zbvzerobubble", "schedulezbvzerobubble")),
    ScheduleSpec("dualpipev", True, "ScheduleDualPipeV", True, "v", True, True, 2,
                 ("scheduledualpipev",)),
)}  # fmt: skip
#: Names of the schedules :mod:`bubblecast.sim.schedules` builds (``--schedule`` choices).
SIMULABLE: tuple[str, ...] = tuple(n for n, s in SCHEDULES.items() if s.simulable)
SPLIT_BACKWARD: frozenset[str] = frozenset(n for n in SIMULABLE if SCHEDULES[n].split_backward)
_ALIASES: dict[str, str] = {a: s.name for s in SCHEDULES.values() for a in (s.name, *s.aliases)}
#: Prefixes of schedules given by their op order rather than by name.
SOURCES: tuple[str, ...] = ("torch:", "csv:")


def lookup_schedule(name: str) -> ScheduleSpec | None:
    """The schedule called ``name`` (its name or an alias, any case), or None."""
    key = _ALIASES.get(str(name).strip().lower())
    return None if key is None else SCHEDULES[key]


def is_sourced(name: str) -> bool:
    """True for ``torch:<ClassName>`` and ``csv:FILE`` schedules (orders, not names)."""
    return str(name).startswith(SOURCES)


def schedule_help() -> str:
    """The ``--schedule`` help: every simulable name (aliases in brackets) and the sources."""
    names = [s.name + (f" ({', '.join(a for a in s.aliases if '-' in a)})"
                       if any("-" in a for a in s.aliases) else "")
             for s in SCHEDULES.values() if s.simulable]
    classes = sorted({s.torch_class for s in SCHEDULES.values() if s.multi and s.torch_class})
    return (f"{', '.join(names)}; torch:<ClassName> (the order torch generates for "
            f"{', '.join(classes)}); csv:FILE (torch's schedule CSV).")
