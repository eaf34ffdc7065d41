"""Actions a policy takes and the runtime applies; JSON-serialisable, one form everywhere.

JSON form: ``{"action": "repartition", "partition": [4, 4]}``, ``{"action":
"set_microbatches", "microbatches": 8}``, ``{"action": "set_schedule", "schedule": "1f1b"}``,
``{"action": "noop", "reason": "..."}``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
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


Action = Repartition | SetMicrobatches | SetSchedule | NoOp
_KINDS: dict[str, type] = {c.kind: c for c in (Repartition, SetMicrobatches, SetSchedule, NoOp)}


def action_to_json(action: Action) -> dict[str, Any]:
    out: dict[str, Any] = {"action": action.kind}
    for key, value in asdict(action).items():
        out[key] = list(value) if isinstance(value, tuple) else value
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
