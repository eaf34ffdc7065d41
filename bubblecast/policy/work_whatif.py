"""``whatif``'s ``balanced_work`` counterfactual (SPEC §3): the same documents under the oracle
plan, and :class:`BubbleAnalysis`, the public analysis object that adds it.

The what-if is over measurements, as every ``whatif`` scenario is. A micro-batch's cost comes
from a :class:`~bubblecast.sim.documents.WorkCost` fitted to the run's own observed durations:
non-negative least squares of each (rank, micro-batch)'s F + B + W seconds per layer on its
``tokens``, ``tokens_sq`` and ``documents``, divided by the rank's speed at that step when the
events carry a ``speed`` column, else by the rank's median ratio of observed to fitted
seconds (:func:`bubblecast.policy.work_fit.fit_cost_and_speeds`). Each step's ranks run at
that speed (the ``speed`` column, else their observed / fitted seconds at the step). The
oracle plan is the planner's (:func:`~bubblecast.policy.work_plan.plan_batch`) with these
costs and speeds; the loader's plan is its sequential first-fit. Both are timed per step by
the same steptime model (each stage's F, B and W share of its observed compute, times its
layers, speed and the micro-batch's cost; the replay's communication time), and

    ``speedup = mean predicted step (loader's plan) / mean predicted step (oracle plan)``,
    ``step_s = replayed_step_s / speedup``.

The scenario is ``null`` without ``tokens_sq`` (SPEC), and also when the run has
``tokens_sq`` but does not record each step's document lengths (``documents.lengths`` in its
metadata) or cannot be planned; ``balanced_work_note`` then says why.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from bubblecast.errors import BubblecastError
from bubblecast.policy.work_fit import (
    MicrobatchTable,
    fit_cost,
    fit_cost_and_speeds,
    microbatch_table,
    observed_speeds,
)
from bubblecast.policy.work_plan import PlanConfig, plan_batch, plan_static
from bubblecast.policy.work_timing import stage_kinds, time_replicas
from bubblecast.sim import analysis
from bubblecast.sim.documents import WorkCost, check_lengths, microbatch_stats
from bubblecast.sim.schedules import vstage_ranks
from bubblecast.telemetry.events import Events
from bubblecast.telemetry.schema import RunMeta

NO_TOKENS_SQ = "no tokens_sq in this run: micro-batch costs of packed documents are unknown"
NO_LENGTHS = ("the run has tokens_sq but does not record each step's document lengths "
              "(metadata documents.lengths): no documents to plan")


def _speeds(events: Events, table: MicrobatchTable, meta: RunMeta
            ) -> tuple[WorkCost | None, np.ndarray]:
    """The fitted cost and ``(T, R, P)`` speeds (see the module doc)."""
    comp = events.compute()
    if "speed" in comp.columns and not comp["speed"].isna().any():
        ti = np.searchsorted(table.steps, comp["step"].to_numpy(np.int64))
        speed = np.ones(table.layers.shape)
        speed[ti, comp["replica"].to_numpy(np.int64), comp["stage"].to_numpy(np.int64)] = \
            comp["speed"].to_numpy(np.float64)
        return fit_cost(table, speed), speed
    cost, _ = fit_cost_and_speeds(table, per_step=False)
    return cost, (observed_speeds(table, cost) if cost is not None else table.layers)


def _plans(table: MicrobatchTable, meta: RunMeta, docs: dict[str, Any], cost: WorkCost,
           speed: np.ndarray) -> tuple[list[list[np.ndarray]], list[list[np.ndarray]]]:
    """Per step, each replica's micro-batch costs in run order under the loader's plan and
    under the oracle plan."""
    budget = int(docs["token_budget"])
    shares = table.kind_seconds.sum(axis=0)  # (P, 3)
    kinds = shares.sum(axis=0)
    config = PlanConfig(budget, meta.replicas, meta.microbatches, meta.stages, meta.schedule,
                        kind_weights=tuple(float(x) for x in kinds / kinds.sum()),
                        rebalance_counts=meta.chunks == 1)
    loader, oracle = [], []
    for t, step in enumerate(table.steps.tolist()):
        x = check_lengths(docs["lengths"][step], budget, f"documents.lengths[{step}]",
                          config.total)
        for plan, out in ((plan_static(x, config, cost), loader),
                          (plan_batch(x, config, cost, speed[t] * table.layers[t]), oracle)):
            _, slot = plan.assignment(len(x))
            c = cost.microbatch(*microbatch_stats(x, slot, config.total))
            edges = np.cumsum([0, *plan.counts])
            out.append([c[edges[r]:edges[r + 1]] for r in range(len(plan.counts))])
    return loader, oracle


def balanced_work(events: Events, run_id: str, comm_s: float = 0.0
                  ) -> tuple[float | None, str | None]:
    """The speed-up of the oracle plan over the loader's on the run's documents (see the
    module doc), or ``(None, why)``."""
    ev = events.run(run_id) if len(events.run_ids) > 1 else events
    meta = ev.runs[run_id]
    comp = ev.compute()
    if "tokens_sq" not in comp.columns or comp["tokens_sq"].isna().all():
        return None, NO_TOKENS_SQ
    docs = meta.extra.get("documents")
    if not isinstance(docs, dict) or not docs.get("lengths") or "token_budget" not in docs:
        return None, NO_LENGTHS
    try:
        table = microbatch_table(ev.frame, meta)
        cost, speed = _speeds(ev, table, meta)
        if cost is None:
            return None, "no compute to fit micro-batch costs to"
        loader, oracle = _plans(table, meta, docs, cost, speed)
    except (BubblecastError, IndexError) as exc:
        return None, f"the run's documents cannot be planned ({exc})"
    shares = table.kind_seconds.sum(axis=0)
    shares = shares / np.maximum(shares.sum(axis=1, keepdims=True), 1e-300)  # (P, 3)
    owner = vstage_ranks(meta.schedule, meta.stages, meta.chunks)
    vkind = shares[owner] / meta.chunks  # (V, 3): a rank's chunks split its work evenly
    T, R, P = speed.shape
    kinds = stage_kinds(meta.schedule, P, meta.chunks, speed * table.layers, vkind)
    rows = [c for plans in (loader, oracle) for step in plans for c in step]
    window, _ = time_replicas(meta.schedule, P, meta.chunks, comm_s, rows,
                              np.concatenate([kinds.reshape(T * R, -1, 3)] * 2))
    step = window.reshape(2, T, R).max(axis=2).mean(axis=1)
    return (float(step[0] / step[1]) if step[1] > 0 else None), None


class BubbleAnalysis(analysis.BubbleAnalysis):
    """:class:`bubblecast.sim.analysis.BubbleAnalysis` whose :meth:`whatif` also answers
    ``scenarios.balanced_work`` (``{"step_s", "speedup"}``, or null with
    ``balanced_work_note`` saying why; see the module doc)."""

    def __init__(self, source: str | os.PathLike[str] | Events, format: str = "auto",
                 run_id: str | None = None) -> None:
        super().__init__(source, format, run_id)

    def whatif(self, launch_delays: bool = False) -> dict[str, Any]:
        out = super().whatif(launch_delays=launch_delays)
        speedup, why = balanced_work(self.events, out["run_id"],
                                     float(out.get("replay_comm_s") or 0.0))
        out["scenarios"]["balanced_work"] = None if speedup is None else {
            "step_s": out["replayed_step_s"] / speedup, "speedup": speedup}
        if why:
            out["balanced_work_note"] = why
        return out
