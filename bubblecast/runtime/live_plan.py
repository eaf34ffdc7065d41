"""Planning every step's documents live (``run --policy tokens|balance``): :class:`LivePlanner`.

The packed model's data loader holds each step's documents before the step runs
(:mod:`bubblecast.runtime.document_loader`). Global rank 0 has them planned one step ahead by
a worker process, as a data loader's worker (:mod:`bubblecast.runtime.plan_worker`: a thread
would share the training process's interpreter lock and slow its steps), with
:func:`bubblecast.policy.work_plan.plan_batch` -- packing, order and micro-batches per replica:

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
worker with the newest ratios (the worker keeps the history; so step ``k + 1`` is planned
from ratios up to ``k - 1`` while step ``k`` trains).
Each plan is recorded as the step's :class:`~bubblecast.policy.decision.Decision` (action
:class:`PlanWork`, predicted step seconds of the loader's plan and of the plan, the reason,
the planning latency).

Fail open: a plan that cannot be applied -- the planner raised, its process is gone, the
plan is not ready within ``timeout_s``, or it breaks the step (a document missing or twice, a
micro-batch over the budget, a replica without micro-batches or with a count its schedule
refuses: :func:`~bubblecast.runtime.plan_worker.plan_problem`, checked by the worker) --
becomes the data loader's own order for that step, with the reason logged and
recorded; training goes on.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import numpy as np

from bubblecast.policy.work_plan import TOKENS, WorkPlan
from bubblecast.policy.work_policies import plan_action
from bubblecast.runtime.plan_worker import PlanProcess, PlanWorker

log = logging.getLogger("bubblecast.plan")

#: Seconds the training thread waits for a step's plan before falling back to the loader's.
PLAN_TIMEOUT_S = 30.0
#: ``loader`` plans the data loader's own order through the same machinery (an A/B of the
#: planner's overhead against ``static``, which plans nothing).
METHODS = ("tokens", "balance", "loader")


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
    """Plans the packed model's steps live (see the module doc); one per rank, the worker
    process on global rank 0 only. ``plan(step)`` is a collective over the whole job.
    ``worker``: the :class:`~bubblecast.runtime.plan_worker.PlanWorker` class rank 0 runs
    (a subclass plans differently; it must be importable in the worker process)."""

    def __init__(self, trainer: Any, method: str, cost_model: str | None = None,
                 timeout_s: float = PLAN_TIMEOUT_S, worker: type[PlanWorker] = PlanWorker
                 ) -> None:
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
        self._last: np.ndarray | None = None  # rank 0: the latest (replicas, stages) ratios
        self._nominal: dict[int, float] = {}  # this rank's predicted compute per step
        self._ratio: tuple[int, float] | None = None  # this rank's latest (step, ratio)
        self._worker: PlanProcess | None = None
        if trainer.recording.recorder.record:
            trainer.recording.recorder.add_step_hook(self._step_end)
        if self.lead:
            self._worker = PlanProcess(worker(method=method, loader=self.loader,
                                              config=self.config, work=self.work,
                                              problem=self.problem, layers=self.layers))
            self._worker.request(trainer.step)

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
        if self.lead and self._worker is not None:
            newest = self._observe([None if row[-2] < 0 else (int(row[-2]), float(row[-1]))
                                    for row in table])
            self._worker.request(step + 1, newest)
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
        """Stop the worker process (rank 0)."""
        if self._worker is not None:
            self._worker.close()
            self._worker = None

    # -- rank 0 -----------------------------------------------------------------------------
    def _take(self, step: int) -> tuple[WorkPlan | None, str | None]:
        """The worker's plan of ``step`` (waits up to ``timeout_s``), checked; on a problem
        ``(None, why)``, recorded as the step's fall-back decision."""
        got = self._worker.result(step, self.timeout_s) if self._worker is not None else \
            "the planner was closed"
        if isinstance(got, str):
            why: str | None = got
            waited = self._worker is not None and self._worker.gone() is None  # a late plan
            record: dict[str, Any] = {"latency_s": self.timeout_s} if waited else {}
            plan = None
        else:
            plan, why, record = got  # checked by the worker (plan_problem)
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

    def _observe(self, boxes: list[Any]) -> np.ndarray | None:
        """Every rank's latest ratio as one ``(replicas, stages)`` array (a missing one
        repeats its last; None when no rank sent one)."""
        c = self.config
        if all(item is None for item in boxes):
            return None
        now = np.ones((c.replicas, c.stages)) if self._last is None else self._last.copy()
        for rank, item in enumerate(boxes):
            if item is not None:
                now[rank // c.stages, rank % c.stages] = item[1]
        self._last = now
        return now
