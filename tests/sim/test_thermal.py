"""The RC thermal model and the thermal scenario: temperature leads, clock follows."""

from __future__ import annotations

import numpy as np
import pytest

from bubblecast.errors import BubblecastError
from bubblecast.sim.scenarios import RunShape, make_scenario
from bubblecast.sim.thermal import ThermalModel, fault_resistance, thermal_trace


def test_healthy_device_stays_at_steady_state_and_full_clock():
    model = ThermalModel()
    out = thermal_trace(model, 200, np.full(200, model.r_nominal))
    assert np.all(out["speed"] == 1.0)
    assert np.all(out["temperature_c"] == round(model.t_amb + model.p_max * model.r_nominal))


def test_fault_heats_first_then_clock_settles_at_the_level():
    model = ThermalModel(tau_steps=40)
    r = fault_resistance(model, 1500, onset=100, ramp=10, r_fault=model.r_for_slowdown(0.3))
    out = thermal_trace(model, 1500, r)
    hot = np.flatnonzero(out["temperature_c"] > out["temperature_c"][0])[0]
    slow = np.flatnonzero(out["speed"] > 1.0)[0]
    assert 100 <= hot < slow - 10  # the temperature leads the slowdown by many steps
    assert out["temperature_c"][-200:].max() <= model.t_throttle + 3
    # settles in the hysteresis band just below the equilibrium clock
    assert 1.3 <= out["speed"][-300:].mean() <= 1.4


def test_thermal_scenario_writes_its_temperature_and_speed_follows_clock():
    draw = make_scenario("thermal", seed=3).draw(RunShape(500, 4))
    rank = draw.info["rank"]
    clock = draw.metrics["sm_clock_mhz"][:, rank]
    assert np.allclose(draw.speed[:, rank], clock.max() / clock)
    others = [r for r in range(4) if r != rank]
    assert np.all(draw.speed[:, others] == 1.0)
    assert draw.metrics["temperature_c"].shape == (500, 4)


def test_throttle_without_thermal_model_is_unchanged():
    a = make_scenario("throttle", seed=5).draw(RunShape(300, 4))
    assert a.metrics == {} and a.speed[:, a.info["rank"]].max() > 1.0


def test_unhealthy_parameters_refused():
    with pytest.raises(BubblecastError, match="healthy"):
        ThermalModel(r_nominal=0.5)
