"""Slowdown-emulation specs: strict parsing and the per-step multiplier."""

from __future__ import annotations

import pytest

from bubblecast.errors import BubblecastError
from bubblecast.runtime.inject import multiplier, parse_inject


def test_slowdown_ramp_and_end() -> None:
    (inj,) = parse_inject("rank=1,factor=2.0,start=100,ramp=50,end=400")
    assert inj.kind == "slowdown" and inj.rank == 1
    assert inj.multiplier(99) == 1.0
    assert inj.multiplier(100) == pytest.approx(1.0 + 1 / 50)
    assert inj.multiplier(124) == pytest.approx(1.5)
    assert inj.multiplier(149) == pytest.approx(2.0)
    assert inj.multiplier(399) == pytest.approx(2.0)
    assert inj.multiplier(400) == 1.0
    assert inj.to_json() == {"kind": "slowdown", "rank": 1, "factor": 2.0, "start": 100,
                             "ramp": 50, "end": 400}


def test_spikes_and_combination() -> None:
    specs = parse_inject("rank=0,every=50,extra=0.2; rank=0,factor=3,start=10,end=20")
    assert [s.kind for s in specs] == ["spike", "slowdown"]
    assert multiplier(specs, 0, 0) == pytest.approx(1.2)
    assert multiplier(specs, 0, 1) == 1.0
    assert multiplier(specs, 0, 50) == pytest.approx(1.2)
    assert multiplier(specs, 0, 15) == pytest.approx(3.0)
    assert multiplier(specs, 1, 50) == 1.0  # other ranks untouched
    (wide,) = parse_inject("rank=0,every=10,extra=1,length=3,start=5")
    assert [wide.multiplier(s) > 1 for s in (4, 5, 7, 8, 15)] == [False, True, True, False, True]


@pytest.mark.parametrize(("text", "message"), [
    ("rank=1", "'factor' is required"),
    ("factor=2", "'rank' is required"),
    ("rank=1,factor=abc", "'factor' must be a number"),
    ("rank=x,factor=2", "'rank' must be an integer"),
    ("rank=1,factor=2,speed=3", "unknown key 'speed'"),
    ("rank=1,factor=2,rank=0", "given twice"),
    ("rank=1,factor=0.5", "sleep cannot speed"),
    ("rank=1,factor=2,start=10,end=5", "must be after"),
    ("rank=1,every=0,extra=0.2", "'every' must be >= 1"),
    ("rank=1,every=5", "'extra' is required"),
    ("rank=1,factor=2,every=5,extra=1", "cannot be combined"),
    ("rank=1,factor", "expected key=value"),
    ("rank=1 factor=2", "must be an integer"),
    ("rank=-1,factor=2", "'rank' must be >= 0"),
])
def test_malformed_specs(text: str, message: str) -> None:
    with pytest.raises(BubblecastError, match=message) as err:
        parse_inject(text)
    assert "\n" not in str(err.value)


def test_empty_means_none() -> None:
    assert parse_inject(None) == [] and parse_inject("  ") == []


def test_device_delay_is_calibrated_and_waits_once_per_op_kind() -> None:
    """On CUDA a slowdown queues spin cycles on the stream (fake device clock here): the spin
    rate is calibrated, each (chunk, op) waits once for its own time, later ones follow the
    latest measured time without waiting."""
    from bubblecast.runtime.device_timing import DeviceDelay, EventTimer
    from tests.runtime.test_rank_recorder import HZ, FakeBackend

    backend = FakeBackend()
    timer = EventTimer(backend)
    delay = DeviceDelay(timer)
    assert delay.cycles_per_s == pytest.approx(HZ)
    waits = timer.syncs

    def op(seconds: float, factor: float) -> float:
        start = timer.mark()
        backend.device.now += seconds
        delay.stretch(start, (0, "F"), factor)
        return timer.elapsed(start, timer.mark())

    assert op(0.004, 2.5) == pytest.approx(0.010)  # first: waits for its own 4 ms
    assert timer.syncs == waits + 2  # that wait, and the elapsed() above
    assert op(0.004, 2.5) == pytest.approx(0.010)  # from the estimate, no wait
    assert timer.syncs == waits + 3
    delay.refresh()  # the op got slower (6 ms): the next delay follows it
    assert op(0.006, 2.0) == pytest.approx(0.010)  # estimate still 4 ms: 6 + 4
    delay.refresh()
    assert op(0.006, 2.0) == pytest.approx(0.012)
    before = backend.device.now
    delay.sleep_s(0.0)  # nothing queued for no delay
    assert backend.device.now == before


def test_a_replica_slowdown_slows_every_rank_of_that_replica() -> None:
    """``replica=R`` (issue 25 item 4): one injection per rank of replica R once the stage
    count is known; the other replica untouched."""
    from bubblecast.runtime.inject import expand_replicas, multiplier
    from bubblecast.runtime.train_config import ModelSpec, TrainConfig

    (raw,) = parse_inject("replica=1,factor=1.5,start=3")
    assert raw.replica == 1 and raw.rank == -1
    ranks = expand_replicas([raw], stages=3)
    assert [i.rank for i in ranks] == [3, 4, 5]
    assert [multiplier(ranks, r, 5) for r in range(6)] == [1.0] * 3 + [1.5] * 3
    assert multiplier(ranks, 4, 2) == 1.0
    config = TrainConfig(model=ModelSpec(kind="packed", seq_len=64), stages=2, replicas=2,
                         inject="replica=0,every=4,extra=0.5")
    assert [(i.rank, i.replica, i.kind) for i in config.injections] == \
        [(0, 0, "spike"), (1, 0, "spike")]
    with pytest.raises(BubblecastError, match="replica 2 does not exist"):
        TrainConfig(model=ModelSpec(kind="packed", seq_len=64), stages=2, replicas=2,
                    inject="replica=2,factor=2")
    with pytest.raises(BubblecastError, match="cannot both be given"):
        parse_inject("rank=0,replica=1,factor=2")
