"""An RC thermal model of a device, and the device metrics of simulated runs.

**Model** (one lumped thermal mass per device, integrated once per step)::

    dT/dt = (P * R - (T - T_amb)) / (R * C)

``T`` the die temperature (deg C), ``T_amb`` the coolant/ambient temperature, ``P`` the power
drawn (W), ``R`` the thermal resistance to ambient (deg C / W) and ``C`` the heat capacity
(J / deg C); ``tau = R * C`` is the time constant, here in steps (``dt`` = one step). Power
follows the clock: ``P = p_idle + (p_max - p_idle) * clock / clock_max``. Left alone, ``T``
settles at ``T_amb + P * R``.

A fault (a failing fan, a clogged heat sink) raises ``R`` at the onset step, over ``ramp``
steps, to ``r_fault``; the temperature then climbs with time constant ``tau`` (this climb is
the *leading signal*: it starts before the clock moves). Once ``T`` passes ``t_throttle`` the
device steps its clock down one bin (``clock_bin_mhz``) per step; it steps back up when ``T``
falls ``hysteresis`` below the threshold. The clock settles where ``P * r_fault`` holds the
temperature at the threshold. Compute ops take ``clock_max / clock`` times their nominal time
(the speed factor follows the clock). Readings are rounded to 1 deg C, 1 W and the clock bins,
as NVML reports them.

:func:`thermal_trace` runs it; the ``thermal`` scenario (:mod:`bubblecast.sim.scenarios`)
draws a fault and writes the trace as device metrics (:mod:`bubblecast.sim.device_metrics`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from bubblecast.errors import BubblecastError


@dataclass(frozen=True)
class ThermalModel:
    """Parameters of the RC model (module doc); validated when made."""

    t_amb: float = 35.0
    r_nominal: float = 0.1
    tau_steps: float = 60.0
    p_idle: float = 100.0
    p_max: float = 400.0
    t_throttle: float = 85.0
    hysteresis: float = 2.0
    clock_max_mhz: float = 1980.0
    clock_min_mhz: float = 990.0
    clock_bin_mhz: float = 15.0

    def __post_init__(self) -> None:
        positive = ("r_nominal", "tau_steps", "p_max", "clock_max_mhz", "clock_min_mhz",
                    "clock_bin_mhz")
        for name in positive:
            if not getattr(self, name) > 0:
                raise BubblecastError(f"thermal model: '{name}' must be > 0")
        if not 0 <= self.p_idle < self.p_max:
            raise BubblecastError("thermal model: need 0 <= p_idle < p_max")
        if not self.clock_min_mhz < self.clock_max_mhz:
            raise BubblecastError("thermal model: need clock_min_mhz < clock_max_mhz")
        if not self.t_amb + self.p_max * self.r_nominal < self.t_throttle - self.hysteresis:
            raise BubblecastError("thermal model: a healthy device must stay below "
                                  "t_throttle - hysteresis at full power")

    def power(self, clock: np.ndarray | float) -> Any:
        return self.p_idle + (self.p_max - self.p_idle) * np.asarray(clock) / self.clock_max_mhz

    def r_for_slowdown(self, level: float) -> float:
        """The fault resistance whose equilibrium clock is ``clock_max / (1 + level)``."""
        p_eq = float(self.power(self.clock_max_mhz / (1.0 + level)))
        return (self.t_throttle - self.t_amb) / p_eq


def thermal_trace(model: ThermalModel, steps: int, r: np.ndarray) -> dict[str, np.ndarray]:
    """Integrate the model over ``steps`` with thermal resistance ``r[step]``; returns
    ``temperature_c``, ``sm_clock_mhz``, ``power_w`` (readings) and ``speed``
    (``clock_max / clock``), each of length ``steps``. Starts at the healthy steady state."""
    temp = model.t_amb + float(model.power(model.clock_max_mhz)) * float(r[0])
    clock = model.clock_max_mhz
    out = {k: np.empty(steps) for k in ("temperature_c", "sm_clock_mhz", "power_w", "speed")}
    for k in range(steps):
        power = float(model.power(clock))
        out["temperature_c"][k], out["sm_clock_mhz"][k] = temp, clock
        out["power_w"][k], out["speed"][k] = power, model.clock_max_mhz / clock
        temp += (power * r[k] - (temp - model.t_amb)) / model.tau_steps
        if temp > model.t_throttle:
            clock = max(model.clock_min_mhz, clock - model.clock_bin_mhz)
        elif temp < model.t_throttle - model.hysteresis and clock < model.clock_max_mhz:
            clock = min(model.clock_max_mhz, clock + model.clock_bin_mhz)
    out["temperature_c"] = np.round(out["temperature_c"])
    out["power_w"] = np.round(out["power_w"])
    return out


def fault_resistance(model: ThermalModel, steps: int, onset: int, ramp: int,
                     r_fault: float) -> np.ndarray:
    """``R`` per step: nominal, then a linear climb to ``r_fault`` over ``ramp`` steps."""
    k = np.arange(steps, dtype=np.float64)
    frac = np.clip((k - onset) / max(ramp, 1), 0.0, 1.0)
    return model.r_nominal + (r_fault - model.r_nominal) * frac
