"""Clock offsets against rank 0 (runtime/clock.py): the NTP estimate from the minimum-RTT
round trip, run over a fake two-rank process group (threads) with a skewed clock."""

from __future__ import annotations

import queue
import random
import threading
import time
from typing import Any

import pytest

from bubblecast.errors import BubblecastError
from bubblecast.runtime import clock as clocks


def test_best_sample_is_exact_for_symmetric_legs_and_bounded_otherwise() -> None:
    rng = random.Random(3)
    true = -5.0  # rank 0's clock minus this rank's
    samples = []
    for _ in range(20):
        t0 = rng.uniform(0, 100)
        up, down = rng.uniform(1e-4, 5e-3), rng.uniform(1e-4, 5e-3)
        t1 = t0 + up + true  # rank 0 stamps on its own clock
        samples.append((t0, t1, t0 + up + down))
    offset, rtt = clocks.best_sample(samples)
    assert rtt == min(s[2] - s[0] for s in samples)
    assert abs(offset - true) <= rtt / 2 + 1e-12
    t0 = 10.0
    assert clocks.best_sample([(t0, t0 + 1e-3 + true, t0 + 2e-3)]) == pytest.approx((true, 2e-3))
    with pytest.raises(BubblecastError):
        clocks.best_sample([])


def test_wall_clock_adds_the_fake_skew(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(clocks.SKEW_ENV, "5")
    assert clocks.wall_clock() - time.time() == pytest.approx(5.0, abs=0.5)
    monkeypatch.setenv(clocks.SKEW_ENV, "soon")
    with pytest.raises(BubblecastError, match=clocks.SKEW_ENV):
        clocks.wall_clock()


def test_offsets_by_step_applies_each_estimate_from_its_step() -> None:
    rows = [(s, 0, 0, 0, 0.0, 0.0, 1, 0) for s in (0, 99, 100, 150, 200, 250)]
    assert clocks.offsets_by_step(((0, 1.5),), rows) == 1.5
    got = clocks.offsets_by_step(((0, 1.0), (100, 2.0), (200, 3.0)), rows)
    assert list(got) == [1.0, 1.0, 2.0, 2.0, 3.0, 3.0]


class _FakeDist:
    """Two ranks as threads: send/recv over queues with random, asymmetric delays."""

    def __init__(self, delays: random.Random) -> None:
        self.local = threading.local()
        self.boxes = {0: queue.Queue(), 1: queue.Queue()}
        self.delays, self.lock = delays, threading.Lock()

    def get_rank(self, group: Any = None) -> int:
        return self.local.rank

    def get_world_size(self, group: Any = None) -> int:
        return 2

    def get_backend(self, group: Any = None) -> str:
        return "gloo"

    def send(self, tensor: Any, dst: int, group: Any = None) -> None:
        with self.lock:
            delay = self.delays.uniform(0, 2e-3)
        time.sleep(delay)  # one leg's latency, different each way and each time
        self.boxes[dst].put(float(tensor.item()))

    def recv(self, tensor: Any, src: int, group: Any = None) -> None:
        tensor.fill_(self.boxes[self.local.rank].get(timeout=10))


def test_injected_skew_is_removed_within_the_measured_uncertainty(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    fake = _FakeDist(random.Random(7))
    for name in ("get_rank", "get_world_size", "get_backend", "send", "recv"):
        monkeypatch.setattr(dist, name, getattr(fake, name))
    skew = 5.0
    results: dict[int, clocks.ClockEstimate] = {}

    def rank(r: int) -> None:
        fake.local.rank = r
        clock = (lambda: time.time() + skew) if r == 1 else time.time
        results[r] = clocks.estimate_offsets(None, samples=8, clock=clock, step=3)

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    zero, one = results[0], results[1]
    assert (zero.offset_s, zero.uncertainty_s) == (0.0, 0.0)
    assert one.samples == 8 and one.step == 3 and one.uncertainty_s == one.rtt_s / 2 > 0
    assert abs(one.offset_s + skew) <= one.uncertainty_s  # rank 1's clock read 5 s ahead
    assert abs(one.offset_s + skew) < 0.05  # and the uncertainty itself is small
    meta = clocks.summarize([zero, one], every=100)
    assert meta["offset_s"] == {"0": 0.0, "1": one.offset_s}
    assert meta["uncertainty_s"]["1"] == one.uncertainty_s and len(meta["estimates"]) == 2


def test_the_recorder_reestimates_every_k_steps_and_shifts_rows_from_then_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from bubblecast.runtime import rank_recorder as rec_mod
    from bubblecast.telemetry.schema import RunMeta

    shifts = iter([2.0, 3.0])
    calls: list[int] = []

    def fake_estimate(group: Any = None, *, step: int = 0, **_: Any) -> clocks.ClockEstimate:
        calls.append(step)
        return clocks.ClockEstimate(1, next(shifts), 1e-4, 2e-4, 8, step)

    monkeypatch.setattr(clocks, "estimate_offsets", fake_estimate)
    first = clocks.ClockEstimate(1, 1.0, 1e-4, 2e-4, 8, 0)
    rec = rec_mod.Recorder(run_id="r", rank=1, stage=1, origin_wall=0.0, meta_fn=RunMeta,
                           clock=first, clock_every=2)
    for step in range(5):
        rec.begin_step(step, 1)
        rec.record_optimizer(10.0, 10.5)  # the same local time every step
        rec.end_step()
    assert calls == [2, 4]  # not at step 0: the estimate at start covers it
    assert [e.offset_s for e in rec.clock_estimates] == [1.0, 2.0, 3.0]
    start = rec.frame()["start_s"].to_numpy()
    shift = start - start[0]
    assert list(shift) == pytest.approx([0.0, 0.0, 1.0, 1.0, 2.0])
