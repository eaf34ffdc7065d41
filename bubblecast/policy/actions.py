"""Actions a policy takes and the runtime applies; JSON-serialisable, one form everywhere.

JSON form: ``{"action": "repartition", "partition": [4, 4]}``, ``{"action":
"set_microbatches", "microbatches": 8}``, ``{"action": "set_schedule", "schedule": "1f1b"}``,
``{"action": "noop", "reason": "..."}``, ``{"action": "plan_work", "counts": [2, 2],
"microbatches": [[[0, 3], [1]], [[2], [4, 5]]]}`` (one step's documents: replica ``r``'s
``j``-th micro-batch in run order holds the documents, by index into the step's batch, of
``microbatches[r][j]``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from bubblecast.errors import BubblecastError


@dataclass(frozen=True)
class Repartition:
    """Move layers so that stage ``s`` holds ``partition[s]`` contiguous layers."""

    partition: tuple[int, ...]
    kind = "repartition"

    def __post_init__(self) -> None:
        object.__setattr__(self, "partition", tuple(int(x) for x in self.partition))
        if not self.partition or any(x < 1 for x in self.partition):
            raise BubblecastError(f"partition {list(self.partition)}: every stage needs >= 1 layer")


@dataclass(frozen=True)
class SetMicrobatches:
    """Change the number of micro-batches per step."""

    microbatches: int
    kind = "set_microbatches"

    def __post_init__(self) -> None:
        if int(self.microbatches) < 1:
            raise BubblecastError(f"microbatches: must be >= 1, got {self.microbatches}")


@dataclass(frozen=True)
class SetSchedule:
    """Switch the pipeline schedule (a SPEC schedule name or a torch schedule class name)."""

    schedule: str
    kind = "set_schedule"


@dataclass(frozen=True)
class NoOp:
    """Keep the current plan; ``reason`` says why."""

    reason: str = ""
    kind = "noop"


@dataclass(frozen=True)
class PlanWork:
    """One step's work plan: ``microbatches[r][j]`` are the indices (into the step's documents,
    in the data loader's order) of replica ``r``'s ``j``-th micro-batch, in run order;
    ``counts[r]`` is replica ``r``'s number of micro-batches. Indices are integers >= 0 and
    no document appears twice (the planner also checks that each appears once and that the
    token budget holds: it knows the lengths)."""

    counts: tuple[int, ...]
    microbatches: tuple[tuple[tuple[int, ...], ...], ...]
    kind = "plan_work"

    def __post_init__(self) -> None:
        try:
            plan = tuple(tuple(tuple(int(i) for i in mb) for mb in rep)
                         for rep in self.microbatches)
            counts = tuple(int(c) for c in self.counts)
        except (TypeError, ValueError):
            raise BubblecastError("plan_work microbatches: expected lists of lists of document "
                                  "indices per replica, and integer counts") from None
        if counts != tuple(len(rep) for rep in plan):
            raise BubblecastError(f"plan_work counts {list(counts)}: the plan has "
                                  f"{[len(rep) for rep in plan]} micro-batches per replica")
        flat = [i for rep in plan for mb in rep for i in mb]
        if any(i < 0 for i in flat) or len(set(flat)) != len(flat):
            raise BubblecastError("plan_work microbatches: document indices must be >= 0 and "
                                  "each appear once")
        object.__setattr__(self, "microbatches", plan)
        object.__setattr__(self, "counts", counts)


Action = Repartition | SetMicrobatches | SetSchedule | NoOp | PlanWork
_KINDS: dict[str, type] = {c.kind: c for c in (Repartition, SetMicrobatches, SetSchedule, NoOp,
                                               PlanWork)}


def _plain(value: Any) -> Any:
    """Tuples, nested at any depth, as lists (the JSON form)."""
    return [_plain(v) for v in value] if isinstance(value, tuple) else value


def action_to_json(action: Action) -> dict[str, Any]:
    """The JSON form: ``{"action": kind, field: value...}``, tuples as lists (every field
    is a number, a string or tuples of them, so no deep copy is needed)."""
    out: dict[str, Any] = {"action": action.kind}
    for f in fields(action):
        out[f.name] = _plain(getattr(action, f.name))
    return out


def action_from_json(obj: dict[str, Any]) -> Action:
    """Parse the JSON form; raise BubblecastError naming the bad field."""
    if not isinstance(obj, dict) or "action" not in obj:
        raise BubblecastError("action: expected an object with an 'action' field")
    cls = _KINDS.get(obj["action"])
    if cls is None:
        known = ", ".join(_KINDS)
        raise BubblecastError(f"action: unknown kind {obj['action']!r} (known: {known})")
    fields = {k: v for k, v in obj.items() if k != "action"}
    try:
        return cls(**fields)
    except TypeError as exc:
        raise BubblecastError(f"action '{obj['action']}': {exc}") from None
