"""A leading signal for the predictive policy: a rank's device temperature.

A device whose cooling degrades heats up before its clock drops (the RC model of
:mod:`bubblecast.sim.thermal`: ``dT/dt = (P R - (T - T_amb)) / (R C)``). Heating with power
``P`` into resistance ``R``, the temperature heads for ``T_ss = T_amb + P R`` with time
constant ``tau``, so ``T_ss = T + tau dT/dt``; once ``T`` reaches the throttle threshold the
device holds it by lowering its clock (power proportional to the clock) to
``(T_thr - T_amb) / (T_ss - T_amb)`` of the maximum: its ops become
``f = (T_ss - T_amb) / (T_thr - T_amb)`` times slower.

:class:`ThermalLead` keeps each rank's temperature at the control boundaries and, while a
rank heats (a rise of at least ``min_rise`` over its healthy level, and a positive slope since
its last healthy sample, over at most ``window`` samples), predicts the step it reaches the
threshold and the slowdown ``f`` it will then settle at (the last prediction is kept while
the rank throttles: its temperature stops rising then). :meth:`ThermalLead.adjust` turns
that into the forecast the predictive policy plans with: at horizons past the crossing, each
quantile at least the rank's healthy speed times the slowdown reached by then, which steps in
over ``ramp_steps`` (the device lowers its clock one bin at a time: one step per bin in
:mod:`bubblecast.sim.thermal`; 0: at once). The policy then times its move to the slowdown's
path (:attr:`bubblecast.policy.policies.PredictivePolicy.timing`) instead of moving for the
full slowdown before it starts. Ranks without temperatures (no
device metric, the plain ``--inject`` ramp) are left alone: the policy is then exactly the
one without a lead.

The device constants (ambient, threshold, ``tau`` and ``ramp_steps`` in steps) are those of the
emulated device (:mod:`bubblecast.runtime.inject`, :meth:`ThermalLead.for_injections`: its
clock steps down over the fault's ``ramp``, and its ``tau`` follows the fault's lead, so the
emulated device's own is used rather than a fixed guess, which misreads the slowdown ``f``); on
real GPUs they are the device's own (NVML reports the slowdown temperature; ``tau`` is
measured once per device model). :attr:`ThermalLead.onset` is the step each rank was first
predicted to throttle: the controller lets the lead's first move through the hold after an
earlier move (the hold guards against reacting to noise twice, not against a new, announced
fault).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from bubblecast.errors import BubblecastError
from bubblecast.runtime.inject import T_AMB, T_THROTTLE


@dataclass
class ThermalLead:
    """Per-rank temperature tracking and the slowdown it predicts (module doc)."""

    t_amb: float = T_AMB
    t_throttle: float = T_THROTTLE
    tau_steps: float = 150.0
    ramp_steps: float = 0.0
    window: int = 8
    min_rise: float = 2.0
    max_factor: float = 4.0
    steps: list[int] = field(default_factory=list)
    temps: list[np.ndarray] = field(default_factory=list)
    _factor: dict[int, float] = field(default_factory=dict)
    _cross: dict[int, float] = field(default_factory=dict)
    _healthy_speed: dict[int, float] = field(default_factory=dict)
    onset: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.t_throttle > self.t_amb:
            raise BubblecastError("ThermalLead: t_throttle must be above t_amb")
        if not self.tau_steps > 0 or self.ramp_steps < 0 or self.window < 2:
            raise BubblecastError("ThermalLead: tau_steps > 0, ramp_steps >= 0, window >= 2")
        if not self.min_rise > 0 or self.max_factor < 1:
            raise BubblecastError("ThermalLead: min_rise > 0 and max_factor >= 1")

    @classmethod
    def for_injections(cls, injections: list) -> ThermalLead:
        """A lead with the emulated device's constants (the first thermal fault's ``tau``);
        the defaults where no injection has a lead."""
        for inj in injections:
            model = inj.thermal
            if model is not None:
                return cls(t_amb=T_AMB, t_throttle=T_THROTTLE, tau_steps=float(model[1]),
                           ramp_steps=float(inj.ramp))
        return cls()

    def add(self, step: int, temps: np.ndarray) -> None:
        """The ranks' temperatures after ``step`` (NaN: none)."""
        temps = np.asarray(temps, dtype=np.float64)
        if not np.isfinite(temps).any():
            return
        self.steps.append(int(step))
        self.temps.append(temps)
        self._predict()

    def _predict(self) -> None:
        series = np.array(self.temps)  # (n, P)
        steps = np.array(self.steps, dtype=np.float64)
        base = np.nanmin(series, axis=0)
        now = series[-1]
        for r in range(series.shape[1]):
            if not np.isfinite(now[r]) or now[r] - base[r] < self.min_rise:
                continue
            if now[r] >= self.t_throttle - 0.5:
                continue  # throttling: the temperature is held; keep the last prediction
            col = series[:, r]
            cool = np.flatnonzero(np.isfinite(col) & (col <= base[r] + 0.5))
            first = max(int(cool[-1]) if len(cool) else 0, len(col) - self.window)
            keep = np.isfinite(col[first:])
            if keep.sum() < 2:
                continue  # the heating since the last healthy sample, at most ``window``
            slope = float(np.polyfit(steps[first:][keep], col[first:][keep], 1)[0])
            if slope <= 0:
                continue
            t_ss = now[r] + self.tau_steps * slope
            if t_ss <= self.t_throttle:
                self._factor.pop(r, None)
                continue
            self._factor[r] = float(min(self.max_factor, (t_ss - self.t_amb)
                                        / (self.t_throttle - self.t_amb)))
            self.onset.setdefault(r, int(steps[-1]))
            self._cross[r] = steps[-1] + (self.t_throttle - now[r]) / slope

    @property
    def active(self) -> dict[int, float]:
        """Ranks predicted to throttle, and the slowdown factor each will settle at."""
        return dict(self._factor)

    def note_speeds(self, speeds: np.ndarray) -> None:
        """The ranks' recent speeds: remembered as healthy while no rank has begun heating."""
        for r, s in enumerate(np.asarray(speeds, dtype=np.float64)):
            if r not in self._factor and np.isfinite(s):
                self._healthy_speed[r] = float(s)

    def leading(self, speeds: np.ndarray, reached: float = 0.8) -> bool:
        """Whether some rank is predicted to throttle and has not yet shown ``reached`` of its
        predicted slowdown in ``speeds`` (recent speeds): the lead, not the speed history,
        is then what the forecast stands on (the controller trusts it over the forecast
        guard's record of the speed forecasts, which cannot score a change not yet seen)."""
        speeds = np.asarray(speeds, dtype=np.float64)
        for r, f in self._factor.items():
            healthy = self._healthy_speed.get(r)
            if healthy is None or r >= len(speeds):
                continue
            if speeds[r] / healthy < 1.0 + reached * (f - 1.0):
                return True
        return False

    def adjust(self, quantiles: np.ndarray, horizons: np.ndarray, now: int) -> np.ndarray:
        """``(H, P, Q)`` speed quantiles with the predicted slowdowns applied past each
        rank's crossing, stepping in over ``ramp_steps`` (never faster than the forecast
        already was)."""
        out = np.array(quantiles, dtype=np.float64, copy=True)
        hz = np.asarray(horizons, dtype=np.float64)
        for r, f in self._factor.items():
            if r >= out.shape[1] or r not in self._healthy_speed:
                continue
            since = now + hz - self._cross[r]  # steps past the crossing at each horizon
            late = since >= 0
            reached = np.ones_like(since) if self.ramp_steps <= 0 else \
                np.clip((since + 1.0) / self.ramp_steps, 0.0, 1.0)
            floor = self._healthy_speed[r] * (1.0 + (f - 1.0) * reached)
            out[late, r] = np.maximum(out[late, r], floor[late, None])
        return out
