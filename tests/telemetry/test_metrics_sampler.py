"""The recorder's device-metric rows: emulated thermal lead, announced tokens, CPU sampling."""

from __future__ import annotations

import pytest

from bubblecast.errors import BubblecastError
from bubblecast.runtime.inject import T_AMB, T_THROTTLE, parse_inject
from bubblecast.runtime.sampler import SLOWDOWN_METRIC, MetricLog, cpu_readings
from bubblecast.telemetry.metrics import read_metrics


def test_lead_heats_before_the_slowdown_and_crosses_the_threshold_at_start():
    inj = parse_inject("rank=1,factor=2,start=100,ramp=10,lead=30")[0]
    assert inj.temperature(60) == inj.temperature(70) == 75.0
    assert 75.0 < inj.temperature(85) < T_THROTTLE
    assert inj.temperature(99) < T_THROTTLE
    assert inj.multiplier(85) == 1.0  # hot, not yet slow: the signal leads
    assert inj.temperature(100) == T_THROTTLE and inj.multiplier(100) > 1.0
    assert inj.temperature(300) == T_THROTTLE  # throttling holds the threshold
    assert parse_inject("rank=1,factor=2")[0].temperature(50) is None
    assert "lead" not in parse_inject("rank=1,factor=2")[0].to_json()  # old specs unchanged


def test_lead_only_with_a_slowdown():
    with pytest.raises(BubblecastError, match="lead"):
        parse_inject("rank=0,every=10,extra=0.5,lead=5")


def test_metric_log_writes_emulated_temperature_and_tokens(tmp_path):
    log = MetricLog("r", 1, "cpu", every=0, injections=parse_inject(
        "rank=1,factor=2,start=20,lead=10"))
    for step in range(30):
        log.begin_step(step)
        log.announce_tokens(step + 5, 128)
    log.close(tmp_path)
    frame = read_metrics(tmp_path)
    temp = frame[frame["metric"] == "temperature_c"].set_index("step")["value"]
    assert len(temp) == 30 and temp[0] == T_AMB and temp[5] < 75.0  # warms up from ambient
    assert temp[20] == T_THROTTLE
    spec = frame[frame["metric"] == SLOWDOWN_METRIC]  # the device's threshold, once
    assert spec["step"].tolist() == [0] and spec["value"].tolist() == [T_THROTTLE]
    assert log.asof("temperature_c", [-1, 5, 40]).tolist()[1:] == [temp[5], T_THROTTLE]
    assert frame.loc[frame["metric"] == "tokens", "step"].max() == 34


def test_cpu_sampling_runs_off_the_training_thread(tmp_path):
    log = MetricLog("r", 0, "cpu", every=5)
    for step in range(11):
        log.begin_step(step)
    log.close(tmp_path)
    frame = read_metrics(tmp_path)
    if not cpu_readings():
        pytest.skip("this machine offers no CPU readings")
    assert sorted(frame["step"].unique()) == [0, 5, 10]


def test_close_leaves_a_stuck_reading_behind_with_a_warning(monkeypatch):
    """A sensor call that never returns (a hung driver) must not hang the job's exit."""
    import threading

    import bubblecast.runtime.sampler as sampler_mod

    release = threading.Event()
    monkeypatch.setattr(sampler_mod, "CLOSE_TIMEOUT_S", 0.2)
    monkeypatch.setattr(sampler_mod, "cpu_readings",
                        lambda: (release.wait(), {})[1])  # stuck until released
    sampler = sampler_mod.DeviceSampler("cpu", every=1)
    sampler.request(0)
    with pytest.warns(RuntimeWarning, match="did not finish within 0.2 s"):
        sampler.close()
    release.set()
