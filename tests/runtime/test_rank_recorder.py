"""The recorder's public per-step hook: what the controller's telemetry reads (no processes)."""

from __future__ import annotations

import pytest

from bubblecast.errors import BubblecastError
from bubblecast.runtime.rank_recorder import Recorder, StepView
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


# -- device timing (CUDA events), with a fake device clock ------------------------------------
HZ = 1.5e9  # the fake device's spin-kernel clock


class FakeDevice:
    """A device clock that only moves when queued work runs (here: at once, in order)."""

    def __init__(self) -> None:
        self.now = 100.0  # device seconds; unrelated to the host clock on purpose


class FakeEvent:
    """``torch.cuda.Event`` as the timer uses it: record, synchronize, query, elapsed_time."""

    def __init__(self, device: FakeDevice) -> None:
        self.device, self.t = device, None

    def record(self, stream: object) -> None:
        assert stream == "stream-0"
        self.t = self.device.now

    def synchronize(self) -> None:
        assert self.t is not None, "waiting on an event never recorded"

    def query(self) -> bool:
        return True

    def elapsed_time(self, later: FakeEvent) -> float:
        assert self.t is not None and later.t is not None
        return (later.t - self.t) * 1e3  # milliseconds, as CUDA


class FakeBackend:
    def __init__(self) -> None:
        self.device = FakeDevice()
        self.created = 0

    def new_event(self) -> FakeEvent:
        self.created += 1
        return FakeEvent(self.device)

    def current_stream(self) -> str:
        return "stream-0"

    def sleep(self, cycles: int) -> None:
        self.device.now += cycles / HZ


class DeviceStage:
    """A stage whose ops take device time (F 3 ms, B 6 ms, W 2 ms) and no host time."""

    def __init__(self, device: FakeDevice, layers: list | None = None) -> None:
        self.device, self.layers = device, layers or []

    def forward_one_chunk(self, mb: int, *a: object, **k: object) -> int:
        for layer in self.layers:
            layer(None)
        self.device.now += 0.003
        return mb

    def backward_one_chunk(self, mb: int, *a: object, **k: object) -> None:
        self.device.now += 0.006

    def backward_weight_one_chunk(self, mb: int, *a: object, **k: object) -> None:
        self.device.now += 0.002


def _device_recorder(**kw: object) -> tuple[Recorder, DeviceStage, FakeBackend]:
    from bubblecast.runtime.device_timing import EventTimer

    backend = FakeBackend()
    timer = EventTimer(backend)
    layers = kw.pop("layers", None)
    stage = DeviceStage(backend.device, list((layers or {}).values()))
    rec = Recorder(run_id="r", rank=0, stage=0, origin_wall=0.0, meta_fn=RunMeta,
                   timer=timer, device="cuda:0", **kw)  # type: ignore[arg-type]
    rec.attach([stage], {0: dict(layers or {})})
    return rec, stage, backend


def _run_steps(rec: Recorder, stage: DeviceStage, steps: int, mbs: int = 2) -> None:
    for step in range(steps):
        rec.begin_step(step, 4)
        for mb in range(mbs):
            stage.forward_one_chunk(mb)
        for mb in range(mbs):
            stage.backward_one_chunk(mb)
            stage.backward_weight_one_chunk(mb)
        start = rec.optimizer_start()
        stage.device.now += 0.001
        rec.optimizer_done(start)
        rec.end_step()


def test_device_timing_waits_per_batch_not_per_op() -> None:
    rec, stage, backend = _device_recorder(flush_every=10**6)
    assert rec.timing == "device"
    _run_steps(rec, stage, 5)
    assert rec.timer is not None and rec.timer.syncs == 1  # the first anchor only
    frame = rec.frame()  # one batch: one wait per event pair, then a new anchor
    assert rec.timer.syncs == 1 + len(frame) + 1
    expected = {"F": 0.003, "B": 0.006, "W": 0.002, "OPTIMIZER": 0.001}
    for op, dur in expected.items():
        got = frame.loc[frame["op"] == op, "duration_s"].to_numpy()
        assert abs(got - dur).max() < 1e-9, op
    # start times keep the device's spacing: op k+1 starts where op k ended (origin_wall 0:
    # epoch-sized times, float64 resolves them to 0.24 us)
    starts = frame["start_s"].to_numpy()
    ends = starts + frame["duration_s"].to_numpy()
    assert abs(starts[1:] - ends[:-1]).max() < 1e-6
    created = backend.created
    _run_steps(rec, stage, 5)
    rec.frame()
    assert backend.created - created == 1  # events come back to the pool: only the anchor


def test_device_timing_step_hook_and_layer_costs_read_device_time() -> None:
    import torch

    device_holder: list[FakeDevice] = []

    class Tick(torch.nn.Module):
        def forward(self, x: object) -> object:
            device_holder[0].now += 0.0005
            return x

    layers = {7: Tick(), 8: Tick()}
    rec, stage, backend = _device_recorder(layers=layers, layer_cost_every=2, flush_every=10**6)
    device_holder.append(backend.device)
    seen: list[float] = []
    rec.add_step_hook(lambda view: seen.append(view.compute_s()))
    _run_steps(rec, stage, 3)
    per_step = 2 * (0.003 + 0.001 + 0.006 + 0.002)  # F includes its two 0.5 ms layers
    assert [round(s, 9) for s in seen] == [round(per_step, 9)] * 3
    costs = rec.layer_costs
    assert sorted({c["step"] for c in costs}) == [0, 2]
    assert sorted({c["layer"] for c in costs}) == [7, 8]
    assert all(abs(c["forward_s"] - 0.0005) < 1e-9 for c in costs)
    ratio = (0.004 + 0.006 + 0.002) / 0.004
    assert all(abs(c["total_s"] - 0.0005 * ratio) < 1e-9 for c in costs)


def test_device_slowdown_delays_the_stream_not_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    from bubblecast.runtime import rank_recorder as rec_mod
    from bubblecast.runtime.inject import parse_inject

    def no_host_sleep(seconds: float) -> None:
        raise AssertionError("device slowdowns must not sleep on the host")

    monkeypatch.setattr(rec_mod.time, "sleep", no_host_sleep)
    rec, stage, _ = _device_recorder(injections=parse_inject("rank=0,factor=3,start=1"),
                                     flush_every=10**6)
    assert rec._delay is not None and abs(rec._delay.cycles_per_s - HZ) < 1e-3 * HZ
    _run_steps(rec, stage, 3)
    frame = rec.frame()
    f = frame.loc[frame["op"] == "F"].groupby("step")["duration_s"].max().to_numpy()
    b = frame.loc[frame["op"] == "B"].groupby("step")["duration_s"].max().to_numpy()
    assert abs(f - [0.003, 0.009, 0.009]).max() < 1e-6  # 3x from step 1, on the device
    assert abs(b - [0.006, 0.018, 0.018]).max() < 1e-6
    opt = frame.loc[frame["op"] == "OPTIMIZER", "duration_s"].to_numpy()
    assert abs(opt - 0.001).max() < 1e-9  # the optimizer is not stretched


def test_ops_outside_a_step_are_not_recorded() -> None:
    rec, stage = _recorder()
    stage.forward_one_chunk(0)  # before any step
    rec.begin_step(0, 1)
    stage.forward_one_chunk(0)
    rec.end_step()
    stage.forward_one_chunk(1)  # between steps (an evaluation pass)
    frame = rec.frame()
    assert list(frame["op"]) == ["F"] and list(frame["microbatch"]) == [0]


def test_parts_come_every_flush_every_steps_but_not_sooner_than_min_part_s(tmp_path) -> None:
    counts = {}
    for min_part_s in (0.0, 3600.0):
        out = tmp_path / str(min_part_s)
        stage = Stage()
        rec = Recorder(run_id="r", rank=0, stage=0, origin_wall=0.0, flush_every=2,
                       min_part_s=min_part_s, events_dir=str(out),
                       meta_fn=lambda: RunMeta(schedule="1f1b", microbatches=2))
        rec.attach([stage], {0: {}})
        for step in range(6):
            rec.begin_step(step, 1)
            stage.forward_one_chunk(0)
            stage.backward_one_chunk(0)
            rec.end_step()
        rec.close()
        counts[min_part_s] = len(list(out.glob("rank0000-*.parquet")))
    assert counts == {0.0: 3, 3600.0: 1}  # every 2 steps; or one part, written at close


def test_wait_written_returns_with_every_submitted_part_on_disk(tmp_path) -> None:
    stage = Stage()
    rec = Recorder(run_id="r", rank=0, stage=0, origin_wall=0.0, flush_every=1,
                   events_dir=str(tmp_path), meta_fn=lambda: RunMeta(schedule="1f1b",
                                                                     microbatches=1))
    rec.attach([stage], {0: {}})
    for step in range(3):
        rec.begin_step(step, 1)
        stage.forward_one_chunk(0)
        stage.backward_one_chunk(0)
        rec.end_step()
        rec.wait_written()
        assert len(list(tmp_path.glob("rank0000-*.parquet"))) == step + 1
    assert len(rec.part_cpu_s) == 3 and all(s >= 0 for s in rec.part_cpu_s)
    rec.close()


def test_host_stretch_takes_each_sleeps_overshoot_off_the_next(monkeypatch) -> None:
    """``--inject factor=3`` on the host clock: every op's recorded time is 3x its own on the
    mean, although each sleep wakes 0.4 ms late (a busy host)."""
    import types

    import bubblecast.runtime.rank_recorder as rr
    from bubblecast.runtime.inject import parse_inject

    clock = {"t": 100.0}

    def sleep(seconds: float) -> None:
        clock["t"] += seconds + 0.0004

    monkeypatch.setattr(rr, "time", types.SimpleNamespace(
        perf_counter=lambda: clock["t"], sleep=sleep))

    class Busy(Stage):
        def forward_one_chunk(self, mb: int, *a: object, **k: object) -> int:
            clock["t"] += 0.001  # the op's own millisecond
            return mb

    stage = Busy()
    rec = Recorder(run_id="r", rank=0, stage=0, origin_wall=0.0, meta_fn=RunMeta,
                   injections=parse_inject("rank=0,factor=3"))
    rec.attach([stage], {0: {}})
    for step in range(20):
        rec.begin_step(step, 1)
        for mb in range(4):
            stage.forward_one_chunk(mb)
        rec.end_step()
    f = rec.frame()["duration_s"].to_numpy()
    assert len(f) == 80
    assert abs(f.mean() - 0.003) < 0.0004 / 80 + 1e-9  # only the last overshoot is left over
    assert f[0] == pytest.approx(0.0034)  # the first sleep's overshoot, taken off the second
    assert f[1] == pytest.approx(0.0030)
