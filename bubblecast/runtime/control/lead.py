"""A leading signal for the predictive policy: a rank's device temperature.

A device whose cooling degrades heats up before its clock drops (the RC model of
:mod:`bubblecast.sim.thermal`: ``dT/dt = (P R - (T - T_amb)) / (R C)``). Heating with power
``P`` into resistance ``R``, the temperature heads for ``T_ss = T_amb + P R`` along
``T(t) = T_ss - (T_ss - T_0) exp(-t / tau)``; once ``T`` reaches the slowdown threshold the
device holds it by lowering its clock (power proportional to the clock) to
``(T_thr - T_amb) / (T_ss - T_amb)`` of the maximum: its ops become
``f = (T_ss - T_amb) / (T_thr - T_amb)`` times slower.

Every constant comes from the run's own telemetry, nothing from the fault:

- ``T_thr``: the slowdown temperature the device reports (device metric
  ``temperature_slowdown_c``: NVML's ``NVML_TEMPERATURE_THRESHOLD_SLOWDOWN`` on a GPU, or its
  temperature plus NVML's thermal margin where it reports no threshold, the emulated device's
  specification under ``--inject``); a rank that reports none gets no
  prediction (listed in :attr:`ThermalLead.unknown`);
- ``T_amb``: the coldest temperature the rank reported in the run (a device starts the job
  near ambient, before its load warms it);
- ``T_ss`` and ``tau``: a least-squares fit of the curve above to the rank's temperatures since
  its last healthy sample (at most ``window`` of them; for each ``tau`` on a log grid the
  curve is linear in ``T_ss`` and ``T_0``; a fit at the grid's longest ``tau`` shows no
  curvature yet and predicts nothing).

:class:`ThermalLead` keeps each rank's temperature per step and, while a rank heats (a rise of
at least ``min_rise`` over its healthy level, the median of its readings), predicts the step it
reaches the threshold and the slowdown ``f`` it will then settle at (the last prediction is
kept while the rank throttles: its temperature stops rising then). :meth:`ThermalLead.adjust`
turns that into the forecast the predictive policy plans with: at horizons past the crossing,
each quantile at least the rank's healthy speed times the slowdown reached by then, which steps
in over ``ramp_steps`` (how many steps the device takes to lower its clock; 0: at once). The
policy then times its move to the slowdown's path
(:attr:`bubblecast.policy.policies.PredictivePolicy.timing`). Ranks without temperatures (no
device metric, the plain ``--inject`` ramp) are left alone: the policy is then exactly the one
without a lead. :attr:`ThermalLead.onset` is the step each rank was first predicted to
throttle: the controller lets the lead's first move through the hold after an earlier move
(the hold guards against reacting to noise twice, not against a new, announced fault).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np

from bubblecast.errors import BubblecastError

#: Time constants (steps) the heating fit tries.
TAU_GRID = np.geomspace(2.0, 5000.0, 160)


def fit_heating(x: np.ndarray, temps: np.ndarray) -> tuple[float, float, float]:
    """``(T_ss, T_0, tau)`` of ``T(x) = T_ss - (T_ss - T_0) exp(-x / tau)`` fitted by least
    squares to ``temps`` at steps ``x`` (from 0), ``tau`` on :data:`TAU_GRID`."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(temps, dtype=np.float64)
    e = np.exp(-x[None, :] / TAU_GRID[:, None])  # (G, n)
    ones = np.ones_like(x)
    best = (np.inf, float(y[-1]), float(y[0]), float(TAU_GRID[-1]))
    for g, tau in enumerate(TAU_GRID):
        design = np.stack([ones, e[g]], axis=1)
        coef, *_ = np.linalg.lstsq(design, y, rcond=None)
        sse = float(np.sum((design @ coef - y) ** 2))
        if sse < best[0]:
            a, b = float(coef[0]), float(coef[1])
            best = (sse, a, a + b, float(tau))
    return best[1], best[2], best[3]


@dataclass
class ThermalLead:
    """Per-rank temperature tracking and the slowdown it predicts (module doc)."""

    ramp_steps: float = 0.0
    window: int = 30
    min_samples: int = 5
    min_rise: float = 2.0
    max_factor: float = 4.0
    limit: int = 512
    steps: list[int] = field(default_factory=list)
    temps: list[np.ndarray] = field(default_factory=list)
    slowdown: np.ndarray | None = None
    onset: dict[int, int] = field(default_factory=dict)
    #: per rank: the constants of its last prediction (``t_amb``, ``t_throttle``, ``t_ss``,
    #: ``tau``), as estimated from its telemetry
    constants: dict[int, dict[str, float]] = field(default_factory=dict)
    #: ranks that heat up but report no slowdown temperature (no prediction for them)
    unknown: set[int] = field(default_factory=set)
    _factor: dict[int, float] = field(default_factory=dict)
    _cross: dict[int, float] = field(default_factory=dict)
    _healthy_speed: dict[int, float] = field(default_factory=dict)
    _coldest: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.ramp_steps < 0 or self.window < 3 or not 3 <= self.min_samples <= self.window:
            raise BubblecastError("ThermalLead: ramp_steps >= 0, window >= 3 and "
                                  "3 <= min_samples <= window")
        if not self.min_rise > 0 or self.max_factor < 1 or self.limit < self.window:
            raise BubblecastError("ThermalLead: min_rise > 0, max_factor >= 1 and "
                                  "limit >= window")

    def add(self, steps: list[int] | np.ndarray, temps: np.ndarray,
            slowdown: np.ndarray | None = None) -> None:
        """The ranks' temperatures ``(n, P)`` at ``steps`` (NaN: none) and their reported
        slowdown temperatures ``(P,)`` (NaN: none); then predict."""
        temps = np.atleast_2d(np.asarray(temps, dtype=np.float64))
        if slowdown is not None:
            sd = np.asarray(slowdown, dtype=np.float64)
            self.slowdown = sd if self.slowdown is None else np.where(np.isfinite(sd), sd,
                                                                      self.slowdown)
        keep = np.isfinite(temps).any(axis=1)
        if not keep.any():
            return
        for step, row in zip(np.asarray(steps)[keep], temps[keep], strict=True):
            self.steps.append(int(step))
            self.temps.append(row)
            cold = self._coldest
            self._coldest = row.copy() if cold is None else np.fmin(cold, row)
        del self.steps[:-self.limit], self.temps[:-self.limit]
        self._predict()

    def _predict(self) -> None:
        series = np.array(self.temps)  # (n, P)
        steps = np.array(self.steps, dtype=np.float64)
        with warnings.catch_warnings():  # a rank without any reading: NaN, no warning
            warnings.simplefilter("ignore", RuntimeWarning)
            healthy = np.nanmedian(series, axis=0)
        for r in range(series.shape[1]):
            now = series[-1, r]
            if not np.isfinite(now) or now - healthy[r] < self.min_rise:
                continue
            t_thr = np.nan if self.slowdown is None or r >= len(self.slowdown) \
                else float(self.slowdown[r])
            if not np.isfinite(t_thr):
                self.unknown.add(r)
                continue
            if now >= t_thr - 0.5:
                continue  # throttling: the temperature is held; keep the last prediction
            col = series[:, r]
            cool = np.flatnonzero(np.isfinite(col) & (col <= healthy[r] + 0.5))
            first = max(int(cool[-1]) if len(cool) else 0, len(col) - self.window)
            keep = np.isfinite(col[first:])
            if keep.sum() < self.min_samples:
                continue  # the heating since the last healthy sample, at most ``window``
            x = steps[first:][keep]
            t_ss, t0, tau = fit_heating(x - x[0], col[first:][keep])
            t_amb = float(self._coldest[r])  # type: ignore[index]
            if tau >= TAU_GRID[-1] or t_ss <= t_thr or t0 >= t_thr or not t_thr > t_amb:
                self._factor.pop(r, None)
                continue
            self._factor[r] = float(min(self.max_factor, (t_ss - t_amb) / (t_thr - t_amb)))
            self.onset.setdefault(r, int(steps[-1]))
            self._cross[r] = float(x[0] + tau * np.log((t_ss - t0) / (t_ss - t_thr)))
            self.constants[r] = {"t_amb": t_amb, "t_throttle": t_thr,
                                 "t_ss": round(t_ss, 2), "tau": round(tau, 1)}

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
