"""Policies: ``decide(state) -> Action`` after each observed step.

All four see the same :class:`PolicyState` (recent per-rank speed history, current partition,
per-layer costs, the pipeline's schedule and microbatches, the migration-cost model); an
action taken after step ``t`` applies from step ``t + 1``, whose time includes the migration
pause.

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
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bubblecast.errors import BubblecastError
from bubblecast.policy.actions import Action, NoOp, Repartition
from bubblecast.policy.cost import MigrationCost
from bubblecast.policy.forecasting import SpeedForecaster, TrendForecaster
from bubblecast.policy.pipeline import Pipeline, predicted_step
from bubblecast.policy.solver import (
    Partition,
    PartitionProblem,
    SolverTables,
    candidates,
    min_bottleneck,
    solve,
    stage_work,
)


@dataclass
class PolicyState:
    """What a policy sees after step ``t`` (index into the run, 0-based).

    ``history`` is ``(t + 1, P)``: each rank's observed speed (compute seconds per unit of
    layer cost; the slowest replica's where there are several) for steps ``0..t``;
    ``costs`` is ``(L, 3)`` per-layer F, B, W cost; ``partition`` the layers per virtual stage
    now in force; ``last_action`` the step index of the policy's last repartition (or None).
    """

    t: int
    history: np.ndarray
    partition: Partition
    costs: np.ndarray
    pipeline: Pipeline
    migration: MigrationCost
    last_action: int | None = None
    memory: np.ndarray | None = None
    memory_cap: np.ndarray | float | None = None

    def vspeed(self, rank_speed: np.ndarray) -> np.ndarray:
        """Per-virtual-stage speeds from per-rank ones (virtual stage ``c * P + r``)."""
        return np.tile(np.asarray(rank_speed, dtype=np.float64), self.pipeline.chunks)

    @property
    def move_bytes(self) -> np.ndarray | None:
        """Bytes each layer ships when it moves (None when unknown: count layers instead)."""
        b = self.migration.layer_bytes
        return b if np.any(b > 0) else None

    def problem(self, rank_speed: np.ndarray) -> PartitionProblem:
        return PartitionProblem(self.costs.sum(axis=1), np.maximum(self.vspeed(rank_speed), 1e-12),
                                memory=self.memory, memory_cap=self.memory_cap)


@dataclass
class RunContext:
    """Facts about a run fixed before it starts; only the oracle reads ``true_step_times``.

    ``true_step_times(partitions)`` returns the realised ``(K, T)`` step times (migration
    excluded) of each partition at every step of the run.
    """

    steps: int
    initial: Partition
    true_step_times: Callable[[list[Partition]], np.ndarray] | None = None
    true_speed: np.ndarray | None = None  # (T, P) realised per-rank speeds


class Policy:
    """Base class: ``reset`` once per run, then ``decide`` after every step."""

    name = "policy"

    def reset(self, context: RunContext, state: PolicyState) -> None:
        """Prepare for a run (``state`` is the state before step 0)."""

    def decide(self, state: PolicyState) -> Action:
        raise NotImplementedError


class StaticPolicy(Policy):
    """Keeps the initial partition for the whole run."""

    name = "static"

    def decide(self, state: PolicyState) -> Action:
        return NoOp(reason="static policy never acts")


def _checked_solve(state: PolicyState, speed: np.ndarray, **kw: Any) -> Partition | NoOp:
    try:
        return solve(state.problem(speed), **kw)
    except BubblecastError as exc:
        return NoOp(reason=f"no feasible partition: {exc}")


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

    def decide(self, state: PolicyState) -> Action:
        if state.t + 1 < self.window:
            return NoOp(reason="collecting history")
        wait = self.window if self.cooldown is None else self.cooldown
        if state.last_action is not None and state.t - state.last_action < wait:
            return NoOp(reason="cooldown after the last move")
        speed = state.history[-self.window:].mean(axis=0)
        vs = state.vspeed(speed)
        times = vs * stage_work(state.partition, state.costs.sum(axis=1))
        imbalance = times.max() / times.mean() - 1.0
        if imbalance <= self.threshold:
            return NoOp(reason=f"imbalance {imbalance:.3f} within threshold")
        new = _checked_solve(state, speed)
        if isinstance(new, NoOp):
            return new
        after = float(np.max(vs * stage_work(new, state.costs.sum(axis=1))))
        if new == tuple(state.partition) or after > times.max() * (1.0 - self.min_gain):
            return NoOp(reason="rebalancing would not cut the bottleneck enough")
        return Repartition(new)


#: Forecast horizons the predictive policy scores, and the steps each one stands for.
def _horizon_grid(horizon: int) -> tuple[np.ndarray, np.ndarray]:
    points = [1]
    while points[-1] * 2 <= horizon:
        points.append(points[-1] * 2)
    if points[-1] != horizon:
        points.append(horizon)
    hz = np.array(points, dtype=np.int64)
    weight = np.diff(np.r_[0, hz]).astype(np.float64)
    return hz, weight


@dataclass
class PredictivePolicy(Policy):
    """Forecast-driven repartitioning with a cost/benefit test and hysteresis.

    ``horizon``: steps the saving is summed over (a move must pay back within it);
    ``risk``: weight of the p90 forecast against the p50 in the planning speed (0 = median,
    1 = pessimistic); ``margin``: the saving must exceed ``(1 + margin)`` x migration cost;
    ``min_gain``: and at least this fraction of the predicted step time per step; ``hold``:
    steps after a move during which it does not move again; ``min_history``: steps observed
    before the first decision.
    """

    forecaster: SpeedForecaster = field(default_factory=TrendForecaster)
    horizon: int = 256
    risk: float = 0.3
    margin: float = 0.5
    min_gain: float = 0.01
    hold: int = 5
    min_history: int = 8
    name: str = "predictive"

    def __post_init__(self) -> None:
        if self.horizon < 1 or not 0.0 <= self.risk <= 1.0 or self.margin < 0:
            raise BubblecastError("PredictivePolicy: horizon >= 1, risk in [0, 1], margin >= 0")
        if self.min_gain < 0 or self.hold < 0 or self.min_history < 1:
            raise BubblecastError("PredictivePolicy: min_gain, hold >= 0 and min_history >= 1")
        self._hz, self._weight = _horizon_grid(self.horizon)

    def plan_speeds(self, state: PolicyState) -> np.ndarray:
        """``(H, P)`` risk-weighted speeds at the horizon grid points."""
        q = self.forecaster.forecast(state, self._hz)  # (H, P, 3)
        return (1.0 - self.risk) * q[:, :, 1] + self.risk * q[:, :, 2]

    def decide(self, state: PolicyState) -> Action:
        if state.t + 1 < self.min_history:
            return NoOp(reason="collecting history")
        if state.last_action is not None and state.t - state.last_action < self.hold:
            return NoOp(reason="holding after the last move (hysteresis)")
        plan = self.plan_speeds(state)
        mean_speed = (plan * self._weight[:, None]).sum(axis=0) / self._weight.sum()
        current = tuple(state.partition)
        total = state.costs.sum(axis=1)
        vs = state.vspeed(mean_speed)
        now = float(np.max(vs * stage_work(current, total)))
        try:
            prob = state.problem(mean_speed)
            tables = SolverTables(prob)
            opt = min_bottleneck(prob, tables)
        except BubblecastError as exc:
            return NoOp(reason=f"no feasible partition: {exc}")
        if opt > now * (1.0 - self.min_gain):  # cheap screen before the engine
            return NoOp(reason="forecast shows no imbalance worth a move")
        found = candidates(prob, current=current, move_bytes=state.move_bytes,
                           tables=tables, bottleneck=opt)
        options = [current] + [p for p in found if p != current]
        step, _ = predicted_step(state.pipeline, options, state.costs, plan)  # (K, H)
        total_time = step @ self._weight  # predicted seconds over the horizon
        best = int(np.argmin(total_time))
        if best == 0:
            return NoOp(reason="current partition is predicted fastest")
        saving = float(total_time[0] - total_time[best])
        cost = state.migration.seconds(current, options[best])
        per_step = saving / self._weight.sum() / max(float(step[0].mean()), 1e-12)
        if per_step < self.min_gain:
            return NoOp(reason=f"predicted gain {per_step:.4f}/step below {self.min_gain}")
        if saving <= (1.0 + self.margin) * cost:
            return NoOp(reason=f"saving {saving:.4g} s does not pay back migration {cost:.4g} s")
        return Repartition(options[best])


@dataclass
class OraclePolicy(Policy):
    """Clairvoyant upper bound: the best partition sequence over a candidate set.

    Candidates: the initial partition and, for the realised per-rank speeds averaged over
    every window of ``windows`` steps (stride half a window), the engine-fastest of the
    solver's candidates; at most ``max_candidates``, the most frequent first. Realised step
    times of every candidate at every step (:attr:`RunContext.true_step_times`) and the
    migration pauses feed a Viterbi pass.
    """

    windows: tuple[int, ...] = (8, 32, 128, 512)
    max_candidates: int = 48
    name: str = "oracle"
    plan_: list[Partition] = field(default_factory=list, init=False, repr=False)

    def reset(self, context: RunContext, state: PolicyState) -> None:
        if context.true_step_times is None or context.true_speed is None:
            raise BubblecastError("oracle policy: the run gives no realised future to plan on")
        cands = self._candidates(context, state)
        times = np.asarray(context.true_step_times(cands), dtype=np.float64)  # (K, T)
        mig = np.array([[state.migration.seconds(a, b) for b in cands] for a in cands])
        self.plan_ = [cands[i] for i in viterbi(times, mig, start=0)]
        self.candidates_ = cands

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
        """The engine-fastest of the solver's candidates for ``speed`` (None if infeasible)."""
        try:
            found = candidates(state.problem(speed), current=initial,
                               move_bytes=state.move_bytes)
        except BubblecastError:
            return None
        step, _ = predicted_step(state.pipeline, found, state.costs, speed)
        return found[int(np.argmin(step[:, 0]))]

    def decide(self, state: PolicyState) -> Action:
        nxt = state.t + 1
        if nxt >= len(self.plan_):
            return NoOp(reason="end of run")
        target = self.plan_[nxt]
        if target == tuple(state.partition):
            return NoOp(reason="oracle keeps the partition")
        return Repartition(target)


def viterbi(times: np.ndarray, migration: np.ndarray, start: int = 0) -> list[int]:
    """Least-total-time path over states: ``times`` is ``(K, T)`` step time of each state at
    each step; switching ``a -> b`` before step ``t`` adds ``migration[a, b]`` to step ``t``.
    Step 0 runs in state ``start``. Returns the state of every step."""
    k, T = times.shape
    total = np.full(k, np.inf)
    total[start] = times[start, 0]
    back = np.zeros((T, k), dtype=np.int64)
    back[0] = start
    for t in range(1, T):
        via = total[:, None] + migration  # (from, to)
        frm = np.argmin(via, axis=0)
        total = via[frm, np.arange(k)] + times[:, t]
        back[t] = frm
    path = [int(np.argmin(total))]
    for t in range(T - 1, 0, -1):
        path.append(int(back[t, path[-1]]))
    return path[::-1]


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
