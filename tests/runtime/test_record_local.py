"""``Recording`` step boundaries and ``record`` argument checks, in this process (no ranks)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from bubblecast.errors import BubblecastError
from bubblecast.runtime.rank_recorder import Recorder
from bubblecast.runtime.record import (
    Recording,
    RecordOptions,
    local_layers,
    schedule_name,
    stages_of,
)
from bubblecast.telemetry.schema import RunMeta


class Stage:
    stage_index = 0
    device = torch.device("cpu")

    def __init__(self) -> None:
        self.submod = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())

    def forward_one_chunk(self, mb: int, *a: object, **k: object) -> int:
        return mb

    def backward_one_chunk(self, mb: int, *a: object, **k: object) -> None:
        return None

    backward_weight_one_chunk = backward_one_chunk


class Schedule1F1B:
    """Shaped like torch's single-stage schedules: ``_stage``, ``step``, ``eval``."""

    def __init__(self, mbs: int = 2) -> None:
        self._stage, self._n_microbatches = Stage(), mbs
        self._loss_fn, self._has_backward = object(), True

    def step(self, *args: object, **kwargs: object) -> str:
        for mb in range(self._n_microbatches):
            self._stage.forward_one_chunk(mb)
        if self._has_backward:
            for mb in range(self._n_microbatches):
                self._stage.backward_one_chunk(mb)
        return "out"

    def eval(self, *args: object) -> str:
        self._has_backward = False
        try:
            return self.step(*args)  # as torch does: through the (wrapped) step
        finally:
            self._has_backward = True


def _recording() -> tuple[Recording, Schedule1F1B, torch.optim.Optimizer]:
    schedule = Schedule1F1B()
    param = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([param], lr=0.1)
    rec = Recorder(run_id="r", rank=0, stage=0, origin_wall=0.0, meta_fn=RunMeta)
    recording = Recording(rec, first_step=5, tokens=None)
    recording.attach(schedule, optimizer=opt)
    return recording, schedule, opt


def test_each_schedule_step_is_one_step_with_its_optimizer() -> None:
    recording, schedule, opt = _recording()
    opt.step()  # before any step: not recorded
    assert schedule.step("x") == "out"  # results pass through
    opt.step()
    schedule.eval("x")  # forward only: not a step, not recorded
    schedule._stage.forward_one_chunk(9)  # outside schedule.step: not recorded
    schedule.step("x")
    opt.step()
    recording.close()
    assert recording.step == 7
    frame = recording.frame()
    per_step = frame.groupby(["step", "op"], observed=True).size().unstack()
    assert list(per_step.index) == [5, 6]
    assert per_step["F"].tolist() == [2, 2] and per_step["B"].tolist() == [2, 2]
    assert per_step["OPTIMIZER"].tolist() == [1, 1]
    assert 9 not in set(frame["microbatch"])
    assert frame.loc[frame["op"] == "F", "tokens"].isna().all()  # tokens unknown: null
    assert (frame.loc[frame["op"] == "F", "layers"] == 2).all()  # the submodule's children
    # after close the schedule, its stage and the optimizer are as they were
    assert "step" not in vars(schedule) and not vars(schedule._stage).keys() & {
        "forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk"}
    assert not opt._optimizer_step_pre_hooks and not opt._optimizer_step_post_hooks
    schedule.step("x")
    opt.step()
    assert len(recording.frame()) == len(frame)


def test_detach_pauses_and_attach_resumes_on_the_same_schedule() -> None:
    recording, schedule, opt = _recording()
    schedule.step()
    opt.step()
    recording.end_step()
    recording.detach()
    schedule.step()  # not recorded, not counted
    opt.step()
    recording.attach(schedule)  # the optimizer attached before is timed again
    schedule.step()
    opt.step()
    recording.close()
    frame = recording.frame()
    assert sorted(set(frame["step"])) == [5, 6]
    assert (frame["op"] == "OPTIMIZER").sum() == 2 and (frame["op"] == "F").sum() == 4


def test_end_step_closes_the_step_at_once_and_hooks_see_it() -> None:
    recording, schedule, opt = _recording()
    seen: list[int] = []
    recording.recorder.add_step_hook(lambda view: seen.append(view.step))
    recording.tokens = 16
    schedule.step()
    opt.step()
    recording.end_step()
    assert seen == [5] and recording.step == 6
    opt.step()  # after the step ended: not recorded
    recording.close()
    frame = recording.frame()
    assert (frame["op"] == "OPTIMIZER").sum() == 1
    assert set(frame.loc[frame["op"] == "F", "tokens"]) == {16}


def test_arguments_are_checked() -> None:
    with pytest.raises(BubblecastError, match="flush_every"):
        RecordOptions(flush_every=0)
    with pytest.raises(BubblecastError, match="timing must be"):
        RecordOptions(timing="gpu")
    with pytest.raises(BubblecastError, match="replica 2 is outside"):
        RecordOptions(replica=2, replicas=2)
    with pytest.raises(BubblecastError, match="PipelineStage"):
        stages_of(object())
    from bubblecast.runtime.record import _timer

    with pytest.raises(BubblecastError, match="needs CUDA stages"):
        _timer([Stage()], "device")
    assert _timer([Stage()], "auto") is None


def test_schedule_names_follow_the_schedule_table() -> None:
    zb = type("ScheduleInterleavedZeroBubble", (), {})()
    assert schedule_name(zb, 1) == "zb-h1" and schedule_name(zb, 2) == "zb-interleaved"
    assert schedule_name(type("Mine", (Schedule1F1B,), {})(), 1) == "1f1b"
    assert schedule_name(object(), 1) == "unknown"


def test_default_layers_are_the_stage_submodules_children() -> None:
    stage = Stage()
    stage.stage_index = 3
    layers = local_layers([stage], first={3: 10})
    assert list(layers) == [0] and list(layers[0]) == [10, 11]


def test_set_documents_fills_tokens_tokens_sq_and_documents_per_microbatch(tmp_path) -> None:
    from bubblecast.telemetry import read_events

    schedule = Schedule1F1B(mbs=3)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    rec = Recorder(run_id="r", rank=0, stage=0, origin_wall=0.0, events_dir=str(tmp_path),
                   meta_fn=lambda: RunMeta(schedule="1f1b", microbatches=3), flush_every=1)
    recording = Recording(rec, tokens=64)
    recording.attach(schedule, optimizer=opt)
    lengths = [[3, 4], [10], []]
    recording.set_documents(lengths)
    schedule.step()
    opt.step()
    schedule.step()  # no set_documents: unknown documents, tokens from ``tokens``
    opt.step()
    recording.set_documents([np.array([5, 5], dtype=np.int64), (1,), [2, 2, 2]])
    schedule.step()
    recording.close()
    f = read_events(tmp_path).frame
    assert str(f["documents"].dtype) == "Int32" and f["tokens_sq"].dtype == "float64"
    compute = f.loc[f["op"] != "OPTIMIZER"].set_index(["step", "microbatch", "op"])
    for step, per_mb in ((0, lengths), (2, [[5, 5], [1], [2, 2, 2]])):
        for mb, docs in enumerate(per_mb):
            for op in ("F", "B"):
                row = compute.loc[(step, mb, op)]
                assert row["tokens"] == sum(docs)
                assert row["tokens_sq"] == float(sum(d * d for d in docs))
                assert row["documents"] == len(docs)
    step1 = compute.loc[1]
    assert (step1["tokens"] == 64).all()
    assert step1["tokens_sq"].isna().all() and step1["documents"].isna().all()
    opt_rows = f.loc[f["op"] == "OPTIMIZER"].set_index("step")
    assert opt_rows.loc[0, "tokens_sq"] == 0.0 and opt_rows.loc[0, "documents"] == 0
    assert pd.isna(opt_rows.loc[1, "documents"])


def test_without_set_documents_no_document_columns_are_written() -> None:
    recording, schedule, opt = _recording()
    schedule.step()
    opt.step()
    recording.close()
    frame = recording.frame()
    assert "tokens_sq" not in frame.columns and "documents" not in frame.columns


@pytest.mark.parametrize(("lengths", "message"), [
    ([[1, 2]], "set_documents: lengths has 1 micro-batches, the schedule runs 2"),
    ([[1, -2], [3]], r"set_documents: lengths\[0\]\[1\] is -2: a document length must be "
                     r"an integer >= 0"),
    ([[1], [2.5]], r"set_documents: lengths\[1\]\[0\] is 2.5"),
    ([[1], [True]], r"set_documents: lengths\[1\]\[0\] is True"),
    ([[1], 7], r"set_documents: lengths\[1\] must be a list of document lengths, got int"),
    ("12", "set_documents: lengths must be one list of document lengths per micro-batch"),
])
def test_bad_document_lengths_are_refused_naming_the_argument(lengths, message) -> None:
    recording, schedule, _ = _recording()
    with pytest.raises(BubblecastError, match=message) as err:
        recording.set_documents(lengths)
    assert "\n" not in str(err.value)
    recording.set_documents([[1], [2]])  # a good call after a refused one works
    schedule.step()
    recording.close()
    assert set(recording.frame()["documents"].dropna()) == {1}
