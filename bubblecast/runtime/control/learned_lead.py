"""The learned lead: a covariate model's forecast of a slowdown not yet seen, held until it shows.

A model trained on device-metric covariates (:mod:`.covariate_model`) can forecast a rank's
slowdown before its speed shows any: a device heating towards its slowdown temperature. The
forecast guard cannot score such a forecast (nothing has happened yet), so while the lead
holds, the controller decides without the guard's error check and times its move to the
forecast path (as for the thermal lead of :mod:`.lead`). :class:`LearnedLead` keeps that state:

- a rank is **announced** when the model's median delay at its farthest horizon is at least
  ``1 + rise`` times that at its nearest, while the rank's temperature is below the slowdown
  temperature it reports (a throttle not yet begun);
- it stays announced until its recent speed shows ``reached`` of the announced rise over its
  speed when first announced, or ``hold_steps`` steps have passed (a slowdown that never comes);
- :meth:`LearnedLead.forecaster` is the forecast the policy plans with meanwhile: each rank at
  its recent speed, an announced rank times the model's forecast path relative to its nearest
  horizon (the model's shape of the slowdown on the observed level: its levels are not what
  the lead stands on).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bubblecast.errors import BubblecastError


@dataclass
class Announced:
    """One announced rank: the largest rise forecast, its speed when first announced, the step
    of that, and the last forecast path ``(H, 3)`` relative to the nearest horizon's median."""

    rise: float
    healthy: float
    onset: int
    path: np.ndarray


@dataclass
class LearnedLead:
    """Announced ranks of a covariate model (module docstring)."""

    rise: float = 0.1
    reached: float = 0.8
    hold_steps: int = 60
    ranks: dict[int, Announced] = field(default_factory=dict)
    horizons: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def __post_init__(self) -> None:
        if not self.rise > 0 or not 0 < self.reached <= 1 or self.hold_steps < 1:
            raise BubblecastError("LearnedLead: rise > 0, reached in (0, 1], hold_steps >= 1")

    def update(self, step: int, recent: np.ndarray, below: np.ndarray,
               quantiles: np.ndarray | None = None, horizons: Any = None) -> dict[int, float]:
        """Announce from ``quantiles`` (``(P, H, 3)`` delay quantiles at ``horizons``, None: no
        forecast now) on the ranks ``below`` their slowdown temperature, drop the ranks whose
        slowdown shows in ``recent`` (speeds) or whose hold ran out; the announced ranks and
        their rise."""
        recent = np.asarray(recent, dtype=np.float64)
        if quantiles is not None:
            q = np.asarray(quantiles, dtype=np.float64)
            self.horizons = np.asarray(horizons, dtype=np.float64)
            ratio = q / np.maximum(q[:, :1, 1:2], 1e-300)
            for r in range(min(len(q), len(below))):
                if not below[r] or ratio[r, -1, 1] < 1 + self.rise:
                    continue
                a = self.ranks.get(r)
                if a is None:
                    self.ranks[r] = Announced(float(ratio[r, -1, 1]), float(recent[r]),
                                              int(step), ratio[r])
                else:
                    a.rise, a.path = max(a.rise, float(ratio[r, -1, 1])), ratio[r]
        for r, a in list(self.ranks.items()):
            shown = recent[r] / a.healthy >= 1 + self.reached * (a.rise - 1)
            if shown or step - a.onset > self.hold_steps:
                del self.ranks[r]
        return {r: a.rise for r, a in self.ranks.items()}

    @property
    def onset(self) -> int | None:
        """The first step a rank still announced was announced (None: none)."""
        return min((a.onset for a in self.ranks.values()), default=None)

    def forecaster(self, recent: np.ndarray) -> AnchoredForecast:
        """The forecast the policy plans with while the lead holds (module docstring)."""
        return AnchoredForecast(np.asarray(recent, dtype=np.float64), self.horizons,
                                {r: a.path for r, a in self.ranks.items()})


class AnchoredForecast:
    """Speed quantiles ``(H, P, 3)``: every rank at ``recent``, an announced rank times its
    path (interpolated between the model's horizons, held beyond them)."""

    name = "learned lead"

    def __init__(self, recent: np.ndarray, horizons: np.ndarray,
                 paths: dict[int, np.ndarray]) -> None:
        self.recent, self.horizons, self.paths = recent, horizons, paths

    def forecast(self, state: Any, horizons: Any) -> np.ndarray:
        hz = np.asarray(horizons, dtype=np.float64)
        out = np.repeat(np.repeat(self.recent[None, :, None], len(hz), axis=0), 3, axis=2)
        for r, path in self.paths.items():
            for k in range(3):
                out[:, r, k] = self.recent[r] * np.interp(hz, self.horizons, path[:, k])
        return np.sort(out, axis=2)
