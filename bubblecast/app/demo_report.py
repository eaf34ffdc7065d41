"""The demo's report: ``report.md`` from ``demo.json``, the demo's own figures, strict JSON.

Every number and figure in the report comes from the stage records of the run that writes it;
nothing is hard-coded. The closing section lists every figure with the command or function
that produced it. matplotlib is imported lazily (Agg backend); files are written atomically.
This module never imports :mod:`bubblecast.app.demo` (the report reads the demo's JSON only).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bubblecast.telemetry.jsonclean import plain

# ---------------------------------------------------------------------------- JSON


def dumps(obj: Any) -> str:
    """Strict, indented JSON of ``obj`` (see :func:`plain`)."""
    return json.dumps(plain(obj), indent=1, allow_nan=False)


# ------------------------------------------------- the figures a seed fixes; live-stage windows


def figures(stages: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The forecasting and policy figures of a run (``demo.json``'s ``stages``): what must
    repeat for the same seed."""
    fc, pol, train = stages["forecast_eval"], stages["policy_eval"], stages["train"]
    return {"train": {k: m["metrics"] for k, m in train["models"].items()},
            "forecast_eval": {"table": fc["table"], "baseline": fc["baseline"],
                              "skill_per_scenario": fc["skill_per_scenario"]},
            "policy_eval": {"policies": pol["policies"],
                            "speedup_per_run": pol["speedup_per_run"]}}


def slowed_steps(config: Any) -> tuple[int, int]:
    """[first, last) steps during which the injected slowdown of a ``DemoConfig`` is at full
    strength."""
    from bubblecast.runtime.inject import parse_inject

    slow = [i for i in parse_inject(config.live_inject) if i.kind == "slowdown"]
    if not slow:
        return 0, config.live_steps
    last = min(config.live_steps, *(i.end or config.live_steps for i in slow))
    return min(min(i.start + i.ramp for i in slow), last), last


def ideal_speedup(config: Any) -> float:
    """Best speed-up over static a repartition gives at full slowdown if compute set the pace:
    static's slowest rank against the best integer split of the layers."""
    from bubblecast.runtime.inject import parse_inject

    f = np.ones(2)
    for i in parse_inject(config.live_inject):
        f[i.rank] *= i.factor if i.kind == "slowdown" else 1.0
    n, even = config.live_layers, config.live_layers // 2
    best = min(max(f[0] * k, f[1] * (n - k)) for k in range(1, n))
    return float(max(f[0] * even, f[1] * (n - even)) / best)


# ---------------------------------------------------------------------------- plots


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: str | Path) -> Path:
    from bubblecast.telemetry.io import atomic_write

    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        return atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100))
    finally:
        _pyplot().close(fig)


def plot_scenarios(examples: dict[str, Any], path: str | Path) -> Path:
    """One panel per scenario: each stage's delay signal (compute seconds per unit of work,
    the forecasting target) over the steps of one example run (:class:`Events`)."""
    from bubblecast.dataset import step_series

    plt = _pyplot()
    cols = min(3, max(1, len(examples)))
    rows = (len(examples) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 2.6 * rows), squeeze=False)
    for ax, (name, events) in zip(axes.ravel(), examples.items(), strict=False):
        series = step_series(events)
        base = float(np.median(series["y"]))
        for stage, part in series[series["replica"] == 0].groupby("stage"):
            ax.plot(part["step"], part["y"] / base, lw=0.8, label=f"stage {stage}")
        ax.set_title(f"{name}  ({series['run_id'].iloc[0]})", fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.set_ylabel("delay / median", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in axes.ravel()[len(examples):]:
        ax.axis("off")
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, path)


def plot_skill(table: Any, models: list[str], baselines: list[str], path: str | Path) -> Path:
    """Held-out MAE skill against the best baseline, and p10-p90 coverage, per horizon."""
    plt = _pyplot()
    overall = table[table["scenario"] == "all"]
    learnt = [m for m in models if m not in baselines]
    fig, (ax_s, ax_c) = plt.subplots(1, 2, figsize=(10, 3.4))
    width = 0.8 / max(1, len(learnt))
    horizons = sorted(overall["horizon"].unique())
    x = np.arange(len(horizons))
    for k, model in enumerate(learnt):
        sub = overall[overall["model"] == model].set_index("horizon").reindex(horizons)
        ax_s.bar(x + k * width, sub["skill"], width, label=model)
        ax_c.plot(horizons, sub["coverage_80"], marker="o", label=model)
    ax_s.axhline(0, color="0.3", lw=0.8)
    ax_s.set_xticks(x + width * (len(learnt) - 1) / 2, [f"h={h}" for h in horizons])
    ax_s.set_ylabel("skill = 1 - MAE / MAE(best baseline)")
    ax_s.set_title("held-out skill per horizon", fontsize=10)
    ax_c.axhline(0.8, color="0.3", lw=0.8, ls="--", label="nominal 0.8")
    ax_c.set_ylim(0, 1.05)
    ax_c.set_xlabel("horizon (steps)")
    ax_c.set_ylabel("p10-p90 coverage")
    ax_c.set_title("interval coverage on held-out runs", fontsize=10)
    for ax in (ax_s, ax_c):
        ax.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, path)


def plot_live(series: dict[str, np.ndarray], slowed: tuple[int, int], path: str | Path,
              inject: str, smooth: int = 5) -> Path:
    """Step time per step for each policy of the live run (raw, and a centred rolling mean of
    ``smooth`` steps); the full-strength slowdown shaded."""
    plt = _pyplot()
    colors = {"static": "0.45", "reactive": "tab:orange", "predictive": "tab:blue"}
    fig, ax = plt.subplots(figsize=(10, 3.4))
    kernel = np.ones(smooth)
    for name, times in series.items():
        x, color = np.arange(len(times)), colors.get(name)
        mean = times if len(times) < smooth else (
            np.convolve(times, kernel, "same") / np.convolve(np.ones(len(times)), kernel, "same"))
        ax.plot(x, 1e3 * times, lw=0.4, alpha=0.35, color=color)
        ax.plot(x, 1e3 * mean, lw=1.3, color=color,
                label=f"{name} (mean {1e3 * times.mean():.1f} ms)")
    if slowed[1] > slowed[0]:
        ax.axvspan(*slowed, color="tab:red", alpha=0.07, label="slowdown at full strength")
    ax.set_xlabel("step")
    ax.set_ylabel("step time (ms)")
    ax.set_title(f"live 2-process CPU pipeline, injected slowdown {inject}", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, path)


# ---------------------------------------------------------------------------- Markdown


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "nan" if value != value else format(value, ".4g")
    return str(value)


def _table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _pct(value: Any) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _img(r: dict[str, Any]) -> list[str]:
    return [f"![{Path(p).stem}]({p})" for p in r.get("figures", {})]


def _simulate(r: dict[str, Any]) -> list[str]:
    rows = [(s, v["runs"], _pct(v["bubble_fraction"])) for s, v in r["scenarios"].items()]
    return [f"{r['runs']['train']} training runs and {r['runs']['heldout']} held-out runs "
            f"(other seeds) of {r['steps']} steps, cycling 1F1B, ZB-H1 and interleaved 1F1B "
            "pipelines of 4 stages and 8 microbatches (`bubblecast simulate`; the suite of "
            f"`bubblecast.forecast.suite`). Events: {', '.join(f'`{f}`' for f in r['files'])}.",
            _table(["scenario", "runs", "mean bubble fraction"], rows), *_img(r),
            "*Each stage's delay signal (compute seconds per unit of work, the forecasting "
            "target) over one training run per scenario.*"]


def _dataset(r: dict[str, Any]) -> list[str]:
    rows = [(s, r[s]["rows"], r[s]["runs"], r[s]["features"], r[s]["fingerprint"])
            for s in ("train", "heldout")]
    return [f"One row per (run, replica, stage, step) with at least {r['windows'][-1]} steps "
            f"of history; targets at horizons {r['horizons']} steps (`bubblecast dataset`).",
            _table(["split", "rows", "runs", "features", "fingerprint"], rows)]


def _train(r: dict[str, Any]) -> list[str]:
    rows = [(kind, h, v["n"], v["mae"], v["coverage_80"], v["skill"], v["baseline"])
            for kind, m in r["models"].items() for h, v in m["metrics"].items()]
    parts = ["LightGBM and the GRU sequence model train on the training suite "
             "(`bubblecast train`); the metrics below are on the runs `train` held out of it.",
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
    return parts


def _forecast_eval(r: dict[str, Any]) -> list[str]:
    rows = [(x["model"], x["horizon"], x["n"], x["mae"], x["coverage_80"], x["skill"],
             x["best_baseline"]) for x in r["table"]]
    parts = [f"`bubblecast evaluate` on the held-out suite (models loaded from "
             f"{', '.join(f'`{v}`' for v in r['models'].values())}). Skill is 1 - MAE / "
             "MAE(best baseline at that horizon) on the same rows; coverage is the share of "
             "actual values inside the p10-p90 interval (nominal 0.8). Best baseline overall: "
             f"`{r['baseline']}`.",
             _table(["model", "horizon", "rows", "MAE", "p10-p90 coverage", "skill",
                     "best baseline"], rows)]
    if r.get("bubbles"):
        parts += ["Bubble fraction at step t+h, replayed through the schedule with the "
                  "forecast stage times against the actual ones:",
                  _table(["model", "horizon", "rows", "MAE", "mean predicted", "mean actual"],
                         [(b["model"], b["horizon"], b["n"], b["mae"], b["predicted"],
                           b["actual"]) for b in r["bubbles"]])]
    return parts + _img(r)


def _policy_eval(r: dict[str, Any]) -> list[str]:
    rows = [(n, p["step_s"] * 1e3, _pct(p["bubble_fraction"]), p["speedup_vs_static"],
             _pct(p["oracle_share"]), p["actions"], p["migration_s"])
            for n, p in r["policies"].items()]
    return [f"`evaluate_policies` (`bubblecast policy-eval`) on {r['runs']} held-out runs: "
            "each run replayed step by step under each policy, repartitions paying the "
            "migration pause; the predictive policy forecasts with the champion model "
            f"(`{r['model']}`). Oracle share: the part of the oracle's gain over static a "
            "policy captures.",
            _table(["policy", "mean step (ms)", "bubble", "speed-up vs static",
                    "oracle share", "actions", "migration (s)"], rows), *_img(r),
            "*Step time per step under each policy, one panel per held-out run (the first "
            "six); markers are repartitions.*"]


def reference(trace: str | Path) -> dict[str, Any] | None:
    """The trace authors' own what-if numbers (``ms-ST.json`` beside the trace), if present."""
    path = Path(trace)
    path = path.with_name(path.name.replace("trace-", "ms-").replace(".parquet", ".json"))
    try:
        doc = json.loads(path.read_text())
        return {"replayed_step_s": float(doc["tori"]), "fix_bottleneck": float(doc["trem"]),
                "ideal": float(doc["tideal"]), "source": path.name}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _megatron(r: dict[str, Any]) -> list[str]:
    i, w, ref = r["inspect"], r["whatif"], r.get("reference") or {}
    rows = [["replayed", w["replayed_step_s"], 1.0] + ([ref["replayed_step_s"]] if ref else [])]
    rows += [[name, s["step_s"], s["speedup"]] + ([ref.get(name)] if ref else [])
             for name, s in w["scenarios"].items() if s is not None]
    stages = [(s["stage"], s["busy_s"], s["idle_s"], _pct(s["bubble_fraction"]))
              for s in i["per_stage"]]
    return [f"`BubbleAnalysis` (`bubblecast inspect` / `whatif`) on `{r['trace']}` "
            f"({i['steps']} steps, {i['stages']} stages x {i['replicas']} replicas). Bubble "
            f"fraction {_pct(i['bubble_fraction'])} (structural "
            f"{_pct(i['structural_bubble_fraction'])}, dynamic "
            f"{_pct(i['dynamic_bubble_fraction'])}); median step "
            f"{i['step_time_s']['median']:.3f} s; bottleneck stage {i['bottleneck_stage']}; "
            f"slow ranks: {i['slow_ranks'] or 'none'}.",
            _table(["stage", "busy (s)", "idle (s)", "bubble"], stages),
            f"Replay of the observed order: mean {w['replayed_step_s']:.3f} s against "
            f"{w['observed_step_s']:.3f} s observed (median per-step error "
            f"{_pct(w['replay_error'])}). What-if answers"
            + (f" (last column: the trace authors' own numbers from `{ref['source']}`)"
               if ref else "") + ":",
            _table(["scenario", "mean step (s)", "speed-up"]
                   + (["authors' simulator (s)"] if ref else []), rows), *_img(r)]


def _live(r: dict[str, Any]) -> list[str]:
    lo, hi = r["slowed"]
    ideal = r["ideal_speedup"]
    rows = [(n, p["mean_step_s"] * 1e3, p["slowed_step_s"] * 1e3, p["slowed_steps_per_s"],
             p.get("speedup_vs_static"), p["actions_taken"], p["first_action_step"],
             p["final_partition"], p["control_pct_of_wall"]) for n, p in r["policies"].items()]
    parts = [f"A {r['stages']}-process CPU pipeline (gloo, 1F1B) trains an MLP of "
             f"{r['layers']} equal layers for {r['steps']} steps while the last rank is slowed "
             f"(`{r['inject']}`, emulated); `bubblecast run --policy` per policy. Throughput "
             f"is measured over steps {lo}-{hi}, where the slowdown is at full strength; the "
             f"best integer repartition would make that period {ideal:.2f}x faster than "
             "static if compute set the pace."]
    beyond = [n for n, p in r["policies"].items()
              if (p.get("speedup_vs_static") or 0) > ideal * 1.02]
    if beyond:
        parts.append(f"**Caution:** {', '.join(beyond)} beat the {ideal:.2f}x that compute "
                     "alone allows, so part of that speed-up is machine load that changed "
                     "between the runs (they run one after another); read it as noise, not gain.")
    if r.get("model"):
        parts.append(f"The predictive policy forecasts with the champion model `{r['model']}`.")
    return parts + [_table(["policy", "mean step (ms)", "slowed step (ms)", "slowed steps/s",
                            "speed-up vs static", "actions", "first action step",
                            "final partition", "control overhead %"], rows), *_img(r)]


def _balanced(r: dict[str, Any]) -> list[str]:
    from bubblecast.app.demo_balance import report_section

    return report_section(r, _table)


SECTIONS = (("simulate", "Simulated scenario suite", _simulate), ("dataset", "Dataset", _dataset),
            ("train", "Forecasters: training", _train),
            ("forecast_eval", "Forecasters: held-out suite", _forecast_eval),
            ("policy_eval", "Policies, evaluated offline", _policy_eval),
            ("megatron", "Real Megatron-LM trace", _megatron),
            ("live", "Live closed loop on CPU", _live),
            ("balanced", "Balanced work live on CPU", _balanced))



def render(doc: dict[str, Any], command: str | None = None) -> str:
    """The report's Markdown from the ``demo.json`` object ``doc``."""
    stages, seconds = doc["stages"], doc["stage_seconds"]
    parts = ["# bubblecast demo report",
             f"Made by `{command or 'bubblecast demo'}` (seed {doc['config']['seed']}) in "
             f"{doc['seconds']:.0f} s. Every number and figure below comes from this run; the "
             "stage folders hold the files behind them, `demo.json` all the numbers.",
             _table(["stage", "time", "note"], [(name, f"{seconds[name]:.1f} s",
                                                 stages[name].get("skipped") or "")
                                                for name in stages])]
    for k, (name, title, section) in enumerate(SECTIONS, start=1):
        r = stages.get(name, {"skipped": "not run (a demo.json from before this stage)"})
        body = [f"Skipped: {r['skipped']}."] if r.get("skipped") else section(r)
        parts.append("\n\n".join([f"## {k}. {title}", *body]))
    made = [(f"`{path}`", by if by.startswith("`") else f"`{by}`") for r in stages.values()
            for path, by in r.get("figures", {}).items()]
    parts.append("## Figures\n\nEvery figure above and what produced it:\n\n"
                 + _table(["figure", "produced by"], made))
    tail = ["## Next steps"]
    if doc.get("mlflow_ui"):
        tail.append(f"Open the MLflow UI on this run's store:\n\n```bash\n{doc['mlflow_ui']}\n"
                    "```")
    tail.append(f"Serve the champion forecaster:\n\n```bash\n{doc['serve']}\n```")
    return "\n\n".join(parts + ["\n\n".join(tail)]) + "\n"


def next_steps(train: dict[str, Any], out: Path) -> dict[str, str | None]:
    """The commands that open the MLflow UI on the demo's store and serve the champion."""
    if not train["tracked"]:
        model = out / train["models"][train["champion"]]["dir"]
        return {"mlflow_ui": None, "serve": f"bubblecast serve --model {model}"}
    uri = train["tracking_uri"]
    return {"mlflow_ui": f"mlflow ui --backend-store-uri {uri}",
            "serve": f"bubblecast serve --model {train['champion_uri']} --tracking-uri {uri}"}


def write_report(doc: dict[str, Any], command: str | None = None) -> Path:
    """Write ``report.md`` into ``doc['out']`` atomically."""
    from bubblecast.telemetry.io import atomic_write_text

    return atomic_write_text(Path(doc["out"]) / "report.md", render(doc, command))
