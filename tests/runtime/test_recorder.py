"""The recorder's public per-step hook: what the controller's telemetry reads (no processes)."""

from __future__ import annotations

import pytest

from bubblecast.errors import BubblecastError
from bubblecast.runtime.recorder import Recorder, StepView
from bubblecast.telemetry.schema import RunMeta


class Stage:
    """A pipeline stage's three op methods, doing nothing."""

    def forward_one_chunk(self, mb: int, *a: object, **k: object) -> int:
        return mb

    backward_one_chunk = backward_weight_one_chunk = forward_one_chunk


def _recorder(record: bool = True) -> tuple[Recorder, Stage]:
    stage = Stage()
    rec = Recorder(run_id="r", rank=0, stage=0, origin_wall=0.0, meta_fn=RunMeta,
                   record=record)
    rec.attach([stage], {0: {}})
    return rec, stage


def test_step_hook_sees_only_the_ending_steps_compute_ops() -> None:
    rec, stage = _recorder()
    seen: list[tuple[int, float, list[str]]] = []

    def hook(view: StepView) -> None:
        seen.append((view.step, view.compute_s(), [op for op, *_ in view.ops()]))

    rec.add_step_hook(hook)
    for step in range(3):
        rec.begin_step(step, 1)
        for mb in range(2):
            stage.forward_one_chunk(mb)
            stage.backward_one_chunk(mb)
        rec.record_optimizer(0.0, 5.0)  # 5 s of optimizer: never counted as compute
        rec.end_step()
    assert [s for s, _, _ in seen] == [0, 1, 2]
    assert all(0.0 <= c < 1.0 for _, c, _ in seen)
    assert seen[-1][2] == ["OPTIMIZER", "B", "F", "B", "F"]  # this step's rows only
    assert len(rec.frame()) == 15


def test_step_hook_needs_a_recording_recorder() -> None:
    from bubblecast.runtime.control.observe import StepProbe

    rec, _ = _recorder(record=False)
    with pytest.raises(ValueError, match="record=True"):
        rec.add_step_hook(lambda view: None)
    with pytest.raises(BubblecastError, match="records telemetry"):
        StepProbe(rec)
