"""Rank 0's side of the loop: keep the run's history and turn it into one recorded decision.

:class:`Decider` adds each boundary's gathered telemetry to its :class:`History`, builds the
policy's :class:`PolicyState` (robust speeds, measured layer costs, the plan, the migration
cost) and asks, depending on the configuration:

- the policy itself, with its forecaster: the built-in trend forecaster, a trained model or a
  custom forecaster, all in process;
- or an *external decider* (``bubblecast run --service``: a prediction service), injected by
  import path so that runtime never imports serve (:class:`ExternalDecider`).

A trained model that reads device-metric covariates (:mod:`.covariate_model`) is the *learned
lead* (:mod:`.learned_lead`): from when it forecasts a rank's slowdown that has not begun (the
rank is below the slowdown temperature it reports) until the slowdown shows in the speeds, the
decision is taken as with the thermal lead of :mod:`.lead`, the forecast guard's error check
off and move timing on, since the guard's record cannot score a change not yet seen, on the
lead's forecast; otherwise the policy decides as with any model.

Either way the answer is the policy's :class:`~bubblecast.policy.decision.Decision`, recorded
as it is. A forecaster that is down or raises yields a decision to keep the plan saying why:
training goes on under the current plan. The decider itself sets no deadline: the controller
runs :meth:`Decider.observe` and :meth:`Decider.decide` on its decision thread
(:mod:`.decision_thread`), which gives up on a slow one, and records that with
:func:`unavailable`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

import numpy as np

from bubblecast.policy.actions import Repartition, action_to_json
from bubblecast.policy.cost import MigrationConstants, MigrationCost
from bubblecast.policy.decision import Decision
from bubblecast.runtime.control.control_config import ControllerConfig, make_policy
from bubblecast.runtime.control.covariate_model import CovariateModel, device_frame
from bubblecast.runtime.control.forecasters import (
    CachingForecaster,
    ForecastUnavailable,
    ModelSpeeds,
    load_forecaster,
)
from bubblecast.runtime.control.learned_lead import LearnedLead
from bubblecast.runtime.control.observe import (
    History,
    RawHistoryForecaster,
    robust_speeds,
    since_last_move,
    unpack,
    unpack_temperatures,
    window_speed,
)

#: Predictive-policy knobs an external decider is sent.
SERVICE_PARAMS = ("horizon", "risk", "margin", "min_gain", "hold", "min_history")
Pending = list[tuple[int, tuple[int, ...], int]]  # (step, partition, micro-batches) per step


class ExternalDecider(Protocol):
    """Decides in the policy's place (e.g. ``bubblecast.serve.decider:ServiceDecider``).

    Built as ``factory(url, timeout_s, params)`` with the predictive policy's knobs; asked with
    the policy's state plus the raw ``(T, P)`` compute seconds and layer cost held per step,
    ``step`` set first to the step number of their newest row. It fails open: no answer is a
    decision to keep the plan.
    """

    name: str
    step: int | None

    def decide(self, state: Any, compute: np.ndarray, held: np.ndarray) -> Decision: ...

    def close(self) -> None: ...


DeciderFactory = Callable[[str, float, dict[str, Any]], ExternalDecider]


class Decider:
    """Rank 0's decisions for one controlled trainer; see the module docstring.

    ``plan`` is the trainer's current plan (read at each decision), ``param_bytes`` each
    layer's parameter bytes; ``external`` builds the decider ``config.service`` asks.
    """

    def __init__(self, config: ControllerConfig, plan: Any, param_bytes: np.ndarray,
                 external: DeciderFactory | None = None) -> None:
        c = self.config = config
        self.history = History(plan.stages, plan.layers, limit=c.history,
                               cost_samples=c.cost_samples,
                               measured_costs=c.layer_costs == "measured",
                               split_backward=plan.info.split_backward)
        self.param_bytes = param_bytes
        self.constants: MigrationConstants = c.constants
        self.external: ExternalDecider | None = None
        self.forecaster: CachingForecaster | None = None
        self.broken: str | None = None
        self.note: str | None = None
        self._raw: np.ndarray | None = None
        self._temps: dict[int, np.ndarray] = {}  # step -> the ranks' temperatures
        self._slowdown: np.ndarray | None = None  # the ranks' slowdown temperatures
        self.learned = LearnedLead(rise=c.lead_rise)  # a covariate model's announced slowdowns
        self.lead = None
        if c.policy == "predictive" and c.thermal_lead:
            from bubblecast.runtime.control.lead import ThermalLead

            self.lead = ThermalLead()  # its constants come from the ranks' device metrics
        if c.policy == "predictive" and c.service is not None:
            self.policy = make_policy(c)  # the service runs it: send its knobs
            if external is None:
                self.broken = "no external decider given for --service"
            else:
                params = {k: getattr(self.policy, k) for k in SERVICE_PARAMS}
                self.external = external(c.service, c.timeout_s, params)
            self.note = f"service {c.service} (/v1/recommend)"
        elif c.policy == "predictive":
            try:
                inner, self.note = load_forecaster(c.model, c.forecaster)
            except Exception as exc:  # noqa: BLE001 - fail open: decisions keep the plan
                self.broken = f"forecaster unavailable ({type(exc).__name__}: {exc})"
                inner, self.note = None, self.broken
            self.forecaster = CachingForecaster(inner) if inner is not None else None
            self.policy = make_policy(c, self.forecaster)
        else:
            self.policy = make_policy(c)

    def observe(self, rows: np.ndarray, pending: Pending) -> None:
        """Add the gathered ``(P, 1 + every + 2L)`` rows of one boundary to the history."""
        compute, fwd, tot = unpack(rows, self.config.every, len(self.param_bytes))
        n = compute.shape[0]
        pend = pending[-n:] if n else []
        self.history.add([s for s, _, _ in pend], compute, [p for _, p, _ in pend],
                         [m for _, _, m in pend])
        self.history.add_samples(fwd, tot)
        if not pend:
            return
        temps, slowdown = unpack_temperatures(rows, self.config.every, len(self.param_bytes))
        steps = [s for s, _, _ in pend]
        if np.isfinite(temps).any() or np.isfinite(slowdown).any():  # device metrics
            self._temps.update(zip(steps, temps, strict=True))
            for old in sorted(self._temps)[:-self.config.history]:
                del self._temps[old]
            self._slowdown = slowdown if self._slowdown is None else \
                np.where(np.isfinite(slowdown), slowdown, self._slowdown)
        if self.lead is not None:
            self.lead.add(steps, temps, slowdown)

    def advance(self, rows: np.ndarray, pending: Pending, plan: Any, step: int,
                last_move: int | None, measured: list[dict[str, Any]] | None,
                skip: Callable[[], bool] | None = None
                ) -> tuple[Decision, dict[str, Any]] | None:
        """One boundary: learn from new ``measured`` migrations, :meth:`observe` the gathered
        ``rows`` and, unless ``skip()`` says the caller gave up on this decision (None then),
        :meth:`decide` after ``step`` under ``plan``."""
        if measured:
            self.measured(measured)
        self.observe(rows, pending)
        if skip is not None and skip():
            return None
        return self.decide(plan, step, last_move)

    def decide(self, plan: Any, step: int, last_move: int | None
               ) -> tuple[Decision, dict[str, Any]]:
        """The decision after ``step`` (applied before ``step + 2``) and its record: the step
        it applies before, the action, the policy's predicted numbers, the latency."""
        current = tuple(plan.partition)
        t0 = time.perf_counter()
        facts: dict[str, Any] = {}
        try:
            decision, facts = self._ask(plan, current, last_move)
        except ForecastUnavailable as exc:
            decision = Decision.keep(f"{exc}; keeping the current plan")
        except Exception as exc:  # noqa: BLE001 - never stop training over a decision
            decision = Decision.keep(f"decision failed ({type(exc).__name__}: {exc}); keeping "
                                     "the current plan")
        latency = time.perf_counter() - t0
        action = decision.action
        if isinstance(action, Repartition) and tuple(action.partition) == current:
            decision = Decision.keep("the policy keeps the current partition")
        reason = decision.reason
        if decision.acts and not reason:
            target = list(action.partition) if isinstance(action, Repartition) \
                else action_to_json(action)
            reason = f"{self.config.policy}: {list(current)} -> {target}"
        h = self.history
        observed = int(h.steps[-1]) if len(h) else None
        return decision, _record(decision, reason, step, observed, latency, facts)

    def measured(self, actions: list[dict[str, Any]]) -> None:
        """Migration constants from the run's own migrations, once it has some."""
        from bubblecast.policy.cost import run_constants

        self.constants = run_constants({"actions": actions}, self.config.constants) \
            or self.constants

    def state(self, plan: Any, current: tuple[int, ...], last_move: int | None) -> Any:
        """The policy's state now: robust speeds, costs, the plan, the migration cost."""
        from bubblecast.policy.state import PolicyState
        from bubblecast.sim.steptime import timing_shape

        h = self.history
        costs = h.costs()
        self._raw = h.speeds(costs)
        t = len(h) - 1
        last = None if last_move is None else t - (int(h.steps[-1]) - (last_move - 1))
        pipe = timing_shape(plan.schedule, plan.stages, plan.microbatches, plan.chunks, 0.0)
        fixed = h.fixed(costs)
        return PolicyState(t=t, history=robust_speeds(self._raw, self.config.smooth),
                           partition=current, costs=costs, pipeline=pipe,
                           migration=MigrationCost(self.param_bytes, self.constants),
                           last_action=last,
                           fixed=np.full(plan.stages, fixed) if fixed > 0 else None)

    def _ask(self, plan: Any, current: tuple[int, ...], last_move: int | None
             ) -> tuple[Decision, dict[str, Any]]:
        """The decision and the speeds it saw (``speed_recent``, ``speed_plan``)."""
        if self.config.policy == "static":  # never looks at the state
            return self.policy.decide(None), {}
        if len(self.history) == 0:
            return Decision.keep("no telemetry yet"), {}
        if self.broken is not None:
            raise ForecastUnavailable(self.broken)
        state = self.state(plan, current, last_move)
        recent = window_speed(state.history, 10)
        facts: dict[str, Any] = {"speed_recent": [round(float(x), 4) for x in recent]}
        if state.fixed is not None:  # the per-op cost the speeds and the plans include
            facts["fixed_s"] = round(float(state.fixed[0]), 6)
        if self.external is not None:
            held = self.history.held(state.costs)
            self.external.step = int(self.history.steps[-1])
            return self.external.decide(state, self.history.compute, held), facts
        if self.forecaster is None:  # reactive
            return self.policy.decide(state), facts
        inner = self.forecaster.inner
        if isinstance(inner, ModelSpeeds):
            inner.window = self._window(state)
            inner.offset = int(self.history.steps[-1]) - state.t  # ACI: origins by step
            if isinstance(inner.model, CovariateModel):  # its covariates: device metrics
                inner.model.device = self._device()
        self.forecaster.last = None
        if hasattr(self.policy, "clock"):  # the forecast guard keys origins by step number
            self.policy.clock = int(self.history.steps[-1])
        if isinstance(inner, RawHistoryForecaster):  # built-in, in-process numpy: no thread
            inner.history = since_last_move(self._raw, self.history.partitions)
            leading = False
            if self.lead is not None:  # the leading signal: temperatures
                self.lead.note_speeds(recent)
                inner.lead, inner.now = self.lead, int(self.history.steps[-1])
                leading = self.lead.leading(recent)
                if self.lead.active:
                    facts["lead"] = {str(r): round(f, 3) for r, f in self.lead.active.items()}
                    facts["lead_constants"] = {str(r): self.lead.constants[r]
                                               for r in self.lead.active}
                if self.lead.unknown:
                    facts["lead_unknown"] = sorted(self.lead.unknown)
            if leading:
                state = self._lead_state(state, min(self.lead.onset.values(), default=None))
            decision = self._decide_leading(state) if leading else self.policy.decide(state)
        elif isinstance(inner, ModelSpeeds) and isinstance(inner.model, CovariateModel):
            decision = self._ask_learned(inner, state, recent, facts)
            if inner.model.missing:  # their covariates were NaN (covariate_model docstring)
                facts["device_metrics_missing"] = inner.model.missing
        else:
            decision = self.policy.decide(state)
        if self.forecaster.last is not None:
            from bubblecast.policy.state import mean_planning_speed

            speed = mean_planning_speed(*self.forecaster.last, self.policy.risk)
            facts["speed_plan"] = [round(float(x), 4) for x in speed]
        report = getattr(self.policy, "guard_report", None)
        if callable(report):  # the forecast guard's verdict and counts so far
            facts["guard"] = report()
        return decision, facts

    def _ask_learned(self, inner: ModelSpeeds, state: Any, recent: np.ndarray,
                     facts: dict[str, Any]) -> Decision:
        """The decision with a covariate model: while its lead holds (:mod:`.learned_lead`),
        as with the thermal lead (:meth:`_decide_leading`) on the lead's forecast, else the
        policy's own, forecast guard included."""
        lead = self.learned
        below = np.zeros(self.history.stages, dtype=bool)
        if self._slowdown is not None and self._temps:
            now = self._temps[max(self._temps)]
            below = np.isfinite(now) & np.isfinite(self._slowdown) & \
                (now < self._slowdown - 0.5)
        q, hz = None, None
        if below.any() and inner.window.steps >= inner.min_window:
            # a throttle not yet begun can be announced once the model's features can be
            # built (its min_window steps, as ModelSpeeds requires): ask the model
            hz = sorted(int(h) for h in inner.model.horizons)
            q = inner.model.predict_window(inner.window, hz)  # (P, H, 3) delay quantiles
        announced = lead.update(int(self.history.steps[-1]), recent, below, q, hz)
        if not announced:
            return self.policy.decide(state)
        facts["learned_lead"] = {str(r): round(x, 3) for r, x in announced.items()}
        return self._decide_leading(self._lead_state(state, lead.onset), "learned lead",
                                    lead.forecaster(recent))

    def _lead_state(self, state: Any, onset: int | None) -> Any:
        """``state`` with no last move when that move came before the lead's ``onset``: the
        hold after it stops a second reaction to the same noise, not a newly announced fault."""
        if state.last_action is None or onset is None:
            return state
        moved = int(self.history.steps[-1]) - (state.t - state.last_action)
        return replace(state, last_action=None) if moved < onset else state

    def _decide_leading(self, state: Any, what: str = "thermal lead",
                        forecaster: Any = None) -> Decision:
        """The policy's decision with the forecast guard's error check and its persistence
        test off, and with move timing on: a throttle the temperature announces has not shown
        in the speeds the guard scores forecasts on, nor lasted any steps yet (a thermal
        throttle persists: the payback horizon is not cut to its age so far, which would be 0
        before it begins); and it ramps in from a known step, so the move waits for the
        forecast's least-time path (``PredictivePolicy.timing``) rather than taking the full
        slowdown's split before the slowdown starts."""
        guard = getattr(self.policy, "guard", None)
        if guard is None or not hasattr(guard, "enabled"):
            return self.policy.decide(state)
        flags = [(guard, k, False) for k in ("enabled", "persistence") if hasattr(guard, k)]
        if hasattr(self.policy, "timing"):
            flags.append((self.policy, "timing", True))
        if forecaster is not None:  # the lead's own forecast (learned lead)
            flags.append((self.policy, "forecaster", forecaster))
        saved = [(obj, k, getattr(obj, k)) for obj, k, _ in flags]
        for obj, k, v in flags:
            setattr(obj, k, v)
        try:
            decision = self.policy.decide(state)
        finally:
            for obj, k, v in saved:
                setattr(obj, k, v)
        return replace(decision, reason=f"{what}: {decision.reason}") \
            if decision.reason else decision

    def _window(self, state: Any) -> Any:
        """The served model's input: compute seconds and layer cost held per step."""
        from bubblecast.dataset.window import Window

        h = self.history
        return Window(compute=h.compute.copy(), cost=np.maximum(h.held(state.costs), 1e-12),
                      microbatches=int(h.microbatches[-1]))

    def _device(self) -> Any:
        """The ranks' device metrics in the window's numbering (row ``i``: history step
        ``i``), as the covariate model reads them."""
        steps = self.history.steps
        temps = np.full((len(steps), self.history.stages), np.nan)
        for i, s in enumerate(steps):
            row = self._temps.get(int(s))
            if row is not None:
                temps[i] = row
        return device_frame(temps, self._slowdown)

    def close(self) -> None:
        if self.external is not None:
            self.external.close()


def unavailable(step: int, observed: int | None, why: str, waited_s: float
                ) -> tuple[Decision, dict[str, Any]]:
    """The decision to keep the plan, and its record, when the decision after ``step``
    (telemetry through ``observed``) did not come (``why``: a time-out, say) after the caller
    waited ``waited_s``: the record :meth:`Decider.decide` would have written."""
    decision = Decision.keep(f"{why}; keeping the current plan")
    return decision, _record(decision, decision.reason, step, observed, waited_s, {})


def _record(decision: Decision, reason: str, step: int, observed: int | None, latency: float,
            facts: dict[str, Any]) -> dict[str, Any]:
    """A decision's record: the step it applies before (two after ``step``), the action, the
    reason, the policy's predicted numbers, the latency, and the decision's own facts."""
    return {"step": step + 2, "decided_after_step": step, "observed_through": observed,
            "action": action_to_json(decision.action), "reason": reason,
            "predicted_step_s": decision.predicted_step_s,
            "predicted_step_with_action_s": decision.predicted_step_with_action_s,
            "predicted_saving_s": decision.predicted_saving_s,
            "predicted_migration_s": decision.migration_s, "latency_s": latency, **facts}
