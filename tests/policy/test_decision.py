"""Decision: the one record a policy returns; JSON round trip and validation."""

import pytest

from bubblecast.errors import BubblecastError
from bubblecast.policy.actions import NoOp, Repartition
from bubblecast.policy.decision import Decision


def test_round_trip_keeps_action_and_numbers():
    d = Decision(Repartition((3, 5)), 1.5, 1.25, 0.4, "stage 0 slow")
    j = d.to_json()
    assert j == {"action": {"action": "repartition", "partition": [3, 5]},
                 "predicted_step_s": 1.5, "predicted_step_with_action_s": 1.25,
                 "migration_s": 0.4, "reason": "stage 0 slow"}
    assert Decision.from_json(j) == d
    assert d.acts and d.predicted_saving_s == pytest.approx(0.25)


def test_keep_takes_the_noop_reason_and_unknown_numbers_stay_none():
    d = Decision.keep("holding")
    assert d.action == NoOp(reason="holding") and d.reason == "holding"
    assert not d.acts and d.predicted_saving_s is None
    assert Decision(NoOp(reason="why")).reason == "why"
    assert Decision.from_json(d.to_json()) == d


@pytest.mark.parametrize("obj", [
    {"predicted_step_s": 1.0},
    {"action": {"action": "noop"}, "migration_s": "x"},
    {"action": {"action": "noop"}, "predicted_step_s": -1.0},
    {"action": {"action": "noop"}, "reason": 3},
    {"action": {"action": "fly"}},
])
def test_bad_json_names_the_field(obj):
    with pytest.raises(BubblecastError, match="decision|action"):
        Decision.from_json(obj)
