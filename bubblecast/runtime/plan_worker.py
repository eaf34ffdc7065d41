"""The live planner's worker process: plans each step's documents off the training process.

:class:`PlanWorker` holds what planning needs (the method, the data loader, the planner's
config, the cost, each stage's layers) and turns ``(step, speed history)`` into that step's
plan and its decision record. :class:`PlanProcess` runs one in a child process (the
``spawn`` start method: nothing of the training process's threads or process groups is
inherited) and exchanges requests and plans with it over a pipe, as a data loader's worker
process does. The worker keeps the speed history itself (each request carries only the newest
ratios: :meth:`PlanWorker.answer`) and checks its own plan (:func:`plan_problem`), so that the
training process's share of a step's plan is a small message each way. It runs at the lowest
CPU priority (``nice``): where cores are scarce it plans in the pipeline's idle time rather
than taking a core from a training rank.

Why a process and not a thread: a thread of the training process shares its interpreter lock.
Planning is many small numpy calls, each taking the lock for a moment, and the training
thread's Python between its kernels waits for it: a planning thread slows the training
steps by more than its own CPU time, a process does not (measured on the results page,
"Work balancing, live"). The training process only pickles a small request and reads a plan.

Fail open: the worker's own failure (an exception) comes back as ``(None, why, record)``; a
worker that is gone (killed, crashed, exited) is reported by :meth:`PlanProcess.result` as the
reason, at once, for every later step. The caller (:class:`~.live_plan.LivePlanner`) then
runs the data loader's order and records why.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from bubblecast.policy.work_plan import TOKENS, PlanConfig, WorkPlan, plan_batch, plan_static
from bubblecast.policy.work_policies import plan_action
from bubblecast.policy.work_timing import predicted_plan_step
from bubblecast.runtime.child_process import (
    WORKER_NICE,
    exit_reason,
    lower_priority,
    start_child,
    stop_child,
)

#: One step's outcome: the plan (None on a failure), why it failed, the decision record.
Planned = tuple[WorkPlan | None, str | None, dict[str, Any]]
#: Steps of speed history the forecaster sees.
HISTORY = 64


def plan_problem(plan: WorkPlan, lengths: np.ndarray, config: PlanConfig) -> str | None:
    """Why ``plan`` cannot run this step (None when it can): every document exactly once,
    every micro-batch within the budget, every replica a count its schedule runs."""
    if len(plan.microbatches) != config.replicas:
        return f"{len(plan.microbatches)} replicas planned, the job runs {config.replicas}"
    for r, mbs in enumerate(plan.microbatches):
        if not mbs or not config.counts_ok(len(mbs)):
            return f"replica {r}: {len(mbs)} micro-batches, which its schedule cannot run"
        for j, mb in enumerate(mbs):
            if int(np.sum(lengths[list(mb)])) > config.token_budget:
                return f"replica {r} micro-batch {j}: over the token budget"
    flat = sorted(int(i) for rep in plan.microbatches for mb in rep for i in mb)
    if flat != list(range(len(lengths))):
        return "the plan does not place every document of the step exactly once"
    return None


def canonical(plan: WorkPlan) -> WorkPlan:
    """``plan`` with each micro-batch's documents in index order (what the exchange gives
    back; the order within a micro-batch changes nothing but the padding layout)."""
    mbs = tuple(tuple(tuple(sorted(int(i) for i in mb)) for mb in rep)
                for rep in plan.microbatches)
    return replace(plan, microbatches=mbs)


@dataclass
class PlanWorker:
    """Plans one step from the speed history (picklable: it crosses into the worker process).

    ``method``: ``tokens``, ``balance`` or ``loader`` (the data loader's own order through the
    same machinery); ``loader``: the run's :class:`~.document_loader.DocumentLoader` (each
    step's documents); ``config``: the planner's :class:`PlanConfig`; ``work``: the per-layer
    cost (token counts, or the learned cost model's); ``problem``: why the cost model is not
    used (then ``balance`` plans on token counts and says so); ``layers``: each stage's layer
    count (a rank's speed ratio is per layer); ``history``: the speed ratios seen so far, one
    ``(replicas, stages)`` array per step (:meth:`answer` keeps the last :data:`HISTORY`)."""

    method: str
    loader: Any
    config: PlanConfig
    work: Any = TOKENS
    problem: str | None = None
    layers: np.ndarray = field(default_factory=lambda: np.ones(1))
    history: list[np.ndarray] = field(default_factory=list, repr=False)

    @property
    def uses_speeds(self) -> bool:
        """Whether plans follow the ranks' speeds (``balance`` with its cost model)."""
        return self.method == "balance" and not self.problem

    def answer(self, step: int, newest: np.ndarray | None) -> Planned:
        """What the worker process sends back for step ``step``: ``newest`` (the ranks'
        latest speed ratios, None when none arrived) joins the history when plans follow the
        speeds, then the step is planned (:meth:`__call__`) and checked; a plan that cannot
        run (:func:`plan_problem`) comes back as None and the reason."""
        if newest is not None and self.uses_speeds:
            self.history.append(np.asarray(newest, dtype=np.float64))
            del self.history[:-HISTORY]
        plan, why, record = self(step, self.history if self.uses_speeds else None)
        if plan is not None:
            why = plan_problem(plan, self.loader.lengths(step), self.config)
            plan = None if why is not None else plan
        return plan, why, record

    def __call__(self, step: int, history: list[np.ndarray] | None) -> Planned:
        """Step ``step``'s plan (canonical), None and the reason when planning raised, and
        the decision record with the planning latency."""
        t0 = time.perf_counter()
        try:
            plan, record = self.plan_step(step, self.speeds(history), bool(history))
            ordered = canonical(plan)  # the planner's plans already are; a subclass's may not
            if ordered.microbatches != plan.microbatches:
                from bubblecast.policy.actions import action_to_json

                record["action"] = action_to_json(plan_action(ordered))
            plan, why = ordered, None
        except Exception as exc:  # noqa: BLE001 - fail open: the loader's order
            plan, record = None, {}
            why = f"the planner failed ({type(exc).__name__}: {' '.join(str(exc).split())})"
        record["latency_s"] = time.perf_counter() - t0
        return plan, why, record

    def speeds(self, history: list[np.ndarray] | None) -> np.ndarray:
        """Per rank, the forecast speed ratio one step ahead times its layers (ones x layers
        before any telemetry, ones for methods that plan without speeds)."""
        c = self.config
        if history is None:
            return np.ones((c.replicas, c.stages))
        if not history:
            return np.ones((c.replicas, c.stages)) * self.layers
        from bubblecast.policy.forecasting import TrendForecaster

        hist = np.stack(history)  # (t, R, P)
        flat = hist.reshape(len(hist), -1)
        ahead = TrendForecaster().forecast_history(flat, np.array([1]))[0, :, 1]
        return np.maximum(ahead.reshape(hist.shape[1:]), 1e-9) * self.layers

    def plan_step(self, step: int, speeds: np.ndarray, seen: bool
                  ) -> tuple[WorkPlan, dict[str, Any]]:
        """Step ``step``'s plan and its decision record; ``seen``: the speeds come from
        telemetry (not the equal speeds of the first steps)."""
        from bubblecast.policy.decision import Decision

        x = self.loader.lengths(step)
        c = self.config
        if self.method == "loader":
            plan = plan_static(x, c)
            return plan, Decision(plan_action(plan), None, None, 0.0,
                                  "the data loader's order").to_json()
        if self.method == "tokens" or self.problem:
            plan = plan_batch(x, c, TOKENS, None, method="tokens")
            top = max((int(x[list(mb)].sum()) for rep in plan.microbatches for mb in rep),
                      default=0)
            why = self.problem or "token balancing"
            decision = Decision(plan_action(plan), None, None, 0.0,
                                f"{why}: largest micro-batch {top:.0f} tokens")
            return plan, decision.to_json()
        plan = plan_batch(x, c, self.work, speeds, method="balance")
        if not seen:
            decision = Decision(plan_action(plan), None, None, 0.0,
                                f"no telemetry yet: equal speeds, counts {plan.counts}")
            return plan, decision.to_json()
        loader = plan_static(x, c, self.work)
        before = predicted_plan_step(c.schedule, c.stages, loader.cost, speeds, c.kind_weights)
        after = plan.predicted_step
        pace = speeds.max(axis=1)
        relative = np.round(pace / pace.min(), 3).tolist()
        decision = Decision(plan_action(plan), before, after, 0.0,
                            plan.fallback or f"replica pace {relative}, counts {plan.counts}: "
                            f"predicted {before:.4g} s -> {after or 0.0:.4g} s")
        return plan, decision.to_json()


def _serve(conn: Any, worker: PlanWorker, nice: int) -> None:
    """The worker process: answer ``(step, newest ratios)`` requests
    (:meth:`PlanWorker.answer`) until None or the pipe closes (the training process is
    gone)."""
    lower_priority(nice)
    try:
        while True:
            item = conn.recv()
            if item is None:
                return
            step, newest = item
            conn.send((step, *worker.answer(step, newest)))
    except (EOFError, OSError, KeyboardInterrupt):
        return


class PlanProcess:
    """A :class:`PlanWorker` in a child process (see the module doc): :meth:`request` a step,
    then :meth:`result` it. On the planning rank only. ``nice``: the worker's CPU priority
    increment (0 keeps the training process's)."""

    def __init__(self, worker: PlanWorker, nice: int = WORKER_NICE) -> None:
        self._conn, self._proc = start_child(_serve, (worker, int(nice)), "bubblecast-planner")
        self._done: dict[int, Planned] = {}

    def gone(self) -> str | None:
        """Why the worker can plan no more (None while it runs)."""
        return exit_reason(self._proc, "planner")

    def request(self, step: int, newest: np.ndarray | None = None) -> None:
        """Queue step ``step``, with the ranks' newest speed ratios (None: none since the
        last request); never blocks on planning, a gone worker is reported by
        :meth:`result`."""
        if self.gone() is None:
            with contextlib.suppress(OSError):
                self._conn.send((step, newest))

    def result(self, step: int, timeout_s: float) -> Planned | str:
        """Step ``step``'s outcome, waiting up to ``timeout_s``; else the reason there is
        none (the worker is gone, or the plan was not ready in time)."""
        deadline = time.perf_counter() + timeout_s
        while step not in self._done:
            left = deadline - time.perf_counter()
            if left <= 0:
                return f"the plan was not ready within {timeout_s:g} s"
            try:
                if self._conn.poll(min(left, 0.25)):
                    got, *outcome = self._conn.recv()
                    self._done[int(got)] = tuple(outcome)  # type: ignore[assignment]
                    continue
            except (EOFError, OSError):
                self._proc.join(timeout=1.0)
                return self.gone() or "the planner process closed its pipe"
            why = self.gone()
            if why is not None and not self._conn.poll():
                return why
        for late in [k for k in self._done if k < step]:  # answers that came after a timeout
            del self._done[late]
        return self._done.pop(step)

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the worker (ask, then terminate)."""
        stop_child(self._conn, self._proc, timeout_s)
