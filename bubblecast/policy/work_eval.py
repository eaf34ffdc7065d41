"""Offline evaluation of work-balancing policies on packed-document runs (``policy-eval``).

A packed-document run (a simulation with ``--documents``) records each step's documents in
its metadata (``extra["documents"]["lengths"]``) and the ground truth behind its durations:
the true cost of a micro-batch (``documents.cost``), each rank's slowdown (the ``speed``
column) and each stage's F, B and W per micro-batch (``workload`` and the partition).

Each policy (:mod:`bubblecast.policy.work_policies`) plans every step from what a real system
sees (:class:`~bubblecast.policy.work_policies.WorkContext`: the documents, and telemetry of
the steps before); every plan is checked to place each of the step's documents exactly once
within the token budget (a violation is an internal error). The plans are then timed against
the truth (a run recorded on real hardware, which has none, against its own fit:
:mod:`bubblecast.policy.work_truth`), the same for every policy: each micro-batch's true cost
(the true ``WorkCost`` on its documents) times its stage's F/B/W times the rank's true speed
at that step, without noise, with :mod:`bubblecast.sim.steptime` on the run's schedule, each
replica with its own micro-batch count; a step takes its slowest replica's time.

Per policy, beside the keys every policy-eval row has (``step_s``, ``bubble_fraction``,
``speedup_vs_static``, ``oracle_share``, ``actions``: steps whose plan differs from the
loader's, ``migration_s``: 0): ``imbalance_degree`` (mean over steps of the slowest
micro-batch's true cost x micro-batches / the step's total true cost), ``bound_step_s`` (the
step time if every micro-batch cost the step's mean, with the loader's counts: the same for
every policy), ``floor_step_s`` (no plan of the documents into the loader's counts is faster:
:func:`step_floors`; None where it does not apply), ``optimum_step_s`` and
``optimum_best_s`` (asked for with ``EvalConfig.optimum_s``, one replica only: per step the
MILP's proven lower bound and the best plan it found, :func:`step_optima`; None otherwise),
``decision_ms`` (mean planning time per step, measured) and, for ``balance``,
``cost_model`` (where its costs come from) and ``microbatch_counts``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bubblecast.errors import BubblecastError
from bubblecast.policy.decision import Decision
from bubblecast.policy.forecasting import model_failed
from bubblecast.policy.run_data import logged_partitions
from bubblecast.policy.work_fit import microbatch_table
from bubblecast.policy.work_plan import PlanConfig, WorkPlan, plan_static
from bubblecast.policy.work_policies import (
    ONLINE_COST,
    WORK_POLICIES,
    WorkContext,
    WorkPolicy,
    WorkTruth,
    make_work_policy,
)
from bubblecast.policy.work_timing import (
    critical_path_floor,
    least_end_costs,
    stage_kinds,
    time_replicas,
)
from bubblecast.policy.work_truth import ESTIMATED_NOTE, estimated_truth
from bubblecast.sim.documents import WorkCost, check_lengths, microbatch_stats
from bubblecast.telemetry.events import Events

MODE = "work-plan"
NOTE = ("per-step plans of the run's documents timed against the simulation's ground truth "
        "(true micro-batch costs and rank speeds, noise-free) with the engine")
NO_DOCUMENTS = "no documents in this run: reported as the static policy"
TREND = "built-in robust trend extrapolation of each rank's observed speed"


def is_document_run(events: Events, run_id: str) -> bool:
    """Whether the run records each step's packed documents (``documents.lengths``)."""
    docs = events.runs[run_id].extra.get("documents")
    return isinstance(docs, dict) and bool(docs.get("lengths"))


def observed_context(events: Events, run_id: str) -> WorkContext:
    """What the policies see of a packed-document run: its shape and token budget, each
    step's documents and its telemetry (BubblecastError naming the metadata field or column
    when missing). Neither the ``speed`` column nor the true cost is read."""
    meta = events.runs[run_id]
    ev = events.run(run_id) if len(events.run_ids) > 1 else events
    docs = meta.extra["documents"]
    where = f"run '{run_id}' metadata documents"
    if "token_budget" not in docs:
        raise BubblecastError(f"{where}: no 'token_budget'")
    table = microbatch_table(ev.frame, meta)
    steps = table.steps
    budget, total = int(docs["token_budget"]), meta.replicas * meta.microbatches
    if int(steps.max()) >= len(docs["lengths"]):
        raise BubblecastError(f"{where}.lengths: {len(docs['lengths'])} steps, the events run "
                              f"to step {int(steps.max())}")
    lengths = tuple(check_lengths(docs["lengths"][int(s)], budget, f"{where}.lengths[{int(s)}]",
                                  total) for s in steps)
    config = PlanConfig(budget, meta.replicas, meta.microbatches, meta.stages, meta.schedule,
                        kind_weights=table.kind_weights(), rebalance_counts=meta.chunks == 1)
    return WorkContext(run_id, config, lengths, table)


def has_sim_truth(events: Events, run_id: str) -> bool:
    """Whether the run is a simulation that saved its ground truth (metadata ``workload`` and
    ``documents.cost``, and the ``speed`` column)."""
    meta = events.runs[run_id]
    return ("cost" in meta.extra["documents"] and "workload" in meta.extra
            and "speed" in events.frame.columns)


def load_document_run(events: Events, run_id: str) -> tuple[WorkContext, WorkTruth]:
    """:func:`observed_context` and the truth its plans are timed against: a simulation's
    saved ground truth, else (a recorded run) the run's own fit
    (:func:`bubblecast.policy.work_truth.estimated_truth`)."""
    from bubblecast.sim.schedules import vstage_ranks
    from bubblecast.sim.workload import Workload, stage_costs

    context = observed_context(events, run_id)
    meta = events.runs[run_id]
    ev = events.run(run_id) if len(events.run_ids) > 1 else events
    docs = meta.extra["documents"]
    if not has_sim_truth(ev, run_id):
        return context, estimated_truth(context.table, meta.schedule, meta.chunks, run_id)
    steps = context.table.steps
    wl = Workload.from_json(meta.extra["workload"], f"run '{run_id}' metadata")
    parts = logged_partitions(meta, steps, wl.n_layers, meta.stages * meta.chunks)
    comp = ev.compute()
    ti = np.searchsorted(steps, comp["step"].to_numpy(np.int64))
    speed = np.ones((len(steps), meta.replicas, meta.stages))
    speed[ti, comp["replica"].to_numpy(np.int64), comp["stage"].to_numpy(np.int64)] = \
        comp["speed"].to_numpy(np.float64)
    truth = WorkTruth(WorkCost.from_json(docs["cost"], f"run '{run_id}' metadata documents.cost"),
                      speed, stage_costs(wl, parts) / 1000.0,
                      vstage_ranks(meta.schedule, meta.stages, meta.chunks),
                      float(meta.extra.get("sim", {}).get("comm_ms", 0.0)) / 1000.0)
    return context, truth


def check_plan(plan: WorkPlan, lengths: np.ndarray, config: PlanConfig, where: str) -> None:
    """Every document exactly once, no micro-batch over the budget, the step's micro-batch
    total kept; AssertionError otherwise (an internal error, never bad input)."""
    flat = np.fromiter((i for rep in plan.microbatches for mb in rep for i in mb), np.int64)
    if len(flat) != len(lengths) or not np.array_equal(np.sort(flat), np.arange(len(lengths))):
        raise AssertionError(f"{where}: the plan does not place each of the {len(lengths)} "
                             "documents exactly once")
    if sum(plan.counts) != config.total:
        raise AssertionError(f"{where}: the plan has {sum(plan.counts)} micro-batches, the "
                             f"step {config.total}")
    for rep in plan.microbatches:
        for mb in rep:
            if int(lengths[list(mb)].sum()) > config.token_budget:
                raise AssertionError(f"{where}: a micro-batch holds more than the token budget "
                                     f"{config.token_budget}")


@dataclass
class WorkTrace:
    """One work policy on one run: per step its time against the truth, idle and rank x
    window seconds, the true imbalance degree, the planning seconds and the decision; and
    whether the plan differs from the loader's (``acted``)."""

    name: str
    step_s: np.ndarray
    idle_s: np.ndarray
    cells_s: np.ndarray
    imbalance: np.ndarray
    decision_s: np.ndarray
    acted: np.ndarray
    decisions: list[tuple[int, Decision]] = field(repr=False)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def actions(self) -> list[tuple[int, dict[str, Any]]]:
        """``(step index, action JSON)`` of each plan that differs from the loader's."""
        return [(t, d.to_json()["action"]) for t, d in self.decisions if self.acted[t]]

    def summary(self) -> dict[str, Any]:
        cells = float(self.cells_s.sum())
        return {"step_s": float(self.step_s.mean()),
                "bubble_fraction": float(self.idle_s.sum() / cells) if cells > 0 else 0.0,
                "actions": int(self.acted.sum()), "migration_s": 0.0,
                "imbalance_degree": float(self.imbalance.mean()),
                "decision_ms": float(1000.0 * self.decision_s.mean()), **self.extra}


def _true_costs(plan: WorkPlan, lengths: np.ndarray, cost: WorkCost) -> list[np.ndarray]:
    """Each replica's micro-batch true costs in run order."""
    _, slot = plan.assignment(len(lengths))
    total = sum(plan.counts)
    tokens, sq, docs = microbatch_stats(lengths, slot, total)
    flat = cost.microbatch(tokens, sq, docs)
    edges = np.cumsum([0, *plan.counts])
    return [flat[edges[r]:edges[r + 1]] for r in range(len(plan.counts))]


def _run_policy(policy: WorkPolicy, context: WorkContext, truth: WorkTruth,
                loader: list[WorkPlan]) -> tuple[list[list[np.ndarray]], WorkTrace]:
    """Step ``policy`` through the run: its plans' true costs and a trace without times
    (``loader``: the data loader's plan of each step, to tell the plans that act)."""
    policy.reset(context)
    T = len(context.lengths)
    costs, decisions = [], []
    spent, acted, imbalance = np.zeros(T), np.zeros(T, dtype=bool), np.zeros(T)
    for t in range(T):
        start = time.perf_counter()
        plan, decision = policy.decide(t)
        spent[t] = time.perf_counter() - start
        x = context.lengths[t]
        check_plan(plan, x, context.config, f"policy {policy.name}, run "
                                            f"'{context.run_id}', step index {t}")
        per = _true_costs(plan, x, truth.cost)
        flat = np.concatenate(per)
        imbalance[t] = flat.max() * len(flat) / flat.sum() if flat.sum() > 0 else 1.0
        acted[t] = plan.microbatches != loader[t].microbatches
        costs.append(per)
        decisions.append((t, decision))
    empty = np.zeros(T)
    return costs, WorkTrace(policy.name, empty, empty, empty, imbalance, spent, acted,
                            decisions)


def _time(costs: list[list[list[np.ndarray]]], truth: WorkTruth, schedule: str
          ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per plan set (``costs[k][t][r]``): step, idle and cell seconds per step, all timed
    against the truth in one batch per micro-batch count."""
    T, R, P = truth.speed.shape
    kinds = stage_kinds(schedule, P, truth.chunks, truth.speed, truth.vstage_kind[:, None])
    rows = [c for plan_set in costs for step in plan_set for c in step]
    n_kinds = np.broadcast_to(kinds[None], (len(costs), T, R) + kinds.shape[2:])
    window, bubble = time_replicas(schedule, P, truth.chunks, truth.comm_s, rows,
                                   n_kinds.reshape((-1,) + kinds.shape[2:]))
    window = window.reshape(len(costs), T, R)
    cells = P * window
    idle = bubble.reshape(len(costs), T, R) * cells
    return [(window[k].max(axis=1), idle[k].sum(axis=1), cells[k].sum(axis=1))
            for k in range(len(costs))]


def _bound(costs: list[list[np.ndarray]], microbatches: int) -> list[list[np.ndarray]]:
    """Every micro-batch at the step's mean true cost, the loader's counts."""
    out = []
    for per in costs:
        flat = np.concatenate(per)
        out.append([np.full(microbatches, flat.mean()) for _ in per])
    return out


def _step_kinds(context: WorkContext, truth: WorkTruth) -> np.ndarray:
    """``(T, R, V, 3)``: per step and replica, each virtual stage's true F, B and W seconds
    per unit of cost, the rank's true speed included."""
    c = context.config
    return stage_kinds(c.schedule, c.stages, truth.chunks, truth.speed,
                       truth.vstage_kind[:, None])


def step_floors(context: WorkContext, truth: WorkTruth) -> np.ndarray | None:
    """Per step, :func:`~bubblecast.policy.work_timing.critical_path_floor`: no plan of the
    step's documents into the loader's micro-batch count is faster (timed against the truth);
    None where the floor does not apply (several replicas, chunks or under 2 micro-batches,
    a schedule other than 1F1B or GPipe)."""
    c = context.config
    if c.replicas != 1 or truth.chunks != 1 or c.microbatches < 2 \
            or c.schedule not in ("1f1b", "gpipe"):
        return None
    kinds = _step_kinds(context, truth)
    w, floors = truth.cost, []
    for t, x in enumerate(context.lengths):
        x = np.asarray(x, dtype=np.float64)
        nonempty = float(np.ceil(x.sum() / c.token_budget))
        total = float(w.documents_cost(x).sum()) + w.per_microbatch * nonempty
        ends = least_end_costs(x, c.microbatches, c.token_budget, w)
        floors.append(critical_path_floor(kinds[t, 0], total, ends, truth.comm_s))
    return np.asarray(floors, dtype=np.float64)


def step_optima(context: WorkContext, truth: WorkTruth, time_limit_s: float | None
                ) -> tuple[np.ndarray, np.ndarray] | None:
    """Per step, the best plan of the step's documents into the loader's micro-batch count
    (every micro-batch non-empty) by :func:`~bubblecast.policy.work_optimum.optimal_step`,
    timed against the truth, at most ``time_limit_s`` seconds each: ``(best, bound)``
    seconds, ``bound`` proven (no such plan is faster). None when not asked for
    (``time_limit_s`` None) or with several replicas."""
    from bubblecast.policy.work_optimum import optimal_step

    c = context.config
    if time_limit_s is None or c.replicas != 1:
        return None
    kinds = _step_kinds(context, truth)
    best, bound = [], []
    for t, x in enumerate(context.lengths):
        got = optimal_step(np.asarray(x), c.microbatches, c.token_budget, truth.cost,
                           kinds[t, 0], c.schedule, c.stages, truth.chunks, truth.comm_s,
                           time_limit_s)
        best.append(got.best_s)
        bound.append(got.bound_s)
    return np.asarray(best, dtype=np.float64), np.asarray(bound, dtype=np.float64)


def _finite_mean(values: np.ndarray | None) -> float | None:
    """The mean of per-step values, None when there are none or one is not finite (a step
    whose MILP found no plan within its time limit leaves the best plans' mean undefined)."""
    if values is None or not len(values) or not np.isfinite(values).all():
        return None
    return float(values.mean())


@functools.lru_cache(maxsize=4)
def _loaded_cost_model(source: str) -> Any:
    from bubblecast.policy.plan_api import load_cost

    return load_cost(source)


def cost_model_for(spec: Any, run_id: str) -> Any:
    """The cost model ``spec`` names (a model directory, a ``models:/`` URI or a loaded
    model, as :func:`bubblecast.plan_batch` takes it), refused in one line when it was trained
    without ``tokens_sq``; None stays None."""
    from bubblecast.policy.plan_api import resolve_cost

    if spec is None:
        return None
    model = _loaded_cost_model(str(spec)) if isinstance(spec, str) else spec
    resolve_cost(model, f"--cost-model (packed-document run '{run_id}')")
    return model


def _balance(context: WorkContext, events: Events, config: Any, model: Any
             ) -> tuple[WorkPolicy, str, str | None]:
    """The balance policy for the run, a note on its speed forecaster and, when the model
    could not forecast the run and ``config.fallback`` allowed the trend, why."""
    from bubblecast.policy.work_speeds import model_speed_table

    params = dict(getattr(config, "policy_params", {}).get("balance", {}))
    params.setdefault("cost_model", cost_model_for(getattr(config, "cost_model", None),
                                                   context.run_id))
    note, failed = TREND, None
    if model is not None:
        try:
            params["speed_table"], params["speed_signal"] = model_speed_table(
                model, events, context)
            note = f"trained model '{getattr(model, 'kind', 'model')}' (trend where it has none)"
        except BubblecastError as exc:
            note, failed = model_failed(exc, config, TREND), str(exc)
    return make_work_policy("balance", **params), note, failed


def evaluate_work_run(events: Events, run_id: str, names: list[str], config: Any,
                      model: Any, compare: Callable[[dict, Any], None]
                      ) -> tuple[dict[str, Any], dict[str, WorkTrace]]:
    """One packed-document run under ``names`` (static and oracle always run as references);
    ``compare`` adds speedup_vs_static and oracle_share to the summaries (policy-eval's)."""
    wanted = list(dict.fromkeys(["static", *names, "oracle"]))
    bad = [n for n in wanted if n not in WORK_POLICIES]
    if bad:
        raise BubblecastError(f"run '{run_id}' packs documents: policy '{bad[0]}' moves layers "
                              f"and is not evaluated on packed-document runs (use --policies "
                              f"{','.join(WORK_POLICIES)})")
    context, truth = load_document_run(events, run_id)
    loader = [plan_static(x, context.config) for x in context.lengths]
    costs, traces, forecaster, failed = [], {}, None, None
    for name in wanted:
        if name == "balance":
            policy, forecaster, failed = _balance(context, events, config, model)
        else:
            policy = make_work_policy(name, truth)
        per, traces[name] = _run_policy(policy, context, truth, loader)
        traces[name].extra.update(policy.report())
        costs.append(per)
    timed = _time([*costs, _bound(costs[0], context.config.microbatches)], truth,
                  context.config.schedule)
    bound = float(timed[-1][0].mean())
    floors = step_floors(context, truth)
    floor = float(floors.mean()) if floors is not None and len(floors) else None
    best, proven = step_optima(context, truth, getattr(config, "optimum_s", None)) or (None, None)
    optimum = {"optimum_step_s": _finite_mean(proven), "optimum_best_s": _finite_mean(best)}
    for (step, idle, cells), name in zip(timed, wanted, strict=False):
        tr = traces[name]
        tr.step_s, tr.idle_s, tr.cells_s = step, idle, cells
        tr.extra["bound_step_s"] = bound
        tr.extra["floor_step_s"] = floor
        tr.extra.update(optimum)
    summary = {name: traces[name].summary() for name in wanted}
    compare(summary, config)
    oracle = summary["oracle"]
    note = NOTE if has_sim_truth(events, run_id) else ESTIMATED_NOTE  # columns: frame-wide
    report = {"run_id": run_id, "mode": MODE, "note": note, "steps": len(context.lengths),
              "forecaster": forecaster, "fallback": failed,
              "oracle_gain": oracle["gain_vs_static"] if oracle["oracle_share"] is not None
              else None,
              "migration": {"source": "none: plans move documents, never layers"},
              "bound_step_s": bound, "floor_step_s": floor, **optimum,
              "policies": {n: summary[n] for n in names}}
    if "balance" in traces:
        report["cost_model"] = traces["balance"].extra["cost_model"]
    return report, {n: traces[n] for n in names}


def work_aggregate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Across runs, the work-planning keys of one policy's rows: plain means of
    ``imbalance_degree``, ``bound_step_s``, ``floor_step_s``, ``optimum_step_s``,
    ``optimum_best_s`` and ``decision_ms`` over the runs that have them, the distinct
    ``cost_model`` and ``note`` texts, and summed counts of rebalanced steps."""
    out: dict[str, Any] = {}
    for key in ("imbalance_degree", "bound_step_s", "floor_step_s", "optimum_step_s",
                "optimum_best_s", "decision_ms"):
        values = [r[key] for r in rows if r.get(key) is not None]
        if values:
            out[key] = float(np.mean(values))
    for key in ("cost_model", "note"):
        texts = list(dict.fromkeys(r[key] for r in rows if r.get(key)))
        if texts:
            out[key] = texts[0] if len(texts) == 1 else " | ".join(texts)
    counts = [r["microbatch_counts"] for r in rows if r.get("microbatch_counts")]
    if counts:
        out["microbatch_counts"] = {"rebalanced_steps": sum(c["rebalanced_steps"]
                                                            for c in counts),
                                    "steps": sum(c["steps"] for c in counts)}
    return out


__all__ = ["MODE", "NO_DOCUMENTS", "ONLINE_COST", "WorkTrace", "check_plan", "cost_model_for",
           "evaluate_work_run", "is_document_run", "load_document_run", "observed_context",
           "step_optima", "work_aggregate"]
