"""The worker writes its checkpoint schedule as the run's calendar (known-future covariate)."""

from __future__ import annotations

from types import SimpleNamespace

from bubblecast.dataset.covariates import _calendar
from bubblecast.runtime.train_worker import checkpoint_calendar


def test_evenly_spaced_checkpoints_become_a_calendar_the_dataset_reads() -> None:
    cal = checkpoint_calendar({20: "a", 40: "b", 60: "c"})
    assert cal == {"checkpoint_every": 20, "checkpoint_first": 20}
    assert _calendar(SimpleNamespace(extra={"calendar": cal})) == {"checkpoint": (20, 20)}
    one = checkpoint_calendar({30: "a"})
    assert one["checkpoint_first"] == 30 and one["checkpoint_every"] > 10**6


def test_no_or_irregular_checkpoints_give_no_calendar() -> None:
    assert checkpoint_calendar({}) == {}
    assert checkpoint_calendar({10: "a", 20: "b", 50: "c"}) == {}
