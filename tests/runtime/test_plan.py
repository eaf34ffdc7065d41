"""Plans, schedule names and the request validation the CLI runs before launching."""

from __future__ import annotations

import pytest

from bubblecast.errors import BubblecastError
from bubblecast.runtime.plan import SCHEDULES, check_plan, even_partition, resolve_schedule
from bubblecast.runtime.train_config import ModelSpec, TrainConfig


def test_schedule_names_and_aliases() -> None:
    assert resolve_schedule("GPipe").name == "gpipe"
    assert resolve_schedule("ScheduleInterleaved1F1B").name == "interleaved"
    assert resolve_schedule("ZBVZeroBubble").name == "zbv"
    assert resolve_schedule("DualPipeV").torch_class == "ScheduleDualPipeV"
    with pytest.raises(BubblecastError, match="not shipped"):
        resolve_schedule("zb-h2")
    with pytest.raises(BubblecastError, match="unknown schedule 'pipedream'"):
        resolve_schedule("pipedream")


def test_even_partition() -> None:
    assert even_partition(8, 3) == (3, 3, 2)
    assert sum(even_partition(17, 5)) == 17
    with pytest.raises(BubblecastError):
        even_partition(2, 3)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"partition": [3, 4]}, "sums to 7"),
    ({"partition": [8, 0]}, "leaves a stage empty"),
    ({"partition": [2, 2, 4]}, "3 entries for 2"),
    ({"stages": 9}, "need at least 9 layers"),
    ({"schedule": "1f1b", "microbatches": 1}, "at least as many micro-batches"),
    ({"schedule": "dualpipev", "microbatches": 3}, "at least 4 micro-batches"),
    ({"schedule": "interleaved", "stages": 2, "microbatches": 5}, "multiple of 2"),
    ({"schedule": "zbv", "chunks": 3}, "exactly 2 chunks"),
    ({"schedule": "gpipe", "chunks": 2}, "one chunk per rank"),
    ({"batch_size": 6}, "does not split into 4"),
])
def test_check_plan_refuses(kwargs: dict, message: str) -> None:
    args = {"schedule": "1f1b", "stages": 2, "microbatches": 4, "layers": 8, "batch_size": 8}
    args.update(kwargs)
    with pytest.raises(BubblecastError, match=message):
        check_plan(**args)


def test_loop_and_v_ownership() -> None:
    loop = check_plan("interleaved", 2, 4, 8, partition=[1, 2, 3, 2])
    assert loop.vstages_of(0) == [0, 2] and loop.vstages_of(1) == [1, 3]
    assert loop.owner() == [0, 1, 1, 0, 0, 0, 1, 1]
    assert loop.layers_of(1) == [1, 2, 6, 7]
    v = check_plan("zbv", 2, 4, 8)
    assert v.vstages_of(0) == [0, 3] and v.vstages_of(1) == [1, 2]
    assert [v.chunk_of(s) for s in range(4)] == [0, 0, 1, 1]
    assert v.owner() == [0, 0, 1, 1, 1, 1, 0, 0]
    for name, info in SCHEDULES.items():
        plan = check_plan(name, 2, 4, 8)
        assert plan.virtual_stages == 2 * info.default_chunks
        assert sorted(i for r in range(2) for i in plan.layers_of(r)) == list(range(8))


def test_train_config_validation_and_json() -> None:
    cfg = TrainConfig(model=ModelSpec(kind="gpt", layers=6), stages=2, microbatches=2,
                      partition=(2, 4), batch_size=4, inject="rank=1,factor=2")
    again = TrainConfig.from_json(cfg.to_json())
    assert again == cfg and again.plan.partition == (2, 4)
    with pytest.raises(BubblecastError, match="rank 2 does not exist"):
        TrainConfig(stages=2, inject="rank=2,factor=2")
    with pytest.raises(BubblecastError, match="gpt needs >= 3 layers"):
        ModelSpec(kind="gpt", layers=2)
    with pytest.raises(BubblecastError, match="not divisible by 3 heads"):
        ModelSpec(kind="gpt", hidden=16, heads=3)
    with pytest.raises(BubblecastError, match="--optimizer"):
        TrainConfig(optimizer="lamb")
