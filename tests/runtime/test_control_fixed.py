"""The live loop's fixed-cost model (History.fixed) and the thermal lead's constants, estimated
from the device's telemetry, and onset (no processes). The emulator (runtime/inject.py) only
produces the temperatures here, as a device would; the lead never sees the fault."""

from __future__ import annotations

import numpy as np
import pytest

from bubblecast.errors import BubblecastError
from bubblecast.runtime.control.lead import ThermalLead
from bubblecast.runtime.control.observe import History
from bubblecast.runtime.inject import T_AMB, T_THROTTLE, parse_inject

LAYER = 0.8e-3  # seconds per layer per micro-batch (F + B), the live benchmark's
M = 4


def _history(fixed: float, slow: tuple[float, float], steps: int = 40,
             part: tuple[int, int] = (6, 6), samples: int = 8, seed: int = 0) -> History:
    rng = np.random.default_rng(seed)
    h = History(2, 12, cost_samples=samples)
    fwd = np.full((2, 12), LAYER / 3)
    for _ in range(samples):
        h.add_samples(fwd, fwd * 3)
    load = np.array([fixed + LAYER * part[0], fixed + LAYER * part[1]])
    compute = M * load * np.array(slow) * rng.lognormal(0, 0.05, (steps, 2))
    h.add(list(range(steps)), compute, [part] * steps, [M] * steps)
    return h


def test_fixed_cost_is_learnt_from_the_compute_beyond_the_layers_and_then_frozen() -> None:
    h = _history(0.5e-3, (1.0, 1.0))
    costs = h.costs()
    assert h.costs_frozen
    assert abs(h.fixed(costs) - 0.5e-3) < 0.1e-3
    speeds = h.speeds(costs)  # compute / (M x (fixed + held)): about 1 for healthy ranks
    assert abs(np.median(speeds) - 1.0) < 0.05
    frozen = h.fixed(costs)
    later = np.full((10, 2), M * (0.5e-3 + 6 * LAYER) * 3.0)  # everything 3x slower now
    h.add(list(range(40, 50)), later, [(6, 6)] * 10, [M] * 10)
    assert h.fixed(costs) == frozen  # a later slowdown is speed, not overhead


def test_a_rank_slow_from_the_start_does_not_pass_its_slowdown_off_as_overhead() -> None:
    h = _history(0.5e-3, (1.0, 2.0))
    costs = h.costs()
    assert abs(h.fixed(costs) - 0.5e-3) < 0.1e-3  # the smallest rank's, not rank 1's
    ratio = np.median(h.speeds(costs)[:, 1] / h.speeds(costs)[:, 0])
    assert abs(ratio - 2.0) < 0.1


def test_speeds_do_not_jump_when_layers_move_with_the_fixed_cost_known() -> None:
    h = _history(0.5e-3, (1.0, 2.0), steps=40)
    costs = h.costs()
    h.fixed(costs)
    load = np.array([0.5e-3 + LAYER * 9, 0.5e-3 + LAYER * 3])
    h.add(list(range(40, 60)), M * load * [1.0, 2.0] * np.ones((20, 1)), [(9, 3)] * 20,
          [M] * 20)
    s = h.speeds(costs)
    assert abs(np.median(s[40:, 1]) / np.median(s[:40, 1]) - 1.0) < 0.05
    no_fixed = History(2, 12, measured_costs=False)
    assert no_fixed.fixed(no_fixed.costs()) == 0.0


def _boundaries(lead: ThermalLead, spec: str, until: int, slowdown: float = T_THROTTLE,
                every: int = 10) -> None:
    """Feed ``lead`` the emulated device's per-step temperatures as the controller gathers
    them (rank 0 healthy and reporting none; rank 1 the faulty one)."""
    inj = parse_inject(spec)[0]
    for b in range(every - 1, until, every):
        steps = list(range(b - every + 1, b + 1))
        lead.note_speeds(np.array([1.0, 1.0]))
        lead.add(steps, np.array([[np.nan, inj.temperature(s)] for s in steps]),
                 np.array([np.nan, slowdown]))


@pytest.mark.parametrize(("factor", "lead_steps"), [(2.0, 30), (1.5, 20), (3.0, 45)])
def test_the_lead_estimates_its_constants_from_the_temperatures(factor: float,
                                                                lead_steps: int) -> None:
    spec = f"rank=1,factor={factor},start=100,ramp=60,lead={lead_steps}"
    lead = ThermalLead()
    _boundaries(lead, spec, until=90)  # 10+ steps before the slowdown
    assert set(lead.active) == {1}
    # the fit of 20 or fewer heating samples (0.1 C resolution) gets the slowdown to 10%
    assert abs(lead.active[1] / factor - 1.0) < 0.1
    assert abs(lead._cross[1] - 100) <= 2 and lead.onset[1] <= 100 - 10
    c = lead.constants[1]
    assert c["t_amb"] == T_AMB and c["t_throttle"] == T_THROTTLE  # coldest reading; reported


def test_the_lead_uses_the_reported_threshold_not_a_constant() -> None:
    spec = "rank=1,factor=2,start=100,ramp=60,lead=30"
    high = ThermalLead()
    _boundaries(high, spec, until=90, slowdown=95.0)  # the device says: slows at 95 C
    assert high.constants[1]["t_throttle"] == 95.0 and high._cross[1] > 105
    silent = ThermalLead()
    _boundaries(silent, spec, until=90, slowdown=np.nan)  # reports no threshold
    assert silent.active == {} and silent.unknown == {1}


def test_the_lead_forecast_ramps_in_over_the_device_clock_steps() -> None:
    lead = ThermalLead(ramp_steps=60.0)
    _boundaries(lead, "rank=1,factor=2,start=100,ramp=60,lead=30", until=90)
    hz = np.array([1, 8, 16, 32, 64, 128])
    out = lead.adjust(np.ones((len(hz), 2, 3)), hz, now=89)
    f, cross = lead.active[1], lead._cross[1]
    expected = [1.0 if 89 + h < cross else 1.0 + (f - 1.0) * min(1.0, (89 + h - cross + 1) / 60)
                for h in hz]
    assert np.allclose(out[:, 1, 1], expected) and np.all(out[:, 0] == 1.0)
    assert out[0, 1, 1] == 1.0 and 1.2 < out[3, 1, 1] < f - 0.2 and out[-1, 1, 1] == f
    step_lead = ThermalLead(ramp_steps=0)
    step_lead._factor, step_lead._cross, step_lead._healthy_speed = {1: f}, {1: cross}, {1: 1.0}
    assert step_lead.adjust(np.ones((len(hz), 2, 3)), hz, now=89)[3, 1, 1] == f  # at once


@pytest.mark.parametrize("bad", [{"ramp_steps": -1.0}, {"window": 2}, {"min_samples": 2},
                                 {"min_rise": 0.0}, {"max_factor": 0.5}, {"limit": 5}])
def test_thermal_lead_rejects_impossible_constants(bad: dict) -> None:
    with pytest.raises(BubblecastError, match="ThermalLead"):
        ThermalLead(**bad)
