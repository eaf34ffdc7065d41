"""The predictive policy's forecast guard: does the model beat the naive forecast, and a move
budget.

:class:`ForecastGuard` scores the forecaster's realised error online: at every decision it keeps
the median forecast made at that origin for a few check horizons (1, 4 and 16 steps by default)
and, once the target steps are observed, compares it with the naive forecast (the speed
observed at the origin, "last value") over the trailing ``window`` origins. Errors are taken on
each rank's log speed *relative to the ranks' mean* (what decides a partition is how ranks
compare, not their common level). While the model's error exceeds ``enter`` x the naive one the
policy falls back to the reactive policy; it trusts the model again only when its error drops
below ``exit`` x the naive one (hysteresis). Until ``min_scored`` (origin, horizon) pairs are
scored the model is not trusted.

A guard with (almost) no record (a fresh policy per request in the prediction service, or
the first decisions of a run) backtests past origins from the state's own history: the
forecaster is asked at a past origin with the history cut there (:func:`backtestable` says
which forecasters allow it; a forecaster reading other inputs is scored online only).

A forecast-driven move is also made only when ``confirm`` decisions in a row agree on it (they
take layers from the same stages), and vetoed while the model's errors on the last few steps
are far above the naive forecast's (a sudden false alarm).

:func:`payback_plan`: how many steps a move's saving may be counted over. Never past the
run's end when the policy knows it, and (``persistence``) a move that answers one rank's
slowdown must pay back its migration *and the move back* within as many steps as that rank has
been slow so far: no forecaster sees when a fail-slow ends, and under a scale-free prior of
durations (the simulator's failslow draws them log-uniform) a slowdown seen for ``a`` steps
ends within the next ``a`` about as often as not. This keeps short events from costing two
migrations for a few steps of gain. A slowdown that a trusted forecast shows still growing
(a device heating up, a ramp) has no end in sight: the age is extended by as far ahead as
the forecast shows it growing, up to the longest horizon the guard checks forecasts at.
Without that no forecast could move before a developing slowdown had been observed for long,
and a model that sees one coming could never act on its lead.

:class:`MoveBudget`: at most ``max_moves`` moves in any ``per_steps`` consecutive steps, whatever
the policy wants (no thrashing). Both are configured by :class:`GuardConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from bubblecast.errors import BubblecastError
from bubblecast.policy.actions import Repartition
from bubblecast.policy.decision import Decision


@dataclass
class GuardConfig:
    """Forecast guard and move budget of the predictive policy (see the module docstring).

    ``window``: trailing origins scored (forecasts made at decisions: steps offline, every
    decision period live); ``horizons``: check horizons; ``min_scored``: scored
    (origin, horizon) pairs before the model is trusted; ``enter`` / ``exit``: fall back when
    model error > ``enter`` x naive error, trust again when < ``exit`` x naive error;
    ``backtest``: most past origins forecast from the state's own history per decision when
    they are missing from the record; ``max_moves`` moves per ``per_steps`` steps at most
    (``max_moves`` 0: no budget); ``confirm``: a forecast-driven move is made only when the
    same stages lose layers in that many forecast-driven decisions in a row (one odd forecast
    moves nothing); ``recent`` / ``recent_factor``: a veto while the model's mean
    error on the targets of the last ``recent`` steps exceeds ``recent_factor`` x the
    naive one there (or its window median, if larger): a sudden false alarm is caught at
    once; ``enabled``: False turns the error check off (the budget stays); ``persistence``:
    a move answering a rank forecast more than ``slow_level`` slower than the mean must pay
    back, the move back included, within the trailing steps in which that rank was observed
    that much slower (:func:`payback_plan`), plus, with ``forecast_lead``, the steps over
    which the trusted forecast shows that slowdown still growing, up to the longest check
    horizon (:func:`forecast_lead`).
    """

    window: int = 48
    horizons: tuple[int, ...] = (1, 4, 16)
    min_scored: int = 8
    enter: float = 1.0
    exit: float = 0.85
    backtest: int = 16
    max_moves: int = 3
    per_steps: int = 100
    confirm: int = 5
    recent: int = 4
    recent_factor: float = 2.0
    enabled: bool = True
    persistence: bool = True
    slow_level: float = 0.02
    observed: int = 3
    forecast_lead: bool = True

    def __post_init__(self) -> None:
        self.horizons = tuple(int(h) for h in self.horizons)
        if self.window < 1 or self.min_scored < 1 or self.backtest < 0:
            raise BubblecastError("GuardConfig: window >= 1, min_scored >= 1, backtest >= 0")
        if not self.horizons or min(self.horizons) < 1:
            raise BubblecastError("GuardConfig.horizons: one or more horizons >= 1")
        if not 0 < self.exit <= self.enter:
            raise BubblecastError(f"GuardConfig: need 0 < exit <= enter, got exit {self.exit}, "
                                  f"enter {self.enter}")
        if not self.slow_level >= 0:
            raise BubblecastError(f"GuardConfig.slow_level: must be >= 0, got {self.slow_level}")
        if self.max_moves < 0 or self.per_steps < 1 or self.confirm < 1:
            raise BubblecastError("GuardConfig: max_moves >= 0, per_steps >= 1, confirm >= 1")

    @classmethod
    def coerce(cls, value: GuardConfig | dict[str, Any] | None) -> GuardConfig:
        """A config from itself, a dict of its fields (e.g. from JSON) or None (defaults)."""
        if isinstance(value, GuardConfig):
            return value
        if value is None:
            return cls()
        if not isinstance(value, dict):
            raise BubblecastError(f"guard: expected an object of GuardConfig fields, got {value!r}")
        try:
            return cls(**value)
        except TypeError as exc:
            raise BubblecastError(f"guard: {exc}") from None


def backtestable(forecaster: Any) -> bool:
    """True when ``forecaster.forecast(state, ...)`` depends only on ``state`` (its ``t`` and
    ``history``), so that a state cut at a past origin gives the forecast made there."""
    from bubblecast.policy.forecasting import TrendForecaster
    from bubblecast.policy.speeds import CachingForecaster, ModelSpeeds

    if isinstance(forecaster, CachingForecaster):
        return backtestable(forecaster.inner)
    return isinstance(forecaster, TrendForecaster | ModelSpeeds)


def slowdown_age(history: np.ndarray, rank: int, level: float) -> int:
    """Trailing rows of the ``(T, P)`` speed ``history`` (seconds per unit of work: higher is
    slower) in which ``rank`` ran at least ``level`` x the ranks' mean."""
    h = np.asarray(history, dtype=np.float64)
    if h.size == 0:
        return 0
    slow = h[:, rank] >= level * h.mean(axis=1)
    below = np.flatnonzero(~slow)
    return int(len(slow) if len(below) == 0 else len(slow) - 1 - below[-1])


def payback_plan(config: GuardConfig, history: np.ndarray, plan: np.ndarray, grid: np.ndarray,
                 weight: np.ndarray, steps_left: int | None, persistence: bool = True
                 ) -> tuple[np.ndarray, bool, str]:
    """``(weights, back, note)`` of a move's payback test: the horizon ``grid``'s step
    ``weight`` (each point stands for that many steps up to it) cut to the steps the saving
    may be counted over (never past the run's end, ``steps_left`` when known; with
    ``persistence``, no longer than the slowdown the move answers has lasted: see the module
    docstring; ``persistence`` False skips it, as the reactive fallback does), whether the
    cost of moving back counts too, and what cut the horizon."""
    n, notes, back = int(grid[-1]), [], False
    if steps_left is not None and steps_left < n:
        n = max(int(steps_left), 0)
        notes.append(f"{n} steps left in the run")
    rank_plan = np.asarray(plan, dtype=np.float64).mean(axis=0)
    slow = int(np.argmax(rank_plan))
    slowed = rank_plan[slow] > (1.0 + config.slow_level) * rank_plan.mean()
    if persistence and config.persistence and slowed:
        back = True
        age = slowdown_age(history, slow, 1.0 + config.slow_level)
        ahead = forecast_lead(config, history, plan, grid, slow) if config.forecast_lead else 0
        if age + ahead < n:
            n = age + ahead
            notes.append(f"rank {slow} slow for {age} steps so far"
                         + (f" and {ahead} forecast" if ahead else ""))
    start = np.asarray(grid, dtype=np.float64) - weight
    return np.clip(n - start, 0.0, weight), back, "; ".join(notes)


def forecast_lead(config: GuardConfig, history: np.ndarray, plan: np.ndarray, grid: np.ndarray,
                  rank: int) -> int:
    """Steps ahead, up to the longest check horizon (the farthest the guard scores forecasts
    at), over which the trusted forecast ``plan`` (``(H, P)`` at the horizon ``grid``) shows
    ``rank``'s slowdown still growing: slower against the ranks' mean there than in the last
    ``config.observed`` steps of ``history`` by more than ``slow_level``. 0 otherwise: a
    forecast that holds a slowdown where it is says nothing of when it ends."""
    p = np.asarray(plan, dtype=np.float64)
    reach = np.flatnonzero(np.asarray(grid) <= max(config.horizons))
    h = np.asarray(history, dtype=np.float64)[-max(config.observed, 1):]
    if len(reach) == 0 or len(h) == 0:
        return 0
    i = int(reach[-1])
    now = np.median(h, axis=0)
    ahead = p[i, rank] / max(p[i].mean(), 1e-300)
    seen = now[rank] / max(now.mean(), 1e-300)
    return int(grid[i]) if ahead > (1.0 + config.slow_level) * seen else 0


def observed_plan(config: GuardConfig, history: np.ndarray, points: int) -> np.ndarray | None:
    """``(points, P)``: the median speeds of the last ``config.observed`` steps, held (the
    naive forecast). A forecast-driven move that these speeds make too needs no confirmation:
    it is no odd forecast. None when confirmation by observation is off or history too short."""
    n = config.observed
    if n < 1 or len(history) < n:
        return None
    return np.repeat(np.median(np.asarray(history)[-n:], axis=0)[None, :], points, axis=0)


def _relative(log_speed: np.ndarray) -> np.ndarray:
    """Log speeds relative to the ranks' mean (last axis)."""
    return log_speed - log_speed.mean(axis=-1, keepdims=True)


@dataclass
class GuardStatus:
    """The guard's verdict at one decision: ``trusted`` False means fall back to reactive."""

    trusted: bool
    model_error: float | None
    naive_error: float | None
    scored: int

    @property
    def ratio(self) -> float | None:
        if self.model_error is None or self.naive_error is None:
            return None
        return self.model_error / max(self.naive_error, 1e-12)

    def describe(self) -> str:
        if self.ratio is None or self.scored == 0:
            return "forecast guard: no realised forecast error yet"
        return (f"forecast guard: model error {self.ratio:.2f}x the naive forecast's over "
                f"{self.scored} scored forecasts")


@dataclass
class ForecastGuard:
    """Online error tracking with hysteresis (see the module docstring). ``now`` is the
    absolute step index of the state's last history row (``state.t`` offline)."""

    config: GuardConfig = field(default_factory=GuardConfig)
    record: dict[int, np.ndarray] = field(default_factory=dict)  # origin -> (C, P) log p50
    trusted: bool = False
    decisions: int = 0
    fallback_decisions: int = 0
    last: GuardStatus | None = None
    streak: tuple[Any, int] = (None, 0)  # the last move's losing stages, decisions in a row

    def reset(self) -> None:
        self.record.clear()
        self.trusted = False
        self.decisions = self.fallback_decisions = 0
        self.last = None
        self.streak = (None, 0)

    def interrupt(self) -> None:
        """A decision that was not forecast-driven (holding, fallback): the streak ends."""
        self.streak = (None, 0)

    def confirmed(self, decision: Decision, current: tuple[int, ...], observed: bool = False
                  ) -> Decision:
        """``decision`` if the previous ``confirm - 1`` decisions (forecast-driven, in a row:
        holding or falling back ends a streak) also moved layers away from the same stages
        (the diagnosis: which stages are too slow), else a keep saying so. Which stages take
        the layers, and how many move, may change as a forecast slowdown grows: a ramp moves
        the best target every few steps, and a streak keyed on it would restart each time.
        A policy's first decision (the service builds one per request) has nothing to
        confirm with: the backtest and the veto still apply."""
        action = decision.action
        target = tuple(int(s) for s in np.flatnonzero(np.subtract(action.partition, current) < 0)) \
            if isinstance(action, Repartition) else None
        run = self.streak[1] + 1 if target is not None and target == self.streak[0] else 1
        self.streak = (target, run)
        need = self.config.confirm
        if target is None or run >= need or self.decisions <= 1 or observed:
            return decision
        return Decision.keep(f"waiting for confirmation ({run} of {need} decisions): "
                             f"{decision.reason}", predicted_step_s=decision.predicted_step_s,
                             predicted_step_with_action_s=decision.predicted_step_s,
                             migration_s=0.0)

    def check_index(self, grid: np.ndarray) -> np.ndarray:
        """Indices into the policy's horizon ``grid`` of the check horizons it contains."""
        want = [h for h in self.config.horizons if h <= int(grid[-1])]
        found = np.flatnonzero(np.isin(grid, want))
        return found if len(found) else np.array([0])

    def remember(self, now: int, p50: np.ndarray) -> None:
        """Keep the ``(C, P)`` median forecast made at origin ``now`` (check horizons)."""
        self.record[int(now)] = np.log(np.maximum(np.asarray(p50, dtype=np.float64), 1e-300))
        keep = self.config.window + max(self.config.horizons)  # origins, however far apart
        for o in sorted(self.record)[:-keep]:
            del self.record[o]

    def backtest(self, state: Any, forecaster: Any, now: int, horizons: np.ndarray) -> None:
        """Forecast at up to ``config.backtest`` recent past origins missing from the record,
        from the state cut at each one (only for :func:`backtestable` forecasters)."""
        budget = self.config.backtest
        if budget == 0 or len(self.record) >= budget or not backtestable(forecaster):
            return  # only to start a guard with no record (then it is scored online)
        t = int(state.t)
        lo = now - self.config.window - int(horizons.max())
        origins = [o for o in range(now - int(horizons.min()), lo - 1, -1)
                   if o not in self.record and o - (now - t) >= 0][:budget]
        for o in origins:
            ti = o - (now - t)
            past = replace(state, t=ti, history=state.history[: ti + 1])
            try:
                q = np.asarray(forecaster.forecast(past, horizons), dtype=np.float64)
            except Exception:  # noqa: BLE001 - no forecast there: that origin stays unscored
                continue
            self.remember(o, q[:, :, 1])

    def score(self, history: np.ndarray, now: int, horizons: np.ndarray) -> GuardStatus:
        """Model and naive mean absolute errors over the scored pairs; updates the verdict."""
        c = self.config
        hist = np.asarray(history, dtype=np.float64)
        offset = now - (len(hist) - 1)  # absolute index of history row 0
        # The last `window` origins with a realised target (steps offline; decisions live).
        origins = [o for o in sorted(self.record) if o + int(horizons.min()) <= now
                   and o - offset >= 0][-c.window:]
        err_m, err_n, recent = self._errors(hist, offset, now, origins, horizons)
        n = len(err_m)
        if n == 0:
            status = GuardStatus(False, None, None, 0)
        else:  # medians: one shock (a few huge errors for both) does not decide
            med_m, med_n = float(np.median(err_m)), float(np.median(err_n))
            ratio = med_m / max(med_n, 1e-12)
            if n < c.min_scored:
                trusted = False
            elif self.trusted:
                trusted = ratio <= c.enter
            else:
                trusted = ratio < c.exit
            sel = np.asarray(recent)
            if sel.any():
                rm = float(np.mean(np.asarray(err_m)[sel]))
                rn = max(float(np.mean(np.asarray(err_n)[sel])), med_n, 1e-4)  # 0.01%: noise-free
                trusted = trusted and rm <= c.recent_factor * rn
            status = GuardStatus(trusted, med_m, med_n, n)
        if not c.enabled:
            status.trusted = True
        self.trusted = status.trusted
        self.last = status
        return status

    def _errors(self, history: np.ndarray, offset: int, now: int, origins: list[int],
                horizons: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per scored (origin, horizon) pair with a realised target: the model's and the naive
        forecast's mean absolute error of relative log speed, and whether the target is among
        the last ``config.recent`` steps."""
        if not origins:
            return np.zeros(0), np.zeros(0), np.zeros(0, dtype=bool)
        o = np.asarray(origins, dtype=np.int64)
        target = o[:, None] + np.asarray(horizons, dtype=np.int64)[None, :]  # (O, C)
        valid = target <= now
        lo = int(o.min()) - offset  # only the rows read are logged
        hist = np.log(np.maximum(history[lo:], 1e-300))
        actual = _relative(hist[np.where(valid, target, o[:, None]) - offset - lo])  # (O, C, P)
        model = _relative(np.stack([self.record[int(k)] for k in o]))  # (O, C, P)
        naive = _relative(hist[o - offset - lo])[:, None, :]  # (O, 1, P)
        err_m = np.abs(model - actual).mean(axis=-1)[valid]
        err_n = np.abs(naive - actual).mean(axis=-1)[valid]
        return err_m, err_n, (target > now - self.config.recent)[valid]

    def counts(self) -> dict[str, int]:
        return {"decisions": self.decisions, "fallback_decisions": self.fallback_decisions}


@dataclass
class MoveBudget:
    """At most ``max_moves`` moves in any ``per_steps`` consecutive steps (0: unlimited)."""

    max_moves: int = 2
    per_steps: int = 100
    moves: list[int] = field(default_factory=list)
    blocked: int = 0

    def reset(self) -> None:
        self.moves.clear()
        self.blocked = 0

    def allows(self, now: int) -> bool:
        if self.max_moves == 0:
            return True
        recent = [m for m in self.moves if m > now - self.per_steps]
        return len(recent) < self.max_moves

    def spend(self, now: int) -> None:
        self.moves.append(int(now))
        self.moves[:] = [m for m in self.moves if m > now - self.per_steps]
