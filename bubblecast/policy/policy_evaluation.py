"""Offline policy evaluation: replay each run step by step under each policy.

For every run (:mod:`bubblecast.policy.run_data`) and policy: after each step the policy sees
the observed per-rank speeds so far and its partition, and decides; a repartition applies from
the next step, which also pays the migration pause. The partitions chosen per step then give
counterfactual op times (ground truth, or replay-rescaled for logged runs), timed in one batch.
Per policy: mean step time (migration included), bubble fraction, speed-up over static, share
of the oracle's gain captured, actions taken and migration seconds paid; for predictive also
its forecast guard's counts (``guard``: decisions, those made by the reactive fallback while
the model was worse than the naive forecast, moves the move budget blocked).

A trained model (``model``) is used as trained: one that reads device-metric covariates gets
them from the runs' ``device_metrics`` rows (``metrics``), built by the dataset's code. A run
it cannot forecast (a metric missing, a run too short) is refused in one line naming the
missing input, unless ``EvalConfig.fallback`` asks for the built-in trend forecaster there;
then the result's ``fallback`` key lists those runs and why.

Packed-document runs (their metadata records each step's documents) are evaluated by
:mod:`bubblecast.policy.work_eval` instead: there ``static``, ``tokens``, ``balance`` and
``oracle`` plan each step's documents. Elsewhere ``tokens`` and ``balance`` are reported as
the static policy with a ``note`` saying the run has no documents.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bubblecast.errors import BubblecastError
from bubblecast.policy.actions import Repartition
from bubblecast.policy.cost import MigrationConstants, MigrationCost, run_constants
from bubblecast.policy.decision import Decision
from bubblecast.policy.forecasting import TrendForecaster, WithDeviceMetrics, model_failed
from bubblecast.policy.policies import (
    POLICIES,
    OraclePolicy,
    Policy,
    PredictivePolicy,
    ReactivePolicy,
    StaticPolicy,
)
from bubblecast.policy.run_data import RunData, load_run
from bubblecast.policy.speeds import model_dataset_config, model_forecaster
from bubblecast.policy.state import PolicyState, RunContext
from bubblecast.policy.work_eval import (
    NO_DOCUMENTS,
    evaluate_work_run,
    is_document_run,
    work_aggregate,
)
from bubblecast.policy.work_policies import WORK_ONLY
from bubblecast.telemetry.events import Events

#: Every policy name policy-eval knows (partition policies, then the work planners').
KNOWN: tuple[str, ...] = (*POLICIES, *WORK_ONLY)

REQUIRED_KEYS: tuple[str, ...] = ("step_s", "bubble_fraction", "speedup_vs_static",
                                  "oracle_share", "actions", "migration_s")
#: Values of ``EvalConfig.fallback`` (``--fallback``): what forecasts where the model cannot.
FALLBACKS: tuple[str, ...] = ("trend",)
BUILTIN_FORECASTER = ("built-in robust trend extrapolation (running-median smoothing, last "
                      "linear segment by BIC segmentation, damped slope, level-shift reset, "
                      "MAD quantiles)")


@dataclass
class EvalConfig:
    """How to evaluate.

    ``migration``: cost-model constants (e.g. :meth:`MigrationConstants.from_json` of what the
    runtime measured); ``param_bytes``: parameter bytes per layer, used when the run's workload
    gives none (or always, with ``override_bytes``); ``layers_per_stage``: layers assumed per
    stage for logged runs that say nothing about layers; ``policy_params``: keyword overrides
    per policy name (e.g. ``{"predictive": {"horizon": 64}}``); ``min_oracle_gain``: an oracle
    gain below this fraction of the static step time makes ``oracle_share`` undefined (null);
    ``memory_cap``: bytes a rank may hold, checked by every policy's solver against per-layer
    parameters plus optimizer state plus activations of ``stages`` microbatches in flight (what
    1F1B keeps on its first stage; a bound for the others); ``migration_from_runs``: a run
    whose metadata records measured migrations (the runtime's ``actions``) uses constants
    fitted to them instead of ``migration``; ``cost_model``: the ``balance`` policy's learned
    cost model (a model directory, a ``models:/`` URI or a loaded model; None fits one online);
    ``fallback``: ``"trend"`` evaluates a run the trained model cannot forecast with the
    built-in trend forecaster (reported), None refuses it (BubblecastError naming the input);
    ``optimum_s``: on packed-document runs of one replica, also solve each step's best plan
    exactly (MILP) within this many seconds a step (``optimum_step_s``, ``optimum_best_s``).
    """

    migration: MigrationConstants = field(default_factory=MigrationConstants)
    param_bytes: float = 0.0
    override_bytes: bool = False
    layers_per_stage: int = 8
    policy_params: dict[str, dict[str, Any]] = field(default_factory=dict)
    min_oracle_gain: float = 0.002
    memory_cap: float | None = None
    migration_from_runs: bool = True
    cost_model: Any = None
    fallback: str | None = None
    optimum_s: float | None = None

    def __post_init__(self) -> None:
        if self.optimum_s is not None and not (np.isfinite(self.optimum_s)
                                               and self.optimum_s > 0):
            raise BubblecastError(f"--optimum: seconds per step must be > 0, got "
                                  f"{self.optimum_s}")
        if self.fallback is not None and self.fallback not in FALLBACKS:
            raise BubblecastError(f"--fallback: unknown forecaster '{self.fallback}' (known: "
                                  f"{', '.join(FALLBACKS)})")
        if not (np.isfinite(self.param_bytes) and self.param_bytes >= 0):
            raise BubblecastError(f"param_bytes: must be >= 0, got {self.param_bytes}")
        if self.memory_cap is not None and not self.memory_cap > 0:
            raise BubblecastError(f"memory_cap: must be > 0 bytes, got {self.memory_cap}")
        if self.layers_per_stage < 1:
            raise BubblecastError(f"layers_per_stage: must be >= 1, got {self.layers_per_stage}")
        unknown = [k for k in self.policy_params if k not in KNOWN]
        if unknown:
            raise BubblecastError(f"policy_params: unknown policy '{unknown[0]}'")


@dataclass
class PolicyTrace:
    """One policy on one run: per-step partitions, pauses and times, and the decisions that
    acted, as the policy returned them."""

    name: str
    partitions: np.ndarray  # (T, V)
    pause_s: np.ndarray  # (T,)
    step_s: np.ndarray  # (T,) including the pause
    idle_s: np.ndarray
    cells_s: np.ndarray
    decisions: list[tuple[int, Decision]]  # (step index it applies from, the decision)
    guard: dict[str, Any] | None = None  # the predictive policy's forecast-guard counts

    @property
    def actions(self) -> list[tuple[int, dict[str, Any]]]:
        """``(step index it applies from, action JSON)`` of each decision that acted."""
        return [(at, d.to_json()["action"]) for at, d in self.decisions]

    def summary(self) -> dict[str, Any]:
        cells = float(self.cells_s.sum())
        out = {"step_s": float(self.step_s.mean()),
               "bubble_fraction": float(self.idle_s.sum() / cells) if cells > 0 else 0.0,
               "actions": len(self.actions), "migration_s": float(self.pause_s.sum())}
        if self.guard is not None:
            out["guard"] = self.guard
        return out


def migration_model(run: RunData, config: EvalConfig) -> tuple[MigrationCost, str]:
    """The run's migration-cost model and where its constants come from."""
    pb = run.param_bytes
    if config.override_bytes or not np.any(pb > 0):
        pb = np.full(len(run.costs), float(config.param_bytes))
    constants, source = config.migration, "configured"
    if config.migration_from_runs:
        measured = run_constants(run.extra, config.migration)
        if measured is not None:
            constants, source = measured, "fitted to the migrations the run records"
    return MigrationCost.for_shape(pb, constants, run.pipeline), source


def layer_memory(run: RunData, migration: MigrationCost) -> np.ndarray:
    """Bytes a layer occupies on its rank: parameters, optimizer state and the activations of
    ``stages`` microbatches in flight."""
    act = np.zeros(len(run.costs)) if run.activation_bytes is None else run.activation_bytes
    return migration.layer_bytes + act * run.pipeline.stages


def run_policy(run: RunData, policy: Policy, migration: MigrationCost,
               memory_cap: float | None = None) -> PolicyTrace:
    """Step ``policy`` through ``run`` and time the partitions it chose."""
    T = len(run.steps)
    memory = layer_memory(run, migration) if memory_cap is not None else None
    history = run.history
    current = tuple(run.initial)
    parts = np.empty((T, len(current)), dtype=np.int64)
    pause = np.zeros(T)
    decisions: list[tuple[int, Decision]] = []
    last: int | None = None

    def state_at(t: int) -> PolicyState:
        return PolicyState(t, history[: t + 1], current, run.costs, run.pipeline, migration, last,
                           memory, memory_cap)

    context = RunContext(T, tuple(run.initial), run.constant, history)
    policy.reset(context, state_at(0))
    for t in range(T):
        parts[t] = current
        if t == T - 1:
            break
        decision = policy.decide(state_at(t))
        action = decision.action
        if isinstance(action, Repartition) and tuple(action.partition) != current:
            new = tuple(action.partition)
            if len(new) != len(current) or sum(new) != len(run.costs):
                raise BubblecastError(f"policy {policy.name}: partition {list(new)} does not "
                                      f"fit {len(current)} stages and {len(run.costs)} layers")
            # The pause the simulated run pays (the policy's migration_s is its prediction).
            pause[t + 1] = migration.seconds(current, new)
            current, last = new, t
            decisions.append((t + 1, decision))
        # SetMicrobatches / SetSchedule are not modelled offline (no policy here emits them).
    out = run.outcome(parts)
    report = getattr(policy, "guard_report", None)
    return PolicyTrace(policy.name, parts, pause, out.step_s + pause, out.idle_s, out.cells_s,
                       decisions, report() if callable(report) else None)


def build_policy(name: str, run: RunData, config: EvalConfig, model: Any | None,
                 events: Events | None) -> tuple[Policy, str | None, str | None]:
    """The policy ``name`` for ``run``; for predictive, a note on its forecaster and, when the
    model could not forecast the run and ``config.fallback`` allowed the trend forecaster,
    why (:func:`~bubblecast.policy.forecasting.model_failed`)."""
    params = dict(config.policy_params.get(name, {}))
    if name == "static":
        return StaticPolicy(), None, None
    if name == "reactive":
        return ReactivePolicy(**params), None, None
    if name == "oracle":
        return OraclePolicy(**params), None, None
    if name != "predictive":
        raise BubblecastError(f"--policies: unknown policy '{name}' (known: {', '.join(POLICIES)})")
    if model is None:
        return PredictivePolicy(forecaster=TrendForecaster(), **params), BUILTIN_FORECASTER, None
    if events is None:
        raise BubblecastError("a trained model needs the run's events to build features")
    try:
        fc = model_forecaster(model, events, run.run_id, run.steps, run.unit)
    except BubblecastError as exc:
        note = model_failed(exc, config, BUILTIN_FORECASTER)
        return PredictivePolicy(forecaster=TrendForecaster(), **params), note, str(exc)
    return PredictivePolicy(forecaster=fc, **params), f"trained model '{fc.name}'", None


def _compare(summary: dict[str, dict[str, Any]], config: EvalConfig) -> None:
    """Add speedup_vs_static and oracle_share to each policy's summary (in place)."""
    static = summary["static"]["step_s"]
    oracle_gain = static - summary["oracle"]["step_s"] if "oracle" in summary else None
    for s in summary.values():
        s["speedup_vs_static"] = static / s["step_s"] if s["step_s"] > 0 else None
        s["gain_vs_static"] = 1.0 - s["step_s"] / static if static > 0 else 0.0
        ok = oracle_gain is not None and oracle_gain > config.min_oracle_gain * static
        s["oracle_share"] = (static - s["step_s"]) / oracle_gain if ok else None


def evaluate_run(run: RunData, names: list[str], config: EvalConfig | None = None,
                 model: Any | None = None, events: Events | None = None
                 ) -> tuple[dict[str, Any], dict[str, PolicyTrace]]:
    """Evaluate ``names`` (static and oracle always run as references) on one run."""
    config = config or EvalConfig()
    migration, source = migration_model(run, config)
    wanted = list(dict.fromkeys(["static", *(n for n in names if n not in WORK_ONLY), "oracle"]))
    traces, notes, fallback = {}, {}, None
    for name in wanted:
        policy, note, failed = build_policy(name, run, config, model, events)
        traces[name] = run_policy(run, policy, migration, config.memory_cap)
        fallback = fallback or failed
        if note:
            notes[name] = note
    summary = {name: traces[name].summary() for name in wanted}
    for name in (n for n in names if n in WORK_ONLY):  # no documents to plan: as static
        summary[name], traces[name] = {**summary["static"], "note": NO_DOCUMENTS}, traces["static"]
    _compare(summary, config)
    oracle_gain = summary["oracle"]["gain_vs_static"]
    report = {"run_id": run.run_id, "mode": run.mode, "note": run.note, "steps": len(run.steps),
              "forecaster": notes.get("predictive"), "fallback": fallback,
              "oracle_gain": oracle_gain if summary["oracle"]["oracle_share"] is not None
              else None,
              "migration": {**migration.constants.to_json(), "source": source},
              "policies": {n: summary[n] for n in names}}
    return report, {n: traces[n] for n in names}


def aggregate(reports: list[dict[str, Any]], names: list[str]) -> dict[str, dict[str, Any]]:
    """Across runs: means of step time, bubble and speed-up; oracle share as the ratio of the
    summed relative gains (runs where the oracle gains nothing add nothing); totals of actions
    and migration seconds."""
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        rows = [r["policies"][name] for r in reports]
        scored = [r for r in reports if r["oracle_gain"] is not None]
        gains = sum(r["policies"][name]["gain_vs_static"] for r in scored)
        oracle = sum(r["oracle_gain"] for r in scored)
        shares = [p["oracle_share"] for p in rows if p["oracle_share"] is not None]
        out[name] = {
            "step_s": float(np.mean([p["step_s"] for p in rows])),
            "bubble_fraction": float(np.mean([p["bubble_fraction"] for p in rows])),
            "speedup_vs_static": float(np.mean([p["speedup_vs_static"] for p in rows])),
            "oracle_share": gains / oracle if oracle > 0 else None,
            "oracle_share_mean": float(np.mean(shares)) if shares else None,
            "actions": int(sum(p["actions"] for p in rows)),
            "migration_s": float(sum(p["migration_s"] for p in rows)),
            "runs": len(rows),
        }
        out[name].update(work_aggregate(rows))
        guards = [p["guard"] for p in rows if "guard" in p]
        if guards:  # the forecast guard's totals: decisions made by the fallback, blocked moves
            out[name]["guard"] = {k: int(sum(g[k] for g in guards)) for k in
                                  ("decisions", "fallback_decisions", "budget_blocked")}
    return out


def covariate_gaps(needed: list[str], events: Events, metrics: pd.DataFrame | None,
                   run_ids: list[str]) -> dict[str, dict[str, list[str]]]:
    """Per run that lacks an input the ``needed`` covariate columns are built from: ``{input:
    [columns]}`` (:func:`bubblecast.dataset.covariates.missing_inputs`)."""
    from bubblecast.dataset.covariates import missing_inputs

    out = {}
    for run_id in run_ids if needed else []:
        rows = None if metrics is None else metrics[metrics["run_id"] == run_id]
        gaps = missing_inputs(needed, rows, {run_id: events.runs[run_id]})
        if gaps:
            out[run_id] = gaps
    return out


def gap_message(model: Any, gaps: dict[str, dict[str, list[str]]],
                metrics: pd.DataFrame | None) -> str:
    """One line naming the first missing input and the runs that lack it."""
    source, columns = next(iter(next(iter(gaps.values())).items()))
    runs = [r for r, g in gaps.items() if source in g]
    shown = ", ".join(runs[:5]) + (f" and {len(runs) - 5} more" if len(runs) > 5 else "")
    what = f"--model ({getattr(model, 'kind', 'model')}) needs"
    if source.startswith("calendar:"):
        kind = source.split(":", 1)[1]
        return (f"{what} the run calendar's '{kind}' ({columns[0]}); run(s) {shown} have no "
                f"'{kind}_every' calendar in their metadata")
    have = set() if metrics is None else set(metrics["run_id"].astype(str))
    lack = "no device metrics" if not have & set(runs) else f"no '{source}' device metric"
    return f"{what} device metric '{source}' ({columns[0]}); run(s) {shown} have {lack}"


def run_models(model: Any | None, events: Events, metrics: pd.DataFrame | None,
               run_ids: list[str], config: EvalConfig) -> dict[str, Any]:
    """The model each run is forecast with: bound to the run's device metrics when it reads
    covariates (:class:`WithDeviceMetrics`). A run lacking one of its inputs is refused in one
    line (:func:`gap_message`), or, with ``config.fallback``, left to
    :func:`~bubblecast.policy.forecasting.model_failed` (its features lack the columns)."""
    if model is None:
        return {r: None for r in run_ids}
    from bubblecast.dataset.covariates import covariate_columns, covariate_input
    from bubblecast.dataset.online_frame import model_columns

    needed = covariate_columns(sorted(model_columns(model)))
    trained = model_dataset_config(model, [int(h) for h in getattr(model, "horizons_", [1])])
    gaps = covariate_gaps(needed, events, metrics, run_ids)
    if gaps and config.fallback is None:
        raise BubblecastError(f"{gap_message(model, gaps, metrics)} (--fallback trend evaluates "
                              "them with the built-in forecaster instead)")
    reads = any(not str(covariate_input(c)).startswith("calendar:") for c in needed)
    out = {}
    for run_id in run_ids:
        rows = None if metrics is None or not reads else metrics[metrics["run_id"] == run_id]
        missing = gap_message(model, {run_id: gaps[run_id]}, rows) if run_id in gaps else None
        if missing is None and (rows is None or rows.empty):
            out[run_id] = model
            continue
        one = events.run(run_id) if len(events.run_ids) > 1 else events
        out[run_id] = WithDeviceMetrics(model, one.frame, rows, trained, missing)
    return out


def evaluate_events(events: Events, names: list[str], config: EvalConfig | None = None,
                    model: Any | None = None, run_ids: list[str] | None = None,
                    metrics: pd.DataFrame | None = None
                    ) -> tuple[dict[str, Any], dict[str, dict[str, PolicyTrace]]]:
    """The ``policy-eval`` report over the runs of ``events`` and the per-run traces;
    ``metrics``: the runs' ``device_metrics`` rows, for a model that reads covariates."""
    config = config or EvalConfig()
    bad = [n for n in names if n not in KNOWN]
    if bad:
        raise BubblecastError(f"--policies: unknown policy '{bad[0]}' (known: "
                              f"{', '.join(KNOWN)})")
    if not names:
        raise BubblecastError("--policies: name at least one policy")
    if metrics is not None:
        metrics = metrics.assign(run_id=metrics["run_id"].astype(str))
    wanted = list(run_ids or events.run_ids)
    models = run_models(model, events, metrics, wanted, config)
    reports, traces = [], {}
    for run_id in wanted:
        if is_document_run(events, run_id):
            report, tr = evaluate_work_run(events, run_id, names, config, models[run_id],
                                           _compare)
        else:
            run = load_run(events, run_id, config.layers_per_stage)
            report, tr = evaluate_run(run, names, config, models[run_id], events)
        reports.append(report)
        traces[run_id] = tr
    return combine(reports, names, config), traces


def combine(reports: list[dict[str, Any]], names: list[str], config: EvalConfig
            ) -> dict[str, Any]:
    """The ``policy-eval`` report from the per-run reports (runs evaluated anywhere)."""
    modes = sorted({r["mode"] for r in reports})
    notes = list(dict.fromkeys(r["note"] for r in reports))
    fc = next((r["forecaster"] for r in reports if r["forecaster"]), None)
    failed = {r["run_id"]: r["fallback"] for r in reports if r.get("fallback")}
    if failed:  # the model is not what forecast those runs: say so where the forecaster is named
        fc = next(r["forecaster"] for r in reports if r.get("fallback"))
    fallback = {"forecaster": config.fallback, "runs": failed} if failed else None
    result = {"mode": modes[0] if len(modes) == 1 else "mixed", "note": " | ".join(notes),
              "forecaster": fc, "fallback": fallback, "migration": config.migration.to_json(),
              "policies": aggregate(reports, names),
              "runs": {r["run_id"]: r for r in reports}}
    return result


@functools.lru_cache(maxsize=4)
def _model(source: str) -> Any:
    from bubblecast.forecast.modeldir import load_model

    return load_model(source)


def evaluate_unit(unit: Any, format: str, names: list[str], config: EvalConfig,
                  model: str | None, run_ids: list[str] | None = None, skip_bad: bool = False
                  ) -> dict[str, Any]:
    """One unit of a fleet ``policy-eval`` (a fleet run, or a file), on any worker: its runs'
    reports and traces (``model``, a model directory or URI, is loaded once per process)."""
    from bubblecast.telemetry.importers import load_events, require_per_op, timing_of
    from bubblecast.telemetry.metrics import read_metrics

    try:
        events = load_events(unit.path, format)
    except BubblecastError as exc:
        if not skip_bad:
            where = f"run '{unit.run_id}': " if unit.run_id is not None else ""
            raise BubblecastError(f"{where}{exc}") from None
        return {"skipped": [{"run_id": unit.run_id, "path": str(unit.path), "error": str(exc)}],
                "reports": [], "traces": {}, "run_ids": []}
    require_per_op(events, "policy-eval", unit.source or unit.path)
    out = {"skipped": [], "run_ids": events.run_ids, "timing": timing_of(events),
           "reports": [], "traces": {}}
    wanted = [r for r in events.run_ids if run_ids is None or r in run_ids]
    if wanted:
        fc = _model(model) if model is not None and {"predictive", "balance"} & set(names) \
            else None
        metrics = read_metrics(unit.path) if fc is not None else None
        result, out["traces"] = evaluate_events(events, names, config, fc, run_ids=wanted,
                                                metrics=metrics)
        out["reports"] = list(result["runs"].values())
    return out


def plot_traces(traces: dict[str, dict[str, PolicyTrace]], path: str | Path,
                max_runs: int = 6) -> Path:
    """Step time over steps per policy, one panel per run, actions marked; written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bubblecast.telemetry.io import atomic_write

    runs = list(traces)[:max_runs]
    if not runs:
        raise BubblecastError("--plot: no runs to plot")
    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 2.8 * len(runs)), squeeze=False)
    colors = {"static": "0.45", "reactive": "tab:orange", "predictive": "tab:blue",
              "oracle": "tab:green"}
    for ax, run_id in zip(axes[:, 0], runs, strict=True):
        for name, tr in traces[run_id].items():
            x = np.arange(len(tr.step_s))
            ax.plot(x, tr.step_s, lw=0.9, label=name, color=colors.get(name))
            if tr.actions:
                at = np.array([a[0] for a in tr.actions])
                ax.scatter(at, tr.step_s[at], marker="v", s=28, color=colors.get(name),
                           zorder=3)
        ax.set_title(f"{run_id}  (markers: repartitions)", fontsize=9)
        ax.set_ylabel("step time (s)")
        ax.legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("step")
    fig.tight_layout()
    target = Path(path)

    def write(tmp: str) -> None:
        fig.savefig(tmp, dpi=110, format=target.suffix.lstrip(".") or "png")

    try:
        return atomic_write(target, write)
    finally:
        plt.close(fig)
