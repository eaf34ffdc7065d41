"""The closed loop: observe -> decide -> broadcast -> apply, one phase per step boundary.

Every ``every`` steps (the same steps on every rank) one round runs, spread over three steps so
that no rank ever waits for a collective to cross the wire, and rank 0's decision runs while a
step trains:

1. **observe** (:meth:`Controller.after_step` at the boundary): each rank's compute seconds
   per step since the last boundary and any new per-layer cost samples leave in one
   asynchronous ``all_gather`` of a small tensor (:mod:`.observe`) on a gloo group of the
   controller's own;
2. **decide** (:meth:`Controller.before_step` of the next step): rank 0 hands the gathered
   rows to its decider (:class:`.decide.Decider`), which adds them to the history and asks the
   policy while the step trains: in its worker process (:mod:`.decision_process`, the
   default: ``ControllerConfig.decide_in``) or on a thread of the training process
   (:mod:`.decision_thread`; always for the static policy, which computes nothing);
3. **broadcast** (that step's :meth:`~Controller.after_step`): rank 0 collects the recorded
   ``Decision`` (waiting only for what is not done, at most until the deadline; none in time:
   keep the plan, saying why) and the action leaves it as a small tensor, asynchronously
   (actions other than repartitions through ``broadcast_action``);
4. **apply** (one more step later): every rank applies it with ``Trainer.apply``.

Observations through step ``s`` thus act from step ``s + 3``. A caller that does not call
:meth:`~Controller.before_step` gets the same timing with the decision taken inside
:meth:`~Controller.after_step` (on the training thread's time). Rank 0 records every
decision; each rank counts the seconds its training thread spends in control. Imported inside
workers only (torch).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from bubblecast.policy.actions import Action, Repartition
from bubblecast.policy.decision import Decision
from bubblecast.runtime.control.control_config import ControllerConfig
from bubblecast.runtime.control.decide import Decider, DeciderFactory, Pending, unavailable
from bubblecast.runtime.control.decision_process import DecisionProcess
from bubblecast.runtime.control.decision_thread import DecisionThread, Ticket
from bubblecast.runtime.control.forecasters import ForecastUnavailable
from bubblecast.runtime.control.observe import StepProbe, pack
from bubblecast.runtime.sampler import SLOWDOWN_METRIC
from bubblecast.runtime.trainer import Trainer, broadcast_action

__all__ = ["Controller", "ControllerConfig"]
_NONE, _REPARTITION, _OTHER = 0, 1, 2  # broadcast codes


@dataclass
class _Gathering:
    """An observation in flight: the all_gather's handle and buffers, the steps it covers."""

    work: Any
    out: list[torch.Tensor]
    pending: Pending


@dataclass
class _Deciding:
    """A decision with rank 0's decider (``ticket`` None on the other ranks): the step
    it follows and the last step it observed."""

    ticket: Ticket | None
    step: int
    observed: int | None


@dataclass
class _Sending:
    """A decision in flight: the broadcast's handle and box, rank 0's action and record."""

    work: Any
    box: torch.Tensor
    action: Action | None
    record: dict[str, Any] | None


class Controller:
    """Closed-loop control of one :class:`Trainer` (construct on every rank; collective).

    Call :meth:`before_step` before and :meth:`after_step` after every ``train_step`` on every
    rank (``before_step`` is optional: see the module docstring). ``enabled = False`` (set
    identically on every rank) skips the boundaries, for overhead measurements.
    ``decider`` builds the external decider ``config.service`` asks (dependency injection).
    """

    def __init__(self, trainer: Trainer, config: ControllerConfig,
                 decider: DeciderFactory | None = None) -> None:
        self.trainer, self.config = trainer, config
        self.rank, self.world = trainer.rank, trainer.world
        self.layers = trainer.plan.layers
        self.probe = StepProbe(trainer.recorder)
        self.enabled = True
        self.decisions: list[dict[str, Any]] = []
        self.control_s = 0.0
        self.parts = {"gather_s": 0.0, "submit_s": 0.0, "decide_s": 0.0, "broadcast_s": 0.0}
        self.samples: dict[str, list[float]] = {k: [] for k in self.parts}
        self.boundaries = 0
        self._pending: Pending = []
        self._cost_seen = 0
        self._last_move: int | None = None
        self._gathering: _Gathering | None = None
        self._deciding: _Deciding | None = None
        self._sending: _Sending | None = None
        self._measured: list[dict[str, Any]] | None = None  # new migrations to learn from
        group = trainer.group
        ranks = None if group is None else dist.get_process_group_ranks(group)
        self._src = 0 if ranks is None else ranks[0]
        self.group = dist.new_group(ranks=ranks, backend="gloo")  # control traffic, CPU
        self.param_bytes = self._gather_param_bytes()
        self.decider: Decider | None = None  # rank 0, deciding on a thread
        self.thread: DecisionThread | None = None
        self.process: DecisionProcess | None = None  # rank 0, deciding in a worker process
        if self.rank == 0 and config.decide_in == "process" and config.policy != "static":
            self.process = DecisionProcess(config, trainer.plan, self.param_bytes, decider)
        elif self.rank == 0:
            self.decider = Decider(config, trainer.plan, self.param_bytes, decider)
            self.thread = DecisionThread(config.timeout_s)

    @property
    def note(self) -> str | None:
        """What rank 0 decides with (forecaster, service), for the summary."""
        if self.process is not None:
            return self.process.note
        return None if self.decider is None else self.decider.note

    # -- the loop ---------------------------------------------------------------------------
    def before_step(self) -> None:
        """Call before every step on every rank: start the decision on the telemetry gathered
        at the last boundary, so that it runs while this step trains (no collective)."""
        self._start(self.trainer.step)

    def _start(self, step: int) -> None:
        """Start the decision pending, if any, as the decision after ``step``."""
        if self._gathering is not None:
            gathering, self._gathering = self._gathering, None
            t0 = time.perf_counter()
            self._deciding = self.submit(gathering, step)
            self._spend("submit_s", t0)

    def after_step(self) -> dict[str, Any] | None:
        """Call after every step on every rank (collective). Returns the record of an action
        applied at this boundary (``Trainer.apply``), or None."""
        t = self.trainer
        self._pending.append((t.step - 1, t.plan.partition, t.plan.microbatches))
        del self._pending[:-self.config.every]
        applied = None
        if self._sending is not None:  # decided two steps ago: receive and apply it now
            sending, self._sending = self._sending, None
            t0 = time.perf_counter()
            action = self.receive(sending)
            self._spend("broadcast_s", t0)
            applied = self.apply(action, sending.record)
        self._start(t.step - 1)  # none pending if the caller called before_step
        if self._deciding is not None:  # started before this step: collect and broadcast
            deciding, self._deciding = self._deciding, None
            t0 = time.perf_counter()
            decision, record = self.collect(deciding)
            self._sending = self.broadcast(decision, record)
            self._spend("decide_s", t0)
        if t.step % self.config.every == 0:  # a boundary: observe
            if self.enabled:
                t0 = time.perf_counter()
                self._gathering = self.observe()
                self._spend("gather_s", t0)
            else:
                self.probe.take(0)
        return applied

    def observe(self) -> _Gathering:
        """Start gathering every rank's compute per step and new layer-cost samples."""
        costs = self.trainer.recorder.layer_costs
        samples, self._cost_seen = costs[self._cost_seen:], len(costs)
        metrics = self.trainer.recorder.metrics  # the device's: the leading signal
        temps = metrics.asof("temperature_c", [s for s, _, _ in self._pending])
        mine = torch.from_numpy(pack(self.probe.take(self.config.every), self.config.every,
                                     samples, self.layers, temps,
                                     metrics.latest(SLOWDOWN_METRIC)))
        out = [torch.empty_like(mine) for _ in range(self.world)]
        work = dist.all_gather(out, mine, group=self.group, async_op=True)
        self.boundaries += 1
        return _Gathering(work, out, list(self._pending))

    def submit(self, gathering: _Gathering, step: int) -> _Deciding:
        """Wait for the gathered rows; rank 0 hands observe-then-decide to its decider (its
        process or thread), as the decision after ``step`` (collected after it), under the
        plan in force."""
        gathering.work.wait()
        t = self.trainer
        observed = gathering.pending[-1][0] if gathering.pending else None
        if self.rank != 0:
            return _Deciding(None, step, observed)
        rows = torch.stack(gathering.out).numpy()
        measured, self._measured = self._measured, None
        args = (rows, gathering.pending, t.plan, step, self._last_move, measured)
        if self.process is not None:
            return _Deciding(self.process.submit(*args), step, observed)
        assert self.thread is not None and self.decider is not None
        decider = self.decider
        ticket = self.thread.submit(
            lambda ticket, *a: decider.advance(*a, skip=lambda: ticket.abandoned), *args)
        return _Deciding(ticket, step, observed)

    def collect(self, deciding: _Deciding) -> tuple[Decision | None, dict[str, Any] | None]:
        """Rank 0: the decision and its record, or a decision to keep the plan saying why it
        did not come in time (None on the other ranks)."""
        runner = self.process or self.thread
        if deciding.ticket is None or runner is None:
            return None, None
        t0 = time.perf_counter()
        try:
            return runner.result(deciding.ticket)
        except Exception as exc:  # noqa: BLE001 - never stop training over a decision
            why = str(exc) if isinstance(exc, ForecastUnavailable) else \
                f"decision failed ({type(exc).__name__}: {exc})"
            return unavailable(deciding.step, deciding.observed, why,
                               time.perf_counter() - t0)

    def broadcast(self, decision: Decision | None, record: dict[str, Any] | None) -> _Sending:
        """Start sending rank 0's action: ``[code, n, partition...]`` (code 0 none, 1
        repartition, 2 another action, which follows through ``broadcast_action``)."""
        action = decision.action if decision is not None and decision.acts else None
        box = torch.zeros(2 + self.layers, dtype=torch.int64)
        if isinstance(action, Repartition) and len(action.partition) <= self.layers:
            box[0], box[1] = _REPARTITION, len(action.partition)
            box[2:2 + len(action.partition)] = torch.as_tensor(action.partition)
        elif action is not None:
            box[0] = _OTHER
        work = dist.broadcast(box, src=self._src, group=self.group, async_op=True)
        return _Sending(work, box, action, record)

    def receive(self, sending: _Sending) -> Action | None:
        """Every rank: rank 0's action (None: keep the plan)."""
        sending.work.wait()
        code, n = int(sending.box[0]), int(sending.box[1])
        if code == _REPARTITION:
            return Repartition(tuple(int(x) for x in sending.box[2:2 + n].tolist()))
        if code == _OTHER:
            return broadcast_action(sending.action if self.rank == 0 else None,
                                    group=self.group)
        return None

    def apply(self, action: Action | None, record: dict[str, Any] | None
              ) -> dict[str, Any] | None:
        """Every rank: apply ``action`` now; rank 0 records the outcome with its decision."""
        t = self.trainer
        result = t.apply(action) if action is not None else None
        if result is not None and result["ok"] and result["from"] != result["to"]:
            self._last_move = t.step
        if record is not None:
            record["applied"] = None if result is None else {
                k: result.get(k) for k in ("ok", "seconds", "bytes", "layers_moved", "from",
                                           "to", "error")}
            self.decisions.append(record)
            if result is not None and result["ok"] and result["bytes"] and self.rank == 0:
                self._measured = list(t.actions)  # the decider learns from them
        return result

    def finish(self) -> None:
        """Collective, after the last step: complete the collectives in flight; a decision
        not yet applied is recorded as such (the run ended)."""
        if self._gathering is not None:
            self._gathering.work.wait()
            self._gathering = None
        sending, self._sending = self._sending, None
        if sending is not None:
            sending.work.wait()
            code = int(sending.box[0])
            if code == _OTHER:
                broadcast_action(sending.action if self.rank == 0 else None, group=self.group)
            if sending.record is not None:
                sending.record["applied"] = {"ok": False, "error": "the run ended first"} \
                    if code else None
                self.decisions.append(sending.record)
        deciding, self._deciding = self._deciding, None
        if deciding is not None:  # started, never broadcast: nobody applies it
            decision, record = self.collect(deciding)
            if record is not None:
                record["applied"] = {"ok": False, "error": "the run ended first"} \
                    if decision is not None and decision.acts else None
                self.decisions.append(record)

    # -- bookkeeping ------------------------------------------------------------------------
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

    def _spend(self, key: str, t0: float) -> None:
        dt = time.perf_counter() - t0
        self.parts[key] += dt
        self.samples[key].append(dt)
        self.control_s += dt

    def gather_stats(self) -> list[dict[str, float]]:
        """Collective: each rank's control seconds on its training thread (total and per phase:
        ``gather_s`` starting the gather, ``submit_s`` handing its rows to the decision
        thread, ``decide_s`` waiting for the decision, ``broadcast_s`` receiving the action),
        boundaries, and the median seconds of each phase (robust to the odd descheduled
        call). The decision thread's own time is in each decision's ``latency_s``."""
        medians = {f"median_{k}": float(np.median(v)) if v else 0.0
                   for k, v in self.samples.items()}
        boxes: list[Any] = [None] * self.world
        dist.all_gather_object(boxes, {"rank": self.rank, "control_s": self.control_s,
                                       "boundaries": self.boundaries, **self.parts, **medians},
                               group=self.group)
        return boxes

    def close(self) -> None:
        """Stop the decision process, or let the decision thread exit and close the external
        decider, if any."""
        if self.process is not None:
            self.process.close()
        if self.thread is not None:
            self.thread.close()
        if self.decider is not None:
            self.decider.close()
