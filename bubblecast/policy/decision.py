"""``Decision``: what a policy returns after a step, recorded as it is everywhere.

Every policy's ``decide(state)`` returns one :class:`Decision`: the action and the numbers the
policy computed to choose it (predicted step times without and with the action, the migration
pause) and a short reason. The controller, the service and offline evaluation record it as it
is; none of them re-derives these numbers. A number the policy did not compute is ``None``.

JSON form: ``{"action": {...action JSON...}, "predicted_step_s": 1.23,
"predicted_step_with_action_s": 1.1, "migration_s": 0.4, "reason": "..."}``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from bubblecast.errors import BubblecastError
from bubblecast.policy.actions import Action, NoOp, action_from_json, action_to_json

_NUMBERS = ("predicted_step_s", "predicted_step_with_action_s", "migration_s")


@dataclass(frozen=True)
class Decision:
    """A policy's action with the numbers behind it.

    ``predicted_step_s``: predicted seconds per step keeping the current plan;
    ``predicted_step_with_action_s``: the same after the action (migration excluded);
    ``migration_s``: the one-off pause the action costs; ``reason``: one line saying why.
    """

    action: Action
    predicted_step_s: float | None = None
    predicted_step_with_action_s: float | None = None
    migration_s: float | None = None
    reason: str = ""

    def __post_init__(self) -> None:
        for name in _NUMBERS:
            value = getattr(self, name)
            if value is None:
                continue
            value = float(value)
            if not math.isfinite(value) or value < 0:
                raise BubblecastError(f"decision {name}: must be finite and >= 0, got {value}")
            object.__setattr__(self, name, value)
        if not self.reason and isinstance(self.action, NoOp):
            object.__setattr__(self, "reason", self.action.reason)

    @classmethod
    def keep(cls, reason: str, **numbers: float | None) -> Decision:
        """Keep the current plan (a :class:`NoOp` carrying ``reason``)."""
        return cls(NoOp(reason=reason), reason=reason, **numbers)

    @property
    def acts(self) -> bool:
        """True when the action changes something (anything but a no-op)."""
        return not isinstance(self.action, NoOp)

    @property
    def predicted_saving_s(self) -> float | None:
        """Predicted seconds saved per step by the action (None when either time is unknown)."""
        if self.predicted_step_s is None or self.predicted_step_with_action_s is None:
            return None
        return self.predicted_step_s - self.predicted_step_with_action_s

    def to_json(self) -> dict[str, Any]:
        return {"action": action_to_json(self.action),
                **{name: getattr(self, name) for name in _NUMBERS}, "reason": self.reason}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Decision:
        """Parse the JSON form; raise BubblecastError naming the bad field."""
        if not isinstance(obj, dict) or "action" not in obj:
            raise BubblecastError("decision: expected an object with an 'action' field")
        numbers: dict[str, float | None] = {}
        for name in _NUMBERS:
            value = obj.get(name)
            if value is not None and (isinstance(value, bool)
                                      or not isinstance(value, int | float)):
                raise BubblecastError(f"decision {name}: expected a number or null, got {value!r}")
            numbers[name] = value
        reason = obj.get("reason", "")
        if not isinstance(reason, str):
            raise BubblecastError(f"decision reason: expected a string, got {reason!r}")
        return cls(action_from_json(obj["action"]), reason=reason, **numbers)
