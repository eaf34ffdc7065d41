"""The closed loop: telemetry -> forecast -> policy -> action, applied at a step boundary.

Every ``every`` steps (the same steps on every rank) :meth:`Controller.after_step`:

1. gathers each rank's compute seconds per step since the last boundary and any new per-layer
   cost samples with one ``all_gather`` of a small tensor (:mod:`.control_telemetry`);
2. on rank 0 builds the policy's :class:`~bubblecast.policy.policies.PolicyState` (speed
   history, partition, per-layer costs, schedule, micro-batches, migration cost) and asks the
   policy; the predictive one asks its forecaster (in process, under a deadline) or the
   prediction service (:mod:`.control_forecast`). A forecaster that is slow, down or raises
   yields a ``NoOp`` saying so: training goes on under the current plan;
3. broadcasts the action (``broadcast_action``) and every rank applies it with
   ``Trainer.apply`` before the next step.

Rank 0 records every decision (step, action JSON, reason, predicted step times and saving,
decision latency, control seconds); each rank counts the seconds it spends in control.
Imported inside workers only (torch).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from bubblecast.policy.actions import Action, NoOp, Repartition, action_to_json
from bubblecast.policy.cost import MigrationCost, run_constants
from bubblecast.runtime.control_config import ControllerConfig, make_policy
from bubblecast.runtime.control_forecast import (
    CachingForecaster,
    DeadlineRunner,
    ForecastUnavailable,
    ModelSpeedForecaster,
    ServiceDecider,
    load_forecaster,
)
from bubblecast.runtime.control_telemetry import History, StepProbe, pack, unpack
from bubblecast.runtime.trainer import Trainer, broadcast_action

__all__ = ["Controller", "ControllerConfig"]

class Controller:
    """Closed-loop control of one :class:`Trainer` (construct on every rank; collective).

    Call :meth:`after_step` after every ``train_step`` on every rank. ``enabled = False``
    (set identically on every rank) skips the boundaries, for overhead measurements.
    """

    def __init__(self, trainer: Trainer, config: ControllerConfig) -> None:
        self.trainer, self.config = trainer, config
        self.rank, self.world = trainer.rank, trainer.world
        self.layers = trainer.plan.layers
        self.probe = StepProbe(trainer.recorder)
        self.enabled = True
        self.decisions: list[dict[str, Any]] = []
        self.control_s = 0.0
        self.boundaries = 0
        self.note: str | None = None
        self._pending: list[tuple[int, tuple[int, ...], int]] = []
        self._cost_seen = 0
        self._last_move: int | None = None
        self.param_bytes = self._gather_param_bytes()
        if self.rank == 0:
            self._setup()

    # -- set-up (rank 0) ------------------------------------------------------------------
    def _gather_param_bytes(self) -> np.ndarray:
        mine = {i: sum(p.numel() * p.element_size() for p in layer.parameters())
                for i, layer in self.trainer.layers.items()}
        boxes: list[Any] = [None] * self.world
        dist.all_gather_object(boxes, mine, group=self.trainer.group)
        out = np.zeros(self.layers)
        for part in boxes:
            for i, b in part.items():
                out[int(i)] = float(b)
        return out

    def _setup(self) -> None:
        c, plan = self.config, self.trainer.plan
        self.history = History(plan.stages, self.layers, limit=c.history,
                               cost_samples=c.cost_samples,
                               measured_costs=c.layer_costs == "measured",
                               split_backward=plan.info.split_backward)
        self.constants = c.constants
        self.runner = DeadlineRunner(c.timeout_s)
        self.service: ServiceDecider | None = None
        self.forecaster: CachingForecaster | None = None
        self.broken: str | None = None
        if c.policy == "predictive" and c.service is not None:
            params = {k: v for k, v in c.policy_params.items()
                      if k in ("horizon", "risk", "margin", "min_gain", "hold", "min_history")}
            policy = make_policy(c)
            params = {k: getattr(policy, k) for k in ("horizon", "risk", "margin", "min_gain",
                                                      "hold", "min_history")} | params
            self.service = ServiceDecider(c.service, c.timeout_s, params)
            self.note = f"service {c.service} (/v1/recommend)"
            self.policy = policy
            return
        if c.policy == "predictive":
            try:
                inner, self.note = load_forecaster(c.model, c.forecaster)
            except Exception as exc:  # noqa: BLE001 - fail open: decisions become NoOps
                self.broken = f"forecaster unavailable ({type(exc).__name__}: {exc})"
                inner, self.note = None, self.broken
            self.forecaster = CachingForecaster(inner) if inner is not None else None
            self.policy = make_policy(c, self.forecaster)
            return
        self.policy = make_policy(c)

    # -- the loop -------------------------------------------------------------------------
    def after_step(self) -> dict[str, Any] | None:
        """Bookkeeping after a step; at a boundary, decide and apply (collective). Returns
        the applied action's record (``Trainer.apply``) or None."""
        t = self.trainer
        self._pending.append((t.step - 1, t.plan.partition, t.plan.microbatches))
        del self._pending[:-self.config.every]
        if t.step % self.config.every:
            return None
        if not self.enabled:
            self.probe.take(0)
            return None
        t0 = time.perf_counter()
        rows = self._gather()
        action, record = (self._decide(rows) if self.rank == 0 else (None, None))
        action = broadcast_action(action, group=t.group)
        spent = time.perf_counter() - t0
        self.control_s += spent
        self.boundaries += 1
        result = None
        if action is not None:
            result = t.apply(action)
            if result["ok"] and result["from"] != result["to"]:
                self._last_move = t.step
        if record is not None:
            record["control_s"] = spent
            record["applied"] = None if result is None else {
                k: result.get(k) for k in ("ok", "seconds", "bytes", "layers_moved", "from",
                                           "to", "error")}
            self.decisions.append(record)
            if result is not None and result["ok"] and result["bytes"]:
                measured = run_constants({"actions": t.actions}, self.config.constants)
                self.constants = measured or self.constants
        return result

    def _gather(self) -> np.ndarray:
        t = self.trainer
        samples = t.recorder.layer_costs[self._cost_seen:]
        self._cost_seen = len(t.recorder.layer_costs)
        local = pack(self.probe.take(self.config.every), self.config.every, samples,
                     self.layers)
        mine = torch.as_tensor(local, dtype=torch.float64, device=t.device)
        out = [torch.empty_like(mine) for _ in range(self.world)]
        dist.all_gather(out, mine, group=t.group)
        return torch.stack(out).cpu().numpy()

    # -- decisions (rank 0) -----------------------------------------------------------------
    def _decide(self, rows: np.ndarray) -> tuple[Action | None, dict[str, Any]]:
        compute, fwd, tot = unpack(rows, self.config.every, self.layers)
        n = compute.shape[0]
        pend = self._pending[-n:] if n else []
        self.history.add([s for s, _, _ in pend], compute, [p for _, p, _ in pend],
                         [m for _, _, m in pend])
        self.history.add_samples(fwd, tot)
        current = tuple(self.trainer.plan.partition)
        t0 = time.perf_counter()
        facts: dict[str, Any] = {}
        try:
            action, facts = self._ask(current)
        except ForecastUnavailable as exc:
            action = NoOp(reason=f"{exc}; keeping the current plan")
        except Exception as exc:  # noqa: BLE001 - never stop training over a decision
            action = NoOp(reason=f"decision failed ({type(exc).__name__}: {exc}); keeping the "
                                 "current plan")
        latency = time.perf_counter() - t0
        if isinstance(action, Repartition) and tuple(action.partition) == current:
            action = NoOp(reason="the policy keeps the current partition")
        if not isinstance(action, NoOp):
            facts.setdefault("reason", f"{self.config.policy}: {list(current)} -> "
                                       f"{_target(action)}")
        else:
            facts = {}
        record = {"step": self.trainer.step, "action": action_to_json(action),
                  "reason": facts.pop("reason", None) or getattr(action, "reason", ""),
                  "predicted_step_s": None, "predicted_step_with_action_s": None,
                  "predicted_saving_s": None, "predicted_migration_s": None,
                  "latency_s": latency, **facts}
        if record["predicted_step_s"] is not None and \
                record["predicted_step_with_action_s"] is not None:
            record["predicted_saving_s"] = (record["predicted_step_s"]
                                            - record["predicted_step_with_action_s"])
        return (None if isinstance(action, NoOp) else action), record

    def state(self, current: tuple[int, ...]) -> Any:
        """The policy's state now (rank 0)."""
        from bubblecast.policy.pipeline import Pipeline
        from bubblecast.policy.policies import PolicyState

        h, plan = self.history, self.trainer.plan
        costs = h.costs()
        speeds = h.speeds(costs)
        t = len(h) - 1
        last = None
        if self._last_move is not None:
            last = t - (int(h.steps[-1]) - (self._last_move - 1))
        pipe = Pipeline(plan.schedule, plan.stages, plan.microbatches, plan.chunks, 0.0)
        return PolicyState(t=t, history=speeds, partition=current, costs=costs, pipeline=pipe,
                           migration=MigrationCost(self.param_bytes, self.constants),
                           last_action=last)

    def _ask(self, current: tuple[int, ...]) -> tuple[Action, dict[str, Any]]:
        if len(self.history) == 0:
            return NoOp(reason="no telemetry yet"), {}
        if self.broken is not None:
            raise ForecastUnavailable(self.broken)
        state = self.state(current)
        if self.service is not None:
            return self.runner(self.service.decide, self._service_body(state))
        if self.forecaster is None:  # static, reactive
            action = self.policy.decide(state)
            window = getattr(self.policy, "window", 10)
            speed = state.history[-window:].mean(axis=0)
            return action, self._predicted(state, action, speed)
        inner = self.forecaster.inner
        if isinstance(inner, ModelSpeedForecaster):
            inner.window = self._window(state)
        self.forecaster.last = None
        action = self.runner(self.policy.decide, state)
        return action, self._predicted(state, action, self._plan_speed())

    def _window(self, state: Any) -> Any:
        from bubblecast.serve.model import Window

        h = self.history
        return Window(compute=h.compute.copy(), cost=np.maximum(h.held(state.costs), 1e-12),
                      microbatches=int(h.microbatches[-1]))

    def _service_body(self, state: Any) -> dict[str, Any]:
        h, plan = self.history, self.trainer.plan
        c = state.migration.constants
        since = None if state.last_action is None else max(state.t - state.last_action, 0)
        return self.service.request(  # type: ignore[union-attr]
            stages=plan.stages, schedule=plan.schedule, microbatches=plan.microbatches,
            chunks=plan.chunks, compute=h.compute, held=h.held(state.costs),
            partition=state.partition, costs=state.costs, param_bytes=self.param_bytes,
            migration={"bandwidth_bytes_per_s": c.bandwidth_Bps, "pause_s": c.fixed_pause_s,
                       "optimizer_factor": c.optimizer_factor},
            steps_since_action=since)

    def _plan_speed(self) -> np.ndarray | None:
        """The predictive policy's planning speed per rank from its last forecast."""
        if self.forecaster is None or self.forecaster.last is None:
            return None
        hz, q = self.forecaster.last
        risk = float(getattr(self.policy, "risk", 0.3))
        plan = (1.0 - risk) * q[:, :, 1] + risk * q[:, :, 2]
        weight = np.diff(np.r_[0, np.asarray(hz, dtype=np.float64)])
        return (plan * weight[:, None]).sum(axis=0) / weight.sum()

    @staticmethod
    def _predicted(state: Any, action: Action, speed: np.ndarray | None) -> dict[str, Any]:
        if not isinstance(action, Repartition) or speed is None:
            return {}
        from bubblecast.policy.pipeline import predicted_step

        cur, new = tuple(state.partition), tuple(action.partition)
        step, _ = predicted_step(state.pipeline, [cur, new], state.costs, speed[None, :])
        return {"predicted_step_s": float(step[0, 0]),
                "predicted_step_with_action_s": float(step[1, 0]),
                "predicted_migration_s": float(state.migration.seconds(cur, new))}

    # -- results ---------------------------------------------------------------------------
    def gather_stats(self) -> list[dict[str, float]]:
        """Collective: each rank's control seconds and boundaries."""
        boxes: list[Any] = [None] * self.world
        dist.all_gather_object(boxes, {"rank": self.rank, "control_s": self.control_s,
                                       "boundaries": self.boundaries},
                               group=self.trainer.group)
        return boxes

    def close(self) -> None:
        if self.rank == 0 and getattr(self, "service", None) is not None:
            self.service.close()  # type: ignore[union-attr]


def _target(action: Action) -> Any:
    return list(action.partition) if isinstance(action, Repartition) else action_to_json(action)
