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

``rise`` is a false-alarm trade-off of the model at hand, so it is learned with it:
:func:`calibrate_rise` picks the smallest rise the model's own forecasts exceed on at most a
given share of the feature rows whose realised future holds no rise (by default 5%), from the
model's training features (``ControllerConfig.lead_rise``, ``run --lead-rise``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bubblecast.errors import BubblecastError

__all__ = ["DEFAULT_RISE", "AnchoredForecast", "Announced", "LearnedLead", "RiseCalibration",
           "calibrate_rise"]

#: The announce threshold when none is calibrated (:func:`calibrate_rise`).
DEFAULT_RISE = 0.1


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

    rise: float = DEFAULT_RISE
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


@dataclass(frozen=True)
class RiseCalibration:
    """:func:`calibrate_rise`'s answer: the ``rise``, the share of quiet rows it announces
    (``false_alarm``), how many quiet rows it was read from out of ``rows``, and the nearest
    and farthest horizons compared."""

    rise: float
    false_alarm: float
    quiet_rows: int
    rows: int
    horizons: tuple[int, int]

    def to_json(self) -> dict[str, Any]:
        return {"rise": self.rise, "false_alarm": self.false_alarm,
                "quiet_rows": self.quiet_rows, "rows": self.rows,
                "horizons": list(self.horizons)}


def calibrate_rise(forecaster: Any, frame: Any, false_alarm: float = 0.05,
                   flat: float = 0.05) -> RiseCalibration:
    """The :class:`LearnedLead` ``rise`` at which ``forecaster`` (fitted, with ``horizons_``
    and ``predict(frame, horizons)`` giving ``p50`` per row and horizon) announces at most
    ``false_alarm`` of the *quiet* rows of ``frame`` (a features table with its targets
    ``y_h{h}``): rows whose realised delay at the farthest horizon is under ``1 + flat`` times
    that at the nearest, so no slowdown was coming. The rule compared is the lead's own: the
    median forecast at the farthest horizon over that at the nearest."""
    if not 0 < false_alarm < 1 or not flat >= 0:
        raise BubblecastError("calibrate_rise: false_alarm in (0, 1), flat >= 0")
    hz = sorted(int(h) for h in forecaster.horizons_)
    near, far = hz[0], hz[-1]
    if near == far:
        raise BubblecastError(f"calibrate_rise: the model forecasts one horizon ({near}); "
                              "the lead compares the nearest with the farthest")
    for h in (near, far):
        if f"y_h{h}" not in frame.columns:
            raise BubblecastError(f"calibrate_rise: the features lack target column 'y_h{h}'")
    keys = ["run_id", "replica", "stage", "step"]
    pred = forecaster.predict(frame, [near, far])
    p50 = pred.pivot_table(index=keys, columns="horizon", values="p50", observed=True)
    real = frame.set_index(keys)[[f"y_h{near}", f"y_h{far}"]].reindex(p50.index)
    ratio = (p50[far] / p50[near]).to_numpy(dtype=np.float64)
    realised = (real[f"y_h{far}"] / real[f"y_h{near}"]).to_numpy(dtype=np.float64)
    quiet = np.isfinite(ratio) & np.isfinite(realised) & (realised < 1 + flat)
    if not quiet.any():
        raise BubblecastError("calibrate_rise: no row of the features is quiet (every realised "
                              f"delay rises by {flat:.0%} or more within {far} steps)")
    rise = max(float(np.quantile(ratio[quiet], 1 - false_alarm)) - 1, 1e-3)
    return RiseCalibration(rise=rise, false_alarm=float(np.mean(ratio[quiet] >= 1 + rise)),
                           quiet_rows=int(quiet.sum()), rows=len(ratio), horizons=(near, far))
