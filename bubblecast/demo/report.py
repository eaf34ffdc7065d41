"""The demo report: Markdown with the run's figures (PNG files in the stage folders).

Every number and figure comes from the stage records of the run that writes the report
(``<stage>/stage.json``); nothing is hard-coded. Written atomically to ``<out>/report.md``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from bubblecast.demo.config import DemoConfig


def _fmt(value: Any, spec: str = ".4g") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "nan" if value != value else format(value, spec)
    return str(value)


def _table(headers: Sequence[str], rows: Iterable[Sequence[Any]], spec: str = ".4g") -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for row in rows:
        lines.append("| " + " | ".join(_fmt(v, spec) for v in row) + " |")
    return "\n".join(lines)


def _pct(value: Any) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _stages(result: Any, titles: dict[str, str]) -> str:
    rows = [(titles.get(name, name), "reused" if name in result.reused else
             f"{rec.get('seconds', 0.0):.1f} s",
             rec.get("result", {}).get("skipped") or rec.get("result", {}).get("note") or "")
            for name, rec in result.records.items()]
    return _table(["stage", "time", "note"], rows)


def _simulate(r: dict[str, Any], config: DemoConfig) -> str:
    rows = [(s, v["runs"], _pct(v["bubble_fraction"])) for s, v in r["scenarios"].items()]
    return "\n\n".join([
        "## 1. Simulated scenario suite",
        f"{r['runs']['train']} training runs and {r['runs']['heldout']} held-out runs (other "
        f"seeds) of {r['steps']} steps, cycling 1F1B, ZB-H1 and interleaved 1F1B pipelines "
        f"of 4 stages and 8 microbatches (`bubblecast simulate`). Events: `{r['train']}/`, "
        f"`{r['heldout']}/` (one Parquet file per run).",
        _table(["scenario", "runs", "mean bubble fraction"], rows),
        f"![scenarios]({r['figure']})",
        "*Each stage's delay signal (compute seconds per unit of work, the forecasting target) "
        "over one run per scenario.*"])


def _dataset(r: dict[str, Any]) -> str:
    rows = [(s, r[s]["rows"], r[s]["runs"], r[s]["features"], r[s]["fingerprint"])
            for s in ("train", "heldout")]
    return "\n\n".join([
        "## 2. Dataset",
        f"One row per (run, replica, stage, step) with at least {r['windows'][-1]} steps of "
        f"history; targets at horizons {r['horizons']} steps (`bubblecast dataset`).",
        _table(["split", "rows", "runs", "features", "fingerprint"], rows)])


def _train(r: dict[str, Any]) -> str:
    rows = []
    for kind, m in r["models"].items():
        for h, v in m["metrics"].items():
            rows.append((kind, h, v["n"], v["mae"], v["coverage_80"], v["skill"], v["baseline"]))
    parts = ["## 3. Forecasters: training",
             "Both models train on the training suite (`bubblecast train`); the metrics below "
             "are on the runs that `train` held out of it.",
             _table(["model", "horizon", "rows", "MAE", "p10-p90 coverage", "skill",
                     "best baseline"], rows),
             f"Champion (higher mean skill): **{r['champion']}**."]
    if r.get("tracked"):
        uris = ", ".join(f"`{m['uri']}` (run `{m['mlflow_run_id']}`)"
                         for m in r["models"].values())
        parts.append(f"Logged and registered in the local MLflow store `{r['tracking_uri']}` "
                     f"as {uris}; alias `{r['champion_uri']}`.")
    else:
        parts.append("MLflow tracking was off in this configuration.")
    return "\n\n".join(parts)


def _forecast_eval(r: dict[str, Any]) -> str:
    rows = [(x["model"], x["horizon"], x["n"], x["mae"], x["coverage_80"], x["skill"],
             x["best_baseline"]) for x in r["table"]]
    parts = ["## 4. Forecasters: held-out suite",
             f"`bubblecast evaluate` on the held-out suite (models loaded from "
             f"{', '.join(f'`{v}`' for v in r['models'].values())}). Skill is "
             "1 - MAE / MAE(best baseline at that horizon) on the same rows; coverage is the "
             "share of actual values inside the p10-p90 interval (nominal 0.8). Best baseline "
             f"overall: `{r['baseline']}`.",
             _table(["model", "horizon", "rows", "MAE", "p10-p90 coverage", "skill",
                     "best baseline"], rows),
             f"![skill]({r['figure']})"]
    if r.get("bubbles"):
        parts.append("Bubble fraction at step t+h, replayed through the schedule with the "
                     "forecast stage times against the actual ones:")
        parts.append(_table(["model", "horizon", "rows", "MAE", "mean predicted",
                             "mean actual"],
                            [(b["model"], b["horizon"], b["n"], b["mae"], b["predicted"],
                              b["actual"]) for b in r["bubbles"]]))
    parts += [f"![{m}]({p})" for m, p in r["forecast_figures"].items()]
    return "\n\n".join(parts)


def _policy_eval(r: dict[str, Any]) -> str:
    rows = [(n, p["step_s"] * 1e3, _pct(p["bubble_fraction"]), p["speedup_vs_static"],
             _pct(p["oracle_share"]), p["actions"], p["migration_s"])
            for n, p in r["policies"].items()]
    return "\n\n".join([
        "## 5. Policies, evaluated offline",
        f"`bubblecast policy-eval` on {r['runs']} held-out runs: each run replayed step by "
        "step under each policy, repartitions paying the migration pause; the predictive "
        f"policy forecasts with the champion model (`{r['model']}`). Oracle share: the part "
        "of the oracle's gain over static a policy captures.",
        _table(["policy", "mean step (ms)", "bubble", "speed-up vs static", "oracle share",
                "actions", "migration (s)"], rows),
        f"![policies]({r['figure']})",
        "*Step time per step on the held-out runs where the oracle gains most; markers are "
        "repartitions.*"])


def _megatron(r: dict[str, Any]) -> str:
    if r.get("skipped"):
        return f"## 6. Real Megatron-LM trace\n\nSkipped: {r['skipped']}."
    i, w = r["inspect"], r["whatif"]
    ref = r.get("reference") or {}
    head = ["scenario", "mean step (s)", "speed-up"] + (["authors' simulator (s)"] if ref
                                                        else [])
    rows = [["replayed", w["replayed_step_s"], 1.0] + ([ref.get("replayed_step_s")] if ref
                                                        else [])]
    for name, s in w["scenarios"].items():
        rows.append([name, s["step_s"], s["speedup"]] + ([ref.get(name)] if ref else []))
    stages = [(s["stage"], s["busy_s"], s["idle_s"], _pct(s["bubble_fraction"]))
              for s in i["per_stage"]]
    return "\n\n".join([
        "## 6. Real Megatron-LM trace",
        f"`bubblecast inspect` / `whatif` on `{r['trace']}` ({i['steps']} steps, "
        f"{i['stages']} stages x {i['replicas']} replicas). Bubble fraction "
        f"{_pct(i['bubble_fraction'])} (structural {_pct(i['structural_bubble_fraction'])}, "
        f"dynamic {_pct(i['dynamic_bubble_fraction'])}); median step "
        f"{i['step_time_s']['median']:.3f} s; bottleneck stage {i['bottleneck_stage']}; "
        f"slow ranks: {i['slow_ranks'] or 'none'}.",
        _table(["stage", "busy (s)", "idle (s)", "bubble"], stages),
        f"Replay of the observed order: mean {w['replayed_step_s']:.3f} s against "
        f"{w['observed_step_s']:.3f} s observed (median per-step error "
        f"{_pct(w['replay_error'])}). What-if answers"
        + (f" (last column: the trace authors' own numbers from `{ref['source']}`)" if ref
           else "") + ":",
        _table(head, rows),
        f"![megatron]({r['figure']})"])


def _live(r: dict[str, Any]) -> str:
    if r.get("skipped"):
        return f"## 7. Live closed loop\n\nSkipped: {r['skipped']}."
    lo, hi = r["slowed"]
    rows = [(n, p["mean_step_s"] * 1e3, p["slowed_step_s"] * 1e3, p["slowed_steps_per_s"],
             p.get("speedup_vs_static"), p["actions_taken"], p["first_action_step"],
             p["final_partition"], p["control_pct_of_wall"])
            for n, p in r["policies"].items()]
    parts = ["## 7. Live closed loop on CPU",
             f"A {r['stages']}-process CPU pipeline (gloo, 1F1B) trains an MLP of {r['layers']} "
             f"equal layers for {r['steps']} steps while the last rank is slowed "
             f"(`{r['inject']}`, emulated). Throughput is measured over steps {lo}-{hi}, "
             "where the slowdown is at full strength"
             + (f"; the best integer repartition would make that period "
                f"{r['ideal_speedup']:.2f}x faster than static if compute set the pace."
                if r.get("ideal_speedup") else ".")]
    if r.get("note"):
        parts.append(f"**Note:** {r['note']}.")
    ideal = r.get("ideal_speedup")
    beyond = [n for n, p in r["policies"].items()
              if ideal and (p.get("speedup_vs_static") or 0) > ideal * 1.02]
    if beyond:
        parts.append(f"**Caution:** {', '.join(beyond)} beat the {ideal:.2f}x that compute "
                     "alone allows, so part of that speed-up is machine load that changed "
                     "between the runs (they run one after another); read it as noise, not gain.")
    if r.get("model"):
        parts.append(f"The predictive policy forecasts with the champion model `{r['model']}`.")
    parts += [_table(["policy", "mean step (ms)", "slowed step (ms)", "slowed steps/s",
                      "speed-up vs static", "actions", "first action step", "final partition",
                      "control overhead %"], rows),
              f"![live]({r['figure']})"]
    return "\n\n".join(parts)


def render(result: Any, config: DemoConfig, command: str | None = None) -> str:
    """The report's Markdown."""
    from bubblecast.demo.run import STAGES

    titles = {name: title for name, title, _ in STAGES}
    rec = {k: v.get("result", {}) for k, v in result.records.items()}
    origin = ("Every number and figure below comes from this run" if not result.reused else
              "Every number and figure below comes from this run, those of the stages marked "
              "reused from the earlier run that finished them with the same settings")
    parts = ["# bubblecast demo report",
             f"Made by `{command or 'bubblecast demo'}` (seed {config.seed}) in "
             f"{result.seconds:.0f} s. {origin}; the stage folders hold the files behind "
             "them, `demo.json` all the numbers.",
             _stages(result, titles),
             _simulate(rec["simulate"], config), _dataset(rec["dataset"]), _train(rec["train"]),
             _forecast_eval(rec["forecast_eval"]), _policy_eval(rec["policy_eval"]),
             _megatron(rec["megatron"]), _live(rec["live"])]
    tail = ["## Next steps"]
    if result.mlflow_ui:
        tail.append(f"Open the MLflow UI on this run's store:\n\n```bash\n{result.mlflow_ui}\n"
                    "```")
    tail.append(f"Serve the champion forecaster:\n\n```bash\n{result.serve}\n```")
    return "\n\n".join(parts + ["\n\n".join(tail)]) + "\n"


def write_report(result: Any, config: DemoConfig, command: str | None = None) -> None:
    from bubblecast.telemetry.io import atomic_write_text

    atomic_write_text(result.report, render(result, config, command))
