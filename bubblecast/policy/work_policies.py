"""Work-balancing policies: before every step, one plan of the step's documents.

Each policy's ``decide(t)`` returns the step's :class:`~bubblecast.policy.work_plan.WorkPlan`
and one :class:`~bubblecast.policy.decision.Decision` whose action is that plan
(:class:`~bubblecast.policy.actions.PlanWork`), with the predicted step time of the data
loader's plan (``predicted_step_s``) and of the plan (``predicted_step_with_action_s``) where
the policy predicts in seconds, ``migration_s`` 0 (no layer moves) and a one-line reason (a
planner fall-back's reason verbatim).

What they see (:class:`WorkContext`): the loader's shape and each step's documents (what the
data loader holds), and telemetry of the steps before the decision
(:class:`~bubblecast.policy.work_fit.MicrobatchTable` cut at ``t``). Never simulator truth;
only :class:`OracleWork` is handed :class:`WorkTruth` explicitly.

- :class:`StaticWork`: the data loader's plan (:func:`~bubblecast.policy.work_plan.plan_static`).
- :class:`TokensWork`: token balancing, the hand-written heuristic: the planner on token counts,
  equal speeds, counts never rebalanced.
- :class:`BalanceWork`: the planner on a cost model (a learned one, or fitted online to the
  run's own earlier steps: tokens until it has data) and each replica's forecast speed: each
  rank's observed compute over the cost model's prediction for it, forecast one step ahead by
  the trend forecaster (or a trained model's table); a replica runs at its slowest rank's pace.
- :class:`OracleWork`: the same planner given the true costs and the true current speeds.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from bubblecast.errors import BubblecastError
from bubblecast.policy.actions import PlanWork
from bubblecast.policy.decision import Decision
from bubblecast.policy.forecasting import TrendForecaster
from bubblecast.policy.work_fit import MicrobatchTable, fit_cost_and_speeds, observed_speeds
from bubblecast.policy.work_plan import TOKENS, PlanConfig, WorkPlan, plan_batch, plan_static
from bubblecast.policy.work_timing import predicted_plan_step
from bubblecast.sim.documents import WorkCost

#: Policies that plan each step's documents (``static`` and ``oracle`` mean these on a
#: packed-document run, partition policies elsewhere).
WORK_POLICIES: tuple[str, ...] = ("static", "tokens", "balance", "oracle")
#: The names only work planning has.
WORK_ONLY: tuple[str, ...] = ("tokens", "balance")
ONLINE_COST = "online fit from the run's own telemetry"


@dataclass(frozen=True)
class WorkContext:
    """What every work policy sees of a run: ``config`` (the loader's shape and token budget),
    ``lengths[t]`` (step ``t``'s documents in the loader's order) and ``table`` (telemetry;
    a decision for step ``t`` reads ``table.head(t)`` only). ``run_id`` names the run."""

    run_id: str
    config: PlanConfig
    lengths: tuple[np.ndarray, ...]
    table: MicrobatchTable


@dataclass(frozen=True)
class WorkTruth:
    """A simulated run's ground truth, for the oracle and the evaluation only: ``cost`` (the
    true per-micro-batch cost multiplier), ``speed`` ``(T, R, P)`` (each rank's true slowdown),
    ``vstage_kind`` ``(T, V, 3)`` (each virtual stage's F, B, W seconds per unit of cost at
    speed 1), ``owner`` ``(V,)`` (the rank of each virtual stage) and ``comm_s``."""

    cost: WorkCost
    speed: np.ndarray
    vstage_kind: np.ndarray
    owner: np.ndarray
    comm_s: float = 0.0

    @property
    def chunks(self) -> int:
        return len(self.owner) // self.speed.shape[2]

    def rank_seconds(self, t: int) -> np.ndarray:
        """``(P,)`` each rank's F + B + W seconds per unit of cost at speed 1 (its chunks)."""
        return np.bincount(self.owner, self.vstage_kind[t].sum(axis=1),
                           minlength=self.speed.shape[2])


def plan_action(plan: WorkPlan) -> PlanWork:
    """The plan as its JSON-able action."""
    return PlanWork(tuple(plan.counts), plan.microbatches)


class WorkPolicy:
    """Base class: ``reset`` once per run, then ``decide(t)`` before each step ``t``."""

    name = "work"

    def reset(self, context: WorkContext) -> None:
        """Prepare for a run."""
        self.context_ = context

    def decide(self, t: int) -> tuple[WorkPlan, Decision]:
        """Step ``t``'s plan and the decision carrying it."""
        raise NotImplementedError

    def report(self) -> dict[str, Any]:
        """Notes for the run's report (none by default)."""
        return {}

    def _decision(self, plan: WorkPlan, before: float | None, after: float | None,
                  reason: str) -> tuple[WorkPlan, Decision]:
        return plan, Decision(plan_action(plan), before, after, 0.0,
                              plan.fallback or reason)


class StaticWork(WorkPolicy):
    """The data loader's plan: sequential first-fit in arrival order."""

    name = "static"

    def decide(self, t: int) -> tuple[WorkPlan, Decision]:
        c = self.context_
        return self._decision(plan_static(c.lengths[t], c.config), None, None,
                              "the data loader's packing (sequential first-fit, in order)")


class TokensWork(WorkPolicy):
    """Token balancing: the planner on token counts, equal speeds, equal counts."""

    name = "tokens"

    def decide(self, t: int) -> tuple[WorkPlan, Decision]:
        c = self.context_
        config = replace(c.config, rebalance_counts=False)
        plan = plan_batch(c.lengths[t], config, TOKENS, None, method="tokens")
        top = max(max(r) for r in plan.cost)
        return self._decision(plan, None, None, f"token balancing: largest micro-batch "
                              f"{top:.0f} tokens")


@dataclass
class BalanceWork(WorkPolicy):
    """The planner on a cost model and forecast replica speeds (see the module doc).

    ``cost_model``: an object with ``work_cost()`` (per-layer seconds at speed 1) and
    ``kind_weights()``; None fits a non-negative linear model online to the run's own steps
    (first after ``min_fit_steps`` steps, then every ``refit_every``, on at most the last
    ``fit_window``), planning on token counts until then. ``forecaster``: a
    :class:`~bubblecast.policy.forecasting.TrendForecaster` (default) or any object with
    ``forecast_history(history, horizons)``; ``speed_table``: a trained model's one-step
    speed forecasts ``(T, R, P)`` made after each step (NaN: use ``forecaster``), in the
    model's unit (rescaled to ours by the median ratio over the steps seen so far).
    ``use_speeds=False`` plans every replica at the same pace (the speed-blind baseline a
    slowdown's recovery is measured against)."""

    cost_model: Any = None
    forecaster: Any = field(default_factory=TrendForecaster)
    refit_every: int = 25
    min_fit_steps: int = 2
    fit_window: int = 256
    speed_table: np.ndarray | None = field(default=None, repr=False)
    speed_signal: np.ndarray | None = field(default=None, repr=False)
    use_speeds: bool = True
    name: str = "balance"

    def __post_init__(self) -> None:
        if min(self.refit_every, self.min_fit_steps, self.fit_window) < 1:
            raise BubblecastError("balance: refit_every, min_fit_steps and fit_window must be "
                                  ">= 1")

    def reset(self, context: WorkContext) -> None:
        super().reset(context)
        self.fitted_at_: int | None = None
        self.cost_: WorkCost | None = None
        self.kinds_: tuple[float, float, float] = context.config.kind_weights
        self.counts_: list[list[int]] = []
        if self.cost_model is not None:
            self.cost_ = self.cost_model.work_cost()
            self.kinds_ = tuple(float(x) for x in self.cost_model.kind_weights())

    def report(self) -> dict[str, Any]:
        counts = np.asarray(self.counts_, dtype=np.int64)
        m = self.context_.config.microbatches
        summary = {"rebalanced_steps": int((counts != m).any(axis=1).sum()) if counts.size
                   else 0, "steps": int(len(counts)),
                   "mean_per_replica": counts.mean(axis=0).round(4).tolist() if counts.size
                   else [], "min": int(counts.min()) if counts.size else None,
                   "max": int(counts.max()) if counts.size else None}
        model = self.cost_model
        note = ONLINE_COST if model is None else "learned cost model " + str(
            getattr(model, "source_", None) or getattr(model, "name", None) or type(model).__name__)
        out = {"cost_model": note, "microbatch_counts": summary}
        if model is None:  # the coefficients it planned the last steps with (None: never fitted)
            out["cost_model_fit"] = None if self.cost_ is None else self.cost_.to_json()
        return out

    def _refit(self, t: int, seen: MicrobatchTable) -> None:
        """The online cost fit, when due (rows of the last ``fit_window`` steps before t)."""
        if self.cost_model is not None or t < self.min_fit_steps:
            return
        if self.fitted_at_ is not None and t - self.fitted_at_ < self.refit_every:
            return
        cost, _ = fit_cost_and_speeds(seen.rows(max(0, t - self.fit_window), t))
        if cost is not None:
            self.cost_, self.fitted_at_ = cost, t
            self.kinds_ = seen.kind_weights()

    def speeds(self, t: int, seen: MicrobatchTable, cost: WorkCost) -> np.ndarray:
        """``(R, P)`` forecast speed of every rank at step ``t`` from steps ``< t`` (ones
        before any), times the layers it holds (the planner's per-rank multiplier)."""
        c = self.context_.config
        if t == 0:
            return np.ones((c.replicas, c.stages))
        if not self.use_speeds:
            return np.ones((c.replicas, c.stages)) * seen.layers[-1]
        hist = observed_speeds(seen, cost)  # (t, R, P)
        ahead = None
        if self.speed_table is not None and self.speed_signal is not None:
            ahead = _from_table(self.speed_table, self.speed_signal, hist, t)
        if ahead is None:
            flat = hist.reshape(t, -1)
            ahead = self.forecaster.forecast_history(flat, np.array([1]))[0, :, 1]
            ahead = ahead.reshape(hist.shape[1:])
        return np.maximum(ahead, 1e-6) * seen.layers[-1]

    def decide(self, t: int) -> tuple[WorkPlan, Decision]:
        ctx = self.context_
        seen = ctx.table.head(t)
        self._refit(t, seen)
        lengths = ctx.lengths[t]
        if self.cost_ is None:
            plan = plan_batch(lengths, replace(ctx.config, rebalance_counts=False), TOKENS,
                              None, method="balance")
            self.counts_.append(plan.counts)
            return self._decision(plan, None, None, "no cost model fitted yet (needs "
                                  f"{self.min_fit_steps} steps): token balancing")
        speeds = self.speeds(t, seen, self.cost_)
        config = replace(ctx.config, kind_weights=self.kinds_)
        plan = plan_batch(lengths, config, self.cost_, speeds, method="balance")
        self.counts_.append(plan.counts)
        pace = speeds.max(axis=1)
        if t == 0:  # no telemetry yet: equal speeds, layers unknown, no prediction in seconds
            return self._decision(plan, None, None, f"no telemetry yet: equal speeds, counts "
                                  f"{plan.counts}")
        loader = plan_static(lengths, config, self.cost_)
        before = predicted_plan_step(config.schedule, config.stages, loader.cost, speeds,
                                     self.kinds_)
        return self._decision(plan, before, plan.predicted_step,
                              f"replica pace {np.round(pace / pace.min(), 3).tolist()}, "
                              f"counts {plan.counts}: predicted {before:.4g} s -> "
                              f"{plan.predicted_step or 0.0:.4g} s")


def _from_table(table: np.ndarray, signal: np.ndarray, hist: np.ndarray, t: int
                ) -> np.ndarray | None:
    """The trained model's forecast made after step ``t - 1``, rescaled to ``hist``'s unit
    by the median ratio over the steps before ``t``; None when it has none there."""
    row = table[t - 1]
    seen = signal[:t]
    ok = np.isfinite(seen) & (seen > 0)
    if not np.all(np.isfinite(row)) or not ok.any():
        return None
    scale = float(np.median(hist[ok] / seen[ok]))
    return row * scale


class OracleWork(WorkPolicy):
    """The planner given the true costs and the true current speeds (the bound the others are
    measured by); built with the run's :class:`WorkTruth`."""

    name = "oracle"

    def __init__(self, truth: WorkTruth | None = None) -> None:
        self.truth = truth

    def reset(self, context: WorkContext) -> None:
        if self.truth is None:
            raise BubblecastError(f"run '{context.run_id}': the oracle needs the run's ground "
                                  "truth (a simulated packed-document run)")
        super().reset(context)

    def decide(self, t: int) -> tuple[WorkPlan, Decision]:
        ctx, truth = self.context_, self.truth
        assert truth is not None
        kinds = tuple(float(x) for x in truth.vstage_kind[t].sum(axis=0))
        config = replace(ctx.config, kind_weights=kinds)
        speeds = truth.speed[t] * truth.rank_seconds(t)[None, :]
        plan = plan_batch(ctx.lengths[t], config, truth.cost, speeds, method="oracle")
        loader = plan_static(ctx.lengths[t], config, truth.cost)
        before = predicted_plan_step(config.schedule, config.stages, loader.cost, speeds,
                                     kinds)  # the planner's model: no communication time
        return self._decision(plan, before, plan.predicted_step,
                              f"true costs and speeds: counts {plan.counts}")


def make_work_policy(name: str, truth: WorkTruth | None = None, **params: Any) -> WorkPolicy:
    """The work policy ``name`` with ``params`` (BubblecastError for an unknown name or a
    bad parameter)."""
    try:
        if name == "static":
            return StaticWork()
        if name == "tokens":
            return TokensWork()
        if name == "balance":
            return BalanceWork(**params)
        if name == "oracle":
            return OracleWork(truth)
    except TypeError as exc:
        raise BubblecastError(f"policy '{name}': {exc}") from None
    raise BubblecastError(f"--policies: unknown work policy '{name}' (known: "
                          f"{', '.join(WORK_POLICIES)})")
