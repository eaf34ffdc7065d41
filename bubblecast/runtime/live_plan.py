"""Planning every step's documents live (``run --policy tokens|balance``): :class:`LivePlanner`.

The packed model's data loader holds each step's documents before the step runs
(:mod:`bubblecast.runtime.document_loader`). Global rank 0 plans them on a data-loader thread,
one step ahead, with :func:`bubblecast.policy.work_plan.plan_batch` -- packing, order and
micro-batches per replica:

- ``tokens``: token counts, equal speeds and counts (the hand-written heuristic);
- ``balance``: the learned cost model (``bubblecast train EVENTS --model cost``, loaded once by
  rank 0, its per-layer cost and F/B/W weights sent to every rank) and each rank's forecast
  speed: after every step each rank measures its compute seconds (F+B+W, recorded) over the
  cost model's prediction for its micro-batches and layers; rank 0 forecasts the ratios one
  step ahead with the trend forecaster (:class:`bubblecast.policy.forecasting.TrendForecaster`,
  the offline ``balance`` policy's default), a replica going at its slowest rank's pace.

At the start of step ``k`` one collective (an ``all_gather`` of one small float64 tensor per
rank over the job: :func:`encode`) carries rank 0's plan of step ``k`` to every rank (each
document's micro-batch slot and the replicas' counts: every rank knows the step's documents)
and every rank's ratio of step ``k - 1`` to rank 0, which then queues step ``k + 1`` for the
thread (so step ``k + 1`` is planned from ratios up to ``k - 1`` while step ``k`` trains).
Each plan is recorded as the step's :class:`~bubblecast.policy.decision.Decision` (action
:class:`PlanWork`, predicted step seconds of the loader's plan and of the plan, the reason,
the planning latency).

Fail open: a plan that cannot be applied -- the planner raised, the plan is not ready within
``timeout_s``, or it breaks the step (a document missing or twice, a micro-batch over the
budget, a replica without micro-batches or with a count its schedule refuses) -- becomes the
data loader's own order for that step, with the reason logged and recorded; training goes on.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import replace
from typing import Any

import numpy as np

from bubblecast.policy.work_plan import TOKENS, WorkPlan, plan_batch, plan_static
from bubblecast.policy.work_policies import plan_action
from bubblecast.policy.work_timing import predicted_plan_step


def _action_json(plan: WorkPlan) -> dict[str, Any]:
    from bubblecast.policy.actions import action_to_json

    return action_to_json(plan_action(plan))

log = logging.getLogger("bubblecast.plan")

#: Seconds the training thread waits for a step's plan before falling back to the loader's.
PLAN_TIMEOUT_S = 30.0
#: Steps of speed history the forecaster sees.
HISTORY = 64
#: ``loader`` plans the data loader's own order through the same machinery (an A/B of the
#: planner's overhead against ``static``, which plans nothing).
METHODS = ("tokens", "balance", "loader")


def plan_problem(plan: WorkPlan, lengths: np.ndarray, config: Any) -> str | None:
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
    """``plan`` with each micro-batch's documents in index order (what :func:`decode`
    gives back; the order within a micro-batch changes nothing but the padding layout)."""
    mbs = tuple(tuple(tuple(sorted(int(i) for i in mb)) for mb in rep)
                for rep in plan.microbatches)
    return replace(plan, microbatches=mbs)


def encode(plan: WorkPlan | None, n: int, replicas: int, ratio: tuple[int, float] | None
           ) -> np.ndarray:
    """One rank's payload of a step's exchange: ``[planned?, slot of each of the n documents,
    count of each replica, ratio step (-1: none), ratio]`` (no plan: zeros)."""
    out = np.zeros(1 + n + replicas + 2, dtype=np.float64)
    if plan is not None:
        replica, slot = plan.assignment(n)
        out[0], out[1:1 + n] = 1.0, slot
        out[1 + n:1 + n + replicas] = plan.counts
    out[-2], out[-1] = (float(ratio[0]), float(ratio[1])) if ratio is not None else (-1.0, 0.0)
    return out


def decode(row: np.ndarray, n: int, replicas: int, method: str) -> WorkPlan | None:
    """The plan rank 0 sent (``row``: its payload, see :func:`encode`), None for none:
    replica ``r``'s micro-batches are its slots in order, their documents in index order."""
    if row[0] != 1.0:
        return None
    slot = row[1:1 + n].astype(np.int64)
    counts = row[1 + n:1 + n + replicas].astype(np.int64)
    order = np.argsort(slot, kind="stable")
    bounds = np.searchsorted(slot[order], np.arange(int(counts.sum()) + 1))
    mbs = [tuple(order[bounds[j]:bounds[j + 1]].tolist()) for j in range(int(counts.sum()))]
    starts = np.concatenate([[0], np.cumsum(counts)]).tolist()
    return WorkPlan(tuple(tuple(mbs[starts[r]:starts[r + 1]]) for r in range(replicas)),
                    method=method)


def load_work_cost(source: str | None, method: str, spec: dict[str, Any] | None = None
                   ) -> tuple[Any, tuple | None, str | None]:
    """``(work cost, F/B/W weights, problem)`` of ``method``: token counts for ``tokens``;
    the cost model at ``source`` for ``balance`` (on a problem -- it does not load, or was
    trained on another model shape than ``spec`` -- token counts and the reason)."""
    if method != "balance":
        return TOKENS, None, None
    from bubblecast.forecast.cost_model import shape_mismatch
    from bubblecast.policy.plan_api import load_cost, resolve_cost

    try:
        model = load_cost(source) if isinstance(source, str) else source
        work, weights, _ = resolve_cost(model, "--model")
        why = shape_mismatch(model, spec) if spec is not None else None
    except Exception as exc:  # fail open: plan on token counts, say why
        return TOKENS, None, f"cost model {source}: {' '.join(str(exc).split())}"
    if why:
        return TOKENS, None, f"cost model {source} is of another model shape: {why}"
    return work, weights, None


class LivePlanner:
    """Plans the packed model's steps live (see the module doc); one per rank, the thread on
    global rank 0 only. ``plan(step)`` is a collective over the whole job."""

    def __init__(self, trainer: Any, method: str, cost_model: str | None = None,
                 timeout_s: float = PLAN_TIMEOUT_S) -> None:
        import torch.distributed as dist

        if method not in METHODS:
            raise ValueError(f"live planner: unknown method {method!r}")
        self.trainer, self.method, self.timeout_s = trainer, method, float(timeout_s)
        self.loader = trainer.packed.loader
        self.lead = trainer.global_rank == 0
        self.world = dist.get_world_size()
        from dataclasses import asdict

        spec = asdict(trainer.spec)
        box = [load_work_cost(cost_model, method, spec) if self.lead else None]
        dist.broadcast_object_list(box, src=0)  # rank 0 loads the model, every rank prices
        self.work, weights, self.problem = box[0]
        if self.problem:
            log.warning("bubblecast live planner: %s; planning on token counts", self.problem)
        base = self.loader.config
        self.config = replace(base, rebalance_counts=False) if method == "tokens" or \
            self.problem else replace(base, kind_weights=weights or base.kind_weights)
        plan = trainer.plan
        self.layers = np.array([len(plan.layer_range(s)) for s in range(plan.stages)],
                               dtype=np.float64)
        self.decisions: list[dict[str, Any]] = []
        self.history: list[np.ndarray] = []  # rank 0: per step, (replicas, stages) ratios
        self._nominal: dict[int, float] = {}  # this rank's predicted compute per step
        self._ratio: tuple[int, float] | None = None  # this rank's latest (step, ratio)
        self._results: dict[int, tuple[WorkPlan | None, str | None, dict[str, Any]]] = {}
        self._cond = threading.Condition()
        self._requests: queue.Queue[tuple[int, np.ndarray] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        if trainer.recording.recorder.record:
            trainer.recording.recorder.add_step_hook(self._step_end)
        if self.lead:
            self._thread = threading.Thread(target=self._loop, name="bubblecast-planner",
                                            daemon=True)
            self._thread.start()
            self._requests.put((trainer.step, self._history_for_plan()))

    # -- every rank -------------------------------------------------------------------------
    def plan(self, step: int) -> WorkPlan:
        """Collective (whole job): step ``step``'s plan, the same on every rank."""
        import torch
        import torch.distributed as dist

        n, replicas = len(self.loader.lengths(step)), self.config.replicas
        planned, why = self._take(step) if self.lead else (None, None)
        row = encode(planned, n, replicas, self._ratio)
        if self.world == 1:
            table = row[None]
        else:
            mine = torch.from_numpy(row).to(self.trainer.device)
            rows = [torch.empty_like(mine) for _ in range(self.world)]
            dist.all_gather(rows, mine)
            table = torch.stack(rows).cpu().numpy()
        plan = decode(table[0], n, replicas, self.method)
        if self.lead:
            self._observe([None if row[-2] < 0 else (int(row[-2]), float(row[-1]))
                           for row in table])
            self._requests.put((step + 1, self._history_for_plan()))
        if plan is None:
            plan = self.loader.static_plan(step)
            if self.lead:
                log.warning("bubblecast live planner: step %d runs the data loader's order: %s",
                            step, why)
        self._remember(step, plan)
        return plan

    def _remember(self, step: int, plan: WorkPlan) -> None:
        """This rank's predicted compute of ``step`` (cost x layers), for its speed ratio."""
        t = self.trainer
        x = self.loader.lengths(step)
        mbs = plan.microbatches[t.replica]
        tokens = np.array([x[list(mb)].sum() for mb in mbs], dtype=np.float64)
        squares = np.array([np.square(x[list(mb)].astype(np.float64)).sum() for mb in mbs])
        docs = np.array([len(mb) for mb in mbs], dtype=np.float64)
        cost = float(self.work.microbatch(tokens, squares, docs).sum())
        self._nominal = {step: cost * self.layers[t.rank]}

    def _step_end(self, view: Any) -> None:
        nominal = self._nominal.get(view.step)
        if nominal:
            self._ratio = (view.step, view.compute_s() / nominal)

    def observe(self, step: int, seconds: float) -> None:
        """After each step (:class:`~bubblecast.runtime.packed_step.PackedSteps`): without
        recorded compute, the step's wall seconds stand in for this rank's."""
        if not self.trainer.recording.recorder.record and self._nominal.get(step):
            self._ratio = (step, seconds / self._nominal[step])

    def close(self) -> None:
        """Stop the thread (rank 0)."""
        if self._thread is not None:
            self._requests.put(None)
            self._thread.join(timeout=self.timeout_s)
            self._thread = None

    # -- rank 0 -----------------------------------------------------------------------------
    def _take(self, step: int) -> tuple[WorkPlan | None, str | None]:
        """The thread's plan of ``step`` (waits up to ``timeout_s``), checked; on a problem
        ``(None, why)``, recorded as the step's fall-back decision."""
        deadline = time.perf_counter() + self.timeout_s
        with self._cond:
            while step not in self._results:
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                self._cond.wait(left)
            got = self._results.pop(step, None)
        if got is None:
            why = f"the plan was not ready within {self.timeout_s:g} s"
            record: dict[str, Any] = {"latency_s": self.timeout_s}
            plan = None
        else:
            plan, why, record = got
            if plan is not None:
                why = plan_problem(plan, self.loader.lengths(step), self.config)
        if why is not None or plan is None:
            static = self.loader.static_plan(step)
            from bubblecast.policy.decision import Decision

            decision = Decision(plan_action(static), None, None, 0.0,
                                f"fall-back to the data loader's order: {why}")
            record = {**{k: v for k, v in record.items() if k == "latency_s"},
                      **decision.to_json(), "fallback": why}
            plan = None
        self.decisions.append({"step": step, **record})
        return plan, why

    def _observe(self, boxes: list[Any]) -> None:
        """Every rank's latest ratio into the history (a missing one repeats its last)."""
        c = self.config
        last = self.history[-1] if self.history else np.ones((c.replicas, c.stages))
        now = last.copy()
        seen = False
        for rank, item in enumerate(boxes):
            if item is not None:
                now[rank // c.stages, rank % c.stages] = item[1]
                seen = True
        if seen:
            self.history.append(now)

    def _history_for_plan(self) -> list[np.ndarray] | None:
        """What the thread forecasts the next plan's speeds from (on the training thread:
        only a list of the recent ratio arrays, which are never changed once appended); None
        when the method plans without speeds."""
        if self.method == "balance" and not self.problem:
            return self.history[-HISTORY:]
        return None

    def _speeds(self, history: list[np.ndarray] | None) -> np.ndarray:
        """Per rank, the forecast speed ratio one step ahead times its layers (on the
        thread; ones x layers before any telemetry, ones for methods without speeds)."""
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

    def _loop(self) -> None:
        while True:
            item = self._requests.get()
            if item is None:
                return
            step, history = item
            t0 = time.perf_counter()
            try:
                plan, record = self._plan(step, self._speeds(history), bool(history))
                plan = canonical(plan)
                record["action"] = _action_json(plan)
                why = None
            except Exception as exc:  # noqa: BLE001 - fail open: the loader's order
                plan, record = None, {}
                why = f"the planner failed ({type(exc).__name__}: {' '.join(str(exc).split())})"
            record["latency_s"] = time.perf_counter() - t0
            with self._cond:
                self._results[step] = (plan, why, record)
                self._cond.notify_all()

    def _plan(self, step: int, speeds: np.ndarray, seen: bool
              ) -> tuple[WorkPlan, dict[str, Any]]:
        """Step ``step``'s plan and its decision record (on the thread); ``seen``: the speeds
        come from telemetry (not the equal speeds of the first steps)."""
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
        pace = speeds.max(axis=1)
        if not seen:
            decision = Decision(plan_action(plan), None, None, 0.0,
                                f"no telemetry yet: equal speeds, counts {plan.counts}")
            return plan, decision.to_json()
        loader = plan_static(x, c, self.work)
        before = predicted_plan_step(c.schedule, c.stages, loader.cost, speeds, c.kind_weights)
        after = plan.predicted_step
        relative = np.round(pace / pace.min(), 3).tolist()
        decision = Decision(plan_action(plan), before, after, 0.0,
                            plan.fallback or f"replica pace {relative}, counts {plan.counts}: "
                            f"predicted {before:.4g} s -> {after or 0.0:.4g} s")
        return plan, decision.to_json()
