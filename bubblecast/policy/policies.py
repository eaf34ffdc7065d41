"""Policies: ``decide(state) -> Decision`` after each observed step.

Every policy returns a :class:`~bubblecast.policy.decision.Decision`: the action with the numbers
the policy computed to choose it (None where it computed none). All four see the same
:class:`~bubblecast.policy.state.PolicyState` (recent per-rank speed history, current partition,
per-layer costs, the pipeline's schedule and microbatches, the migration-cost model); an action
taken after step ``t`` applies from step ``t + 1``, whose time includes the migration pause.

- :class:`StaticPolicy` never acts.
- :class:`ReactivePolicy` rebalances when the imbalance observed over the last ``window``
  steps exceeds a threshold, as DynMo does (no forecast; a cooldown after each move).
- :class:`PredictivePolicy` forecasts each rank's speed over a horizon, scores the solver's
  candidates with the pipeline engine under a risk-weighted mix of p50 and p90 speeds, and
  moves only when the saving over the horizon exceeds ``(1 + margin)`` times the migration
  cost and a minimum per-step gain, then holds (hysteresis): it never thrashes on noise.
- :class:`OraclePolicy` knows the realised future: over a candidate set of partitions (the
  engine-fastest for the realised speeds of every window of steps), a Viterbi pass finds the
  sequence with the least total time, migration pauses included: the upper bound the others
  are measured by.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from bubblecast.errors import BubblecastError
from bubblecast.policy.actions import Repartition
from bubblecast.policy.decision import Decision
from bubblecast.policy.forecast_guard import (
    ForecastGuard,
    GuardConfig,
    MoveBudget,
    observed_plan,
    payback_plan,
)
from bubblecast.policy.forecasting import SpeedForecaster, TrendForecaster
from bubblecast.policy.solver import Partition, SolverTables, candidates, min_bottleneck, solve
from bubblecast.policy.state import PolicyState, RunContext, horizon_grid, planning_speed
from bubblecast.policy.viterbi import first_move, viterbi


class Policy:
    """Base class: ``reset`` once per run, then ``decide`` after every step."""

    name = "policy"

    def reset(self, context: RunContext, state: PolicyState) -> None:
        """Prepare for a run (``state`` is the state before step 0)."""

    def decide(self, state: PolicyState) -> Decision:
        """The decision after step ``state.t``: the action and the numbers behind it."""
        raise NotImplementedError


class StaticPolicy(Policy):
    """Keeps the initial partition for the whole run."""

    name = "static"

    def decide(self, state: PolicyState) -> Decision:
        return Decision.keep("static policy never acts")


def _checked_solve(state: PolicyState, speed: np.ndarray, **kw: Any) -> Partition | Decision:
    try:
        return solve(state.problem(speed), **kw)
    except BubblecastError as exc:
        return Decision.keep(f"no feasible partition: {exc}")


def _repartition(state: PolicyState, new: Partition, speed: np.ndarray, reason: str
                 ) -> Decision:
    """A repartition to ``new`` with engine-scored step times at per-rank ``speed``."""
    cur = tuple(state.partition)
    step, _ = state.predicted_step([cur, new], speed[None, :])
    return Decision(Repartition(new), float(step[0, 0]), float(step[1, 0]),
                    state.migration.seconds(cur, new), reason)


@dataclass
class ReactivePolicy(Policy):
    """DynMo-style rebalancing on observed imbalance.

    Every step after ``window`` steps of history: the mean speed of each rank over the last
    ``window`` steps times the work it holds gives its stage time; when the largest exceeds the
    mean by more than ``threshold``, the solver rebalances for those speeds and the move is
    made if it cuts the largest stage time by at least ``min_gain``. After a move the policy
    waits ``cooldown`` steps (default ``window``) so that it observes the new layout.
    """

    window: int = 10
    threshold: float = 0.05
    min_gain: float = 0.02
    cooldown: int | None = None
    name: str = "reactive"

    def __post_init__(self) -> None:
        if self.window < 1 or self.threshold < 0 or self.min_gain < 0:
            raise BubblecastError("ReactivePolicy: window >= 1, threshold >= 0, min_gain >= 0")

    def decide(self, state: PolicyState) -> Decision:
        if state.t + 1 < self.window:
            return Decision.keep("collecting history")
        wait = self.window if self.cooldown is None else self.cooldown
        if state.last_action is not None and state.t - state.last_action < wait:
            return Decision.keep("cooldown after the last move")
        speed = state.history[-self.window:].mean(axis=0)
        vs = state.vspeed(speed)
        times = vs * state.stage_load(state.partition)
        imbalance = times.max() / times.mean() - 1.0
        if imbalance <= self.threshold:
            return Decision.keep(f"imbalance {imbalance:.3f} within threshold")
        new = _checked_solve(state, speed)
        if isinstance(new, Decision):
            return new
        after = float(np.max(vs * state.stage_load(new)))
        if new == tuple(state.partition) or after > times.max() * (1.0 - self.min_gain):
            return Decision.keep("rebalancing would not cut the bottleneck enough")
        return _repartition(state, new, speed, f"observed imbalance {imbalance:.3f} over the "
                            f"last {self.window} steps (stage {int(np.argmax(speed))} slowest "
                            f"per layer cost); bottleneck {times.max():.4g} -> {after:.4g}")


@dataclass
class PredictivePolicy(Policy):
    """Forecast-driven repartitioning with a cost/benefit test and hysteresis.

    ``horizon``: steps the saving is summed over (a move must pay back within it); ``risk``: weight
    of the p90 forecast against the p50 in the planning speed (0 = median, 1 = pessimistic);
    ``margin``: the saving must exceed ``(1 + margin)`` x migration cost; ``min_gain``: and at
    least this fraction of the predicted step time per step; ``hold``: steps after a move during
    which it does not move again; ``min_history``: steps observed before the first decision;
    ``guard``: the forecast guard and move budget (:mod:`bubblecast.policy.forecast_guard`): while
    the forecaster's realised error is worse than the naive forecast's, the decision is
    ``fallback``'s (reactive, on at most the history there is), and no more than the budget's moves
    are made.
    ``clock``, when set before a decision, is the absolute step index of the state's last history
    row (history drops old rows live). ``timing``: also choose *when* to move, for forecasts
    that ramp in (a thermal lead's): :func:`~bubblecast.policy.viterbi.first_move` over
    decisions ``decide_every`` steps apart (live: the controller's period). ``neighbours``: also
    score the one-layer shifts of each of the solver's candidates with the engine, offline as
    live (the solver ranks splits by their bottleneck stage; for a moderate slowdown the
    engine-fastest one can be a shift away: a thermal run's (8, 9, 7, 8) against (9, 8, 7, 8)).
    """

    forecaster: SpeedForecaster = field(default_factory=TrendForecaster)
    horizon: int = 256
    risk: float = 0.3
    margin: float = 0.5
    min_gain: float = 0.01
    hold: int = 5
    min_history: int = 8
    guard: GuardConfig | dict[str, Any] | None = None
    fallback: Policy = field(default_factory=ReactivePolicy)
    name: str = "predictive"
    clock: int | None = field(default=None, repr=False)
    timing: bool = False
    decide_every: int = 1
    neighbours: bool = True

    def __post_init__(self) -> None:
        if self.horizon < 1 or not 0.0 <= self.risk <= 1.0 or self.margin < 0:
            raise BubblecastError("PredictivePolicy: horizon >= 1, risk in [0, 1], margin >= 0")
        if self.min_gain < 0 or self.hold < 0 or min(self.min_history, self.decide_every) < 1:
            raise BubblecastError("PredictivePolicy: min_gain, hold >= 0; min_history, "
                                  "decide_every >= 1")
        self._hz, self._weight = horizon_grid(self.horizon)
        self.guard = GuardConfig.coerce(self.guard)
        self.guard_ = ForecastGuard(self.guard)
        self.budget_ = MoveBudget(self.guard.max_moves, self.guard.per_steps)
        self.steps_: int | None = None  # the run's length when reset() was told it

    def reset(self, context: RunContext, state: PolicyState) -> None:
        self.steps_ = int(context.steps)
        self.guard_.reset()
        self.budget_.reset()
        self.fallback.reset(context, state)

    def plan_speeds(self, state: PolicyState) -> np.ndarray:
        """``(H, P)`` risk-weighted speeds at the horizon grid points."""
        return planning_speed(self.forecaster.forecast(state, self._hz), self.risk)

    def guard_report(self) -> dict[str, Any]:
        """Counts for the run's report: decisions, those made by the fallback, moves the
        budget blocked, and the last error ratio."""
        last = self.guard_.last
        return {**self.guard_.counts(), "budget_blocked": self.budget_.blocked,
                "trusted": bool(self.guard_.trusted),
                "last_error_ratio": None if last is None or last.ratio is None
                else round(last.ratio, 4)}

    def decide(self, state: PolicyState) -> Decision:
        if state.t + 1 < self.min_history:
            return Decision.keep("collecting history")
        now = int(state.t) if self.clock is None else int(self.clock)
        g = self.guard_
        check = g.check_index(self._hz)
        g.backtest(state, self.forecaster, now, self._hz[check])  # before: .last stays ours
        quantiles = self.forecaster.forecast(state, self._hz)
        g.remember(now, quantiles[check, :, 1])
        status = g.score(state.history, now, self._hz[check])
        g.decisions += 1
        if state.last_action is not None and state.t - state.last_action < self.hold:
            g.interrupt()
            return Decision.keep("holding after the last move (hysteresis)")
        if status.trusted:
            decision = self._forecast_decision(state, planning_speed(quantiles, self.risk))
            naive = observed_plan(self.guard, state.history, len(self._hz)) \
                if decision.acts else None  # the move seen in the speeds: no confirmation
            seen = naive is not None and self._forecast_decision(state, naive).action == \
                decision.action
            decision = g.confirmed(decision, tuple(state.partition), seen)
        else:
            g.fallback_decisions += 1
            g.interrupt()
            decision = self._fallback_decision(state, status.describe())
        if not decision.acts:
            return decision
        if not self.budget_.allows(now):
            self.budget_.blocked += 1
            return Decision.keep(f"move budget: {self.budget_.max_moves} moves in the last "
                                 f"{self.budget_.per_steps} steps already ({decision.reason})")
        self.budget_.spend(now)
        return decision

    def _fallback_decision(self, state: PolicyState, why: str) -> Decision:
        """``fallback``'s decision; a move must still pay back its migration over the
        horizon at the speeds observed lately (the naive forecast: they persist)."""
        r = self.fallback  # decides on the steps min_history found enough, not on more
        if isinstance(r, ReactivePolicy) and state.t + 1 < (w := r.window):
            r = replace(r, window=state.t + 1, cooldown=w if r.cooldown is None else r.cooldown)
        inner = r.decide(state)
        action = inner.action
        label = f"{why}: acting as {self.fallback.name}"
        if not isinstance(action, Repartition):
            return replace(inner, reason=f"{label} ({inner.reason})")
        recent = state.history[-min(len(state.history), 10):].mean(axis=0)
        plan = np.repeat(recent[None, :], len(self._hz), axis=0)
        options = [tuple(state.partition), tuple(action.partition)]
        step, _ = state.predicted_step(options, plan)
        judged = self._judge(state, options, step, plan, persistence=False)
        if not judged.acts:
            return replace(judged, reason=f"{label}: {inner.reason}, but {judged.reason}")
        return replace(judged, reason=f"{label} ({inner.reason})")

    def _forecast_decision(self, state: PolicyState, plan: np.ndarray) -> Decision:
        """The forecast-driven decision on the ``(H, P)`` planning speeds."""
        mean_speed = (plan * self._weight[:, None]).sum(axis=0) / self._weight.sum()
        current = tuple(state.partition)
        vs = state.vspeed(mean_speed)
        now = float(np.max(vs * state.stage_load(current)))
        try:
            prob = state.problem(mean_speed)
            tables = SolverTables(prob)
            opt = min_bottleneck(prob, tables)
        except BubblecastError as exc:
            return Decision.keep(f"no feasible partition: {exc}")
        if opt > now * (1.0 - self.min_gain):  # cheap screen before the engine
            return Decision.keep("forecast shows no imbalance worth a move")
        found = candidates(prob, current=current, move_bytes=state.move_bytes, tables=tables,
                           bottleneck=opt, neighbours=self.neighbours)
        options = [current] + [p for p in found if p != current]
        step, _ = state.predicted_step(options, plan)  # (K, H)
        return self._judge(state, options, step, plan)

    def _judge(self, state: PolicyState, options: list[Partition], step: np.ndarray,
               plan: np.ndarray, persistence: bool = True) -> Decision:
        """Move to the predicted-fastest option only if it pays back its migration (and the
        move back, for a slowdown) within the payback horizon (:func:`payback_plan`)."""
        left = None if self.steps_ is None else self.steps_ - 1 - int(state.t)
        weight, back, capped = payback_plan(self.guard, state.history, plan, self._hz,
                                            self._weight, left, persistence)
        # Reported numbers come from the chosen rows alone: a matmul over K candidate rows can
        # differ in the last bit from the same row scored alone (what the service reported).
        now = float((step[:1] @ self._weight / self._weight.sum())[0])
        keep = {"predicted_step_s": now, "predicted_step_with_action_s": now, "migration_s": 0.0}
        if weight.sum() <= 0:
            return Decision.keep(f"no step to pay a move back in ({capped})", **keep)
        total_time = step @ weight  # predicted seconds over the payback horizon
        # The target is the fastest over the whole horizon (to the run's end): the slowdown as
        # forecast, not as far as the payback test may count it (that cut favours the small
        # move that pays now over the layout the slowdown needs, and no second move follows).
        reach = payback_plan(self.guard, state.history, plan, self._hz, self._weight, left,
                             persistence=False)[0]
        best = int(np.argmin(step @ reach))
        if best == 0:
            return Decision.keep("current partition is predicted fastest", **keep)
        if self.timing:  # migrations cost (1 + margin) x their seconds, as paid below
            mig = (1.0 + self.margin) * state.migration.matrix(options)
            best, later = first_move(step, weight, self._hz, mig, self.decide_every)
            if best == 0:
                return Decision.keep(f"forecast's best path moves in {later} steps", **keep)
        current, target = options[0], options[best]
        saving = float(total_time[0] - total_time[best])
        cost = state.migration.seconds(current, target)
        pay = (1.0 + self.margin) * cost + (state.migration.seconds(target, current) if back else 0)
        per_step = saving / weight.sum() / max(float(step[0].mean()), 1e-12)
        if per_step < self.min_gain:
            return Decision.keep(f"predicted gain {per_step:.4f}/step below {self.min_gain}",
                                 **keep)
        if saving <= pay:
            over = f" over {weight.sum():.0f} steps ({capped})" if capped else ""
            return Decision.keep(f"saving {saving:.4g} s{over} does not pay back migration "
                                 f"{cost:.4g} s{' and back' if back else ''}", **keep)
        mean = step[[0, best]] @ self._weight / self._weight.sum()
        rank_plan = plan.mean(axis=0)
        slow = int(np.argmax(rank_plan))
        ratio = float(rank_plan[slow] / plan.mean())
        reason = (f"stage {slow} forecast {ratio:.2f}x slower than the mean per layer cost; "
                  f"{list(current)} -> {list(target)} saves {mean[0] - mean[1]:.4g} s/step "
                  f"over {self.horizon} steps, migration {cost:.4g} s")
        return Decision(Repartition(target), float(mean[0]), float(mean[1]), cost, reason)


@dataclass
class OraclePolicy(Policy):
    """Clairvoyant upper bound: the best partition sequence over a candidate set.

    Candidates: the initial partition and, for the realised per-rank speeds averaged over
    every window of ``windows`` steps (stride half a window), the engine-fastest of the
    solver's candidates and their one-layer shifts; at most ``max_candidates``, the most
    frequent first. Realised step times of every candidate at every step
    (:attr:`RunContext.true_step_times`) and the migration pauses feed a Viterbi pass.
    """

    windows: tuple[int, ...] = (8, 32, 128, 512)
    max_candidates: int = 48
    name: str = "oracle"
    plan_: list[Partition] = field(default_factory=list, init=False, repr=False)
    candidates_: list[Partition] = field(default_factory=list, init=False, repr=False)
    times_: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)), init=False,
                               repr=False)

    def reset(self, context: RunContext, state: PolicyState) -> None:
        if context.true_step_times is None or context.true_speed is None:
            raise BubblecastError("oracle policy: the run gives no realised future to plan on")
        cands = self._candidates(context, state)
        times = np.asarray(context.true_step_times(cands), dtype=np.float64)  # (K, T)
        mig = np.array([[state.migration.seconds(a, b) for b in cands] for a in cands])
        self.plan_ = [cands[i] for i in viterbi(times, mig, start=0)]
        self.candidates_ = cands
        self.times_ = times

    def _candidates(self, context: RunContext, state: PolicyState) -> list[Partition]:
        speed = np.asarray(context.true_speed, dtype=np.float64)
        T = speed.shape[0]
        counts: dict[Partition, int] = {}
        csum = np.vstack([np.zeros((1, speed.shape[1])), np.cumsum(speed, axis=0)])
        cache: dict[bytes, Partition | None] = {}
        initial = tuple(context.initial)
        for w in self.windows:
            w = min(w, T)
            for start in range(0, max(T - w, 0) + 1, max(w // 2, 1)):
                mean = (csum[start + w] - csum[start]) / w
                key = np.round(np.log(mean) * 400).astype(np.int64).tobytes()  # 0.25% bins
                if key not in cache:
                    cache[key] = self._best_for(state, mean, initial)
                part = cache[key]
                if part is not None:
                    counts[part] = counts.get(part, 0) + w
        ranked = sorted(counts, key=lambda p: (-counts[p], p))
        out = [initial] + [p for p in ranked if p != initial]
        return out[: self.max_candidates]

    @staticmethod
    def _best_for(state: PolicyState, speed: np.ndarray, initial: Partition) -> Partition | None:
        """The engine-fastest of the solver's candidates and their one-layer shifts for
        ``speed`` (None if infeasible): the predictive policy scores those shifts too, and the
        oracle stays an upper bound only over a set at least as wide."""
        try:
            found = candidates(state.problem(speed), current=initial,
                               move_bytes=state.move_bytes, neighbours=True)
        except BubblecastError:
            return None
        step, _ = state.predicted_step(found, speed)
        return found[int(np.argmin(step[:, 0]))]

    def decide(self, state: PolicyState) -> Decision:
        nxt = state.t + 1
        if nxt >= len(self.plan_):
            return Decision.keep("end of run")
        target, current = self.plan_[nxt], tuple(state.partition)
        index = {p: i for i, p in enumerate(self.candidates_)}
        now = self._true_time(index.get(current), nxt)
        if target == current:
            return Decision.keep("oracle keeps the partition", predicted_step_s=now,
                                 predicted_step_with_action_s=now, migration_s=0.0)
        return Decision(Repartition(target), now, self._true_time(index.get(target), nxt),
                        state.migration.seconds(current, target),
                        f"realised future: {list(target)} is on the least-time path")

    def _true_time(self, k: int | None, t: int) -> float | None:
        """The realised step time of candidate ``k`` at step ``t`` (None when unknown)."""
        return None if k is None else float(self.times_[k, t])


POLICIES: dict[str, Callable[..., Policy]] = {
    "static": StaticPolicy, "reactive": ReactivePolicy, "predictive": PredictivePolicy,
    "oracle": OraclePolicy,
}  # fmt: skip


def make_policy(name: str, **kwargs: Any) -> Policy:
    """The policy registered as ``name``; a one-line error naming the known ones otherwise."""
    cls = POLICIES.get(name)
    if cls is None:
        raise BubblecastError(f"--policies: unknown policy '{name}' (known: {', '.join(POLICIES)})")
    return cls(**kwargs)
