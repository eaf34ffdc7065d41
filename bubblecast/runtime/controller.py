"""The closed loop: telemetry -> forecast -> policy -> action, applied at a step boundary.

Every ``every`` steps (the same steps on every rank) :meth:`Controller.after_step`:

1. gathers each rank's compute seconds per step since the last boundary and any new per-layer
   cost samples with one asynchronous ``all_gather`` of a small tensor
   (:mod:`.control_telemetry`) on a gloo group of its own;
2. after the next step, rank 0 builds the policy's state (speed history through a causal
   running median, :mod:`.control_observe`; partition, per-layer
   costs, schedule, micro-batches, migration cost) and asks the policy; the predictive one
   asks its forecaster (in process, under a deadline) or the prediction service
   (:mod:`.control_forecast`). A forecaster that is slow, down or raises yields a ``NoOp``
   saying so: training goes on under the current plan;
3. broadcasts the action (a small tensor, asynchronously; actions other than repartitions
   through ``broadcast_action``) and after one more step every rank applies it with
   ``Trainer.apply``: observations through step ``s`` act from step ``s + 3``, and no rank
   ever waits for a collective to cross the wire.

Rank 0 records every decision (the step it applies before, action JSON, reason, predicted
step times and saving, decision latency); each rank counts the seconds it spends in control.
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
from bubblecast.runtime.control_observe import (
    RawHistoryForecaster,
    robust_speeds,
    since_last_move,
    window_speed,
)
from bubblecast.runtime.control_telemetry import History, StepProbe, pack, unpack
from bubblecast.runtime.trainer import Trainer, broadcast_action

__all__ = ["Controller", "ControllerConfig"]
_SERVICE_PARAMS = ("horizon", "risk", "margin", "min_gain", "hold", "min_history")


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
        self.parts = {"gather_s": 0.0, "decide_s": 0.0, "broadcast_s": 0.0}
        self.samples: dict[str, list[float]] = {k: [] for k in self.parts}
        self.boundaries = 0
        self.note: str | None = None
        self._pending: list[tuple[int, tuple[int, ...], int]] = []
        self._cost_seen = 0
        self._last_move: int | None = None
        self._gath: tuple | None = None
        self._bcast: tuple | None = None
        group = trainer.group
        ranks = None if group is None else dist.get_process_group_ranks(group)
        self._src = 0 if ranks is None else ranks[0]
        self.group = dist.new_group(ranks=ranks, backend="gloo")  # control traffic, CPU
        self.param_bytes = self._gather_param_bytes()
        if self.rank == 0:
            self._setup()

    # -- set-up (rank 0) ------------------------------------------------------------------
    def _gather_param_bytes(self) -> np.ndarray:
        mine = {i: sum(p.numel() * p.element_size() for p in layer.parameters())
                for i, layer in self.trainer.layers.items()}
        boxes: list[Any] = [None] * self.world
        dist.all_gather_object(boxes, mine, group=self.group)
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
        self._raw: np.ndarray | None = None
        if c.policy == "predictive" and c.service is not None:
            policy = make_policy(c)  # the service runs it: send its knobs
            params = {k: getattr(policy, k) for k in _SERVICE_PARAMS}
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
        """Call after every step on every rank (collective). Returns the record of an action
        applied at this boundary (``Trainer.apply``), or None.

        Three phases, each one step after the previous, so that no rank ever waits for a
        collective to cross the wire: at a boundary (``step % every == 0``) start gathering
        the telemetry; at the next step rank 0 decides and starts broadcasting the action;
        at the step after, every rank applies it. Control traffic uses its own gloo group.
        """
        t = self.trainer
        self._pending.append((t.step - 1, t.plan.partition, t.plan.microbatches))
        del self._pending[:-self.config.every]
        result = None
        if self._bcast is not None:
            result = self._apply_broadcast()
        if self._gath is not None:
            self._decide_and_send()
        if t.step % self.config.every == 0:
            if self.enabled:
                self._start_gather()
            else:
                self.probe.take(0)
        return result

    def _start_gather(self) -> None:
        t0 = time.perf_counter()
        t = self.trainer
        samples = t.recorder.layer_costs[self._cost_seen:]
        self._cost_seen = len(t.recorder.layer_costs)
        local = pack(self.probe.take(self.config.every), self.config.every, samples,
                     self.layers)
        mine = torch.from_numpy(local)
        out = [torch.empty_like(mine) for _ in range(self.world)]
        work = dist.all_gather(out, mine, group=self.group, async_op=True)
        self._gath = (work, out, list(self._pending))
        self.boundaries += 1
        self._spend("gather_s", t0)

    def _decide_and_send(self) -> None:
        work, out, pending = self._gath  # type: ignore[misc]
        self._gath = None
        t0 = time.perf_counter()
        work.wait()
        action, record = None, None
        if self.rank == 0:
            action, record = self._decide(torch.stack(out).numpy(), pending)
        box = torch.zeros(2 + self.layers, dtype=torch.int64)
        if action is not None:
            if isinstance(action, Repartition) and len(action.partition) <= self.layers:
                box[0], box[1] = 1, len(action.partition)
                box[2:2 + len(action.partition)] = torch.as_tensor(action.partition)
            else:
                box[0] = 2
        send = dist.broadcast(box, src=self._src, group=self.group, async_op=True)
        self._bcast = (send, box, action, record)
        self._spend("decide_s", t0)

    def _apply_broadcast(self) -> dict[str, Any] | None:
        """Rank 0's action on every rank (``[code, n, partition...]``: 0 none, 1 repartition,
        2 another action, which follows through ``broadcast_action``), applied now."""
        send, box, action, record = self._bcast  # type: ignore[misc]
        self._bcast = None
        t0 = time.perf_counter()
        send.wait()
        code, n = int(box[0]), int(box[1])
        if code == 1:
            action = Repartition(tuple(int(x) for x in box[2:2 + n].tolist()))
        elif code == 2:
            action = broadcast_action(action if self.rank == 0 else None, group=self.group)
        self._spend("broadcast_s", t0)
        t = self.trainer
        result = t.apply(action) if code else None
        if result is not None and result["ok"] and result["from"] != result["to"]:
            self._last_move = t.step
        if record is not None:
            record["applied"] = None if result is None else {
                k: result.get(k) for k in ("ok", "seconds", "bytes", "layers_moved", "from",
                                           "to", "error")}
            self.decisions.append(record)
            if result is not None and result["ok"] and result["bytes"]:
                measured = run_constants({"actions": t.actions}, self.config.constants)
                self.constants = measured or self.constants
        return result

    def finish(self) -> None:
        """Collective, after the last step: complete the collectives in flight; a decision
        not yet applied is recorded as such (the run ended)."""
        if self._gath is not None:
            self._gath[0].wait()
            self._gath = None
        if self._bcast is not None:
            send, box, action, record = self._bcast
            self._bcast = None
            send.wait()
            if int(box[0]) == 2:
                broadcast_action(action if self.rank == 0 else None, group=self.group)
            if record is not None:
                record["applied"] = {"ok": False, "error": "the run ended first"} \
                    if int(box[0]) else None
                self.decisions.append(record)

    def _spend(self, key: str, t0: float) -> None:
        dt = time.perf_counter() - t0
        self.parts[key] += dt
        self.samples[key].append(dt)
        self.control_s += dt

    # -- decisions (rank 0) -----------------------------------------------------------------
    def _decide(self, rows: np.ndarray, pending: list[tuple[int, tuple[int, ...], int]]
                ) -> tuple[Action | None, dict[str, Any]]:
        compute, fwd, tot = unpack(rows, self.config.every, self.layers)
        n = compute.shape[0]
        pend = pending[-n:] if n else []
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
            facts = {k: v for k, v in facts.items() if k.startswith("speed_")}
        record = {"step": self.trainer.step + 1, "decided_after_step": self.trainer.step - 1,
                  "observed_through": int(self.history.steps[-1]) if len(self.history) else None,
                  "action": action_to_json(action),
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
        self._raw = h.speeds(costs)
        speeds = robust_speeds(self._raw, self.config.smooth)  # control_observe
        t = len(h) - 1
        last = None
        if self._last_move is not None:
            last = t - (int(h.steps[-1]) - (self._last_move - 1))
        pipe = Pipeline(plan.schedule, plan.stages, plan.microbatches, plan.chunks, 0.0)
        return PolicyState(t=t, history=speeds, partition=current, costs=costs, pipeline=pipe,
                           migration=MigrationCost(self.param_bytes, self.constants),
                           last_action=last)

    def _ask(self, current: tuple[int, ...]) -> tuple[Action, dict[str, Any]]:
        if self.config.policy == "static":  # never looks at the state
            return self.policy.decide(None), {}
        if len(self.history) == 0:
            return NoOp(reason="no telemetry yet"), {}
        if self.broken is not None:
            raise ForecastUnavailable(self.broken)
        state = self.state(current)
        if self.service is not None:
            return self.runner(self.service.decide, self._service_body(state))
        if self.forecaster is None:  # reactive
            action = self.policy.decide(state)
            speed = window_speed(state.history, getattr(self.policy, "window", 10))
            return action, self._predicted(state, action, speed) | self._speeds(state)
        inner = self.forecaster.inner
        if isinstance(inner, ModelSpeedForecaster):
            inner.window = self._window(state)
        self.forecaster.last = None
        if isinstance(inner, RawHistoryForecaster):  # built-in, in-process numpy: no thread
            inner.history = since_last_move(self._raw, self.history.partitions)
            action = self.policy.decide(state)
        else:
            action = self.runner(self.policy.decide, state)
        plan = self._plan_speed()
        facts = self._speeds(state)
        if plan is not None:
            facts["speed_plan"] = [round(float(x), 4) for x in plan]
        return action, self._predicted(state, action, plan) | facts

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
    def _speeds(state: Any, window: int = 10) -> dict[str, Any]:
        """Median per rank of the (median-smoothed) speeds of the last ``window`` steps,
        recorded with each decision."""
        recent = window_speed(state.history, window)
        return {"speed_recent": [round(float(x), 4) for x in recent]}

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
        """Collective: each rank's control seconds (total and per phase), boundaries, and the
        median seconds of each phase (robust to the odd descheduled call)."""
        medians = {f"median_{k}": float(np.median(v)) if v else 0.0
                   for k, v in self.samples.items()}
        boxes: list[Any] = [None] * self.world
        dist.all_gather_object(boxes, {"rank": self.rank, "control_s": self.control_s,
                                       "boundaries": self.boundaries, **self.parts, **medians},
                               group=self.group)
        return boxes

    def close(self) -> None:
        if self.rank == 0 and getattr(self, "service", None) is not None:
            self.service.close()  # type: ignore[union-attr]


def _target(action: Action) -> Any:
    return list(action.partition) if isinstance(action, Repartition) else action_to_json(action)
