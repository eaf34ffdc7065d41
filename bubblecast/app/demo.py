"""``bubblecast demo``: the whole journey on embedded defaults, a thin application over the API.

Stages in order, each a function writing into ``<out>/<stage>/`` and returning its JSON-able
record: simulate a scenario suite, build the dataset, train LightGBM and the GRU (registered in
the SQLite MLflow store ``<out>/mlflow.db``), evaluate them and the policies on held-out runs,
analyse the real Megatron-LM trace, run the live closed loop; then ``report.md`` and
``demo.json`` (:mod:`bubblecast.app.demo_report`), written last (the previous ones are removed
first). Every number follows from :class:`DemoConfig` and its seed.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bubblecast.errors import BubblecastError
from bubblecast.forecast.tracking import DEFAULT_EXPERIMENT as EXPERIMENT
from bubblecast.forecast.tracking import DEFAULT_MODEL_NAME as MODEL_NAME

SCENARIOS: tuple[str, ...] = ("throttle", "failslow", "periodic", "seqlen", "mixed", "jitter")
POLICIES: tuple[str, ...] = ("static", "reactive", "predictive", "oracle")
MODELS: tuple[str, ...] = ("lgbm", "seq")
SPLITS: tuple[str, ...] = ("train", "heldout")
#: The real Megatron-LM trace, relative to a sample root (see :func:`sample_path`).
TRACE = Path("data") / "megatron-ops" / "trace-ST.parquet"
#: Where sample files are looked for, in order: the working directory, ``../shared`` beside it,
#: and the copies inside the package (``bubblecast/_bundled``: links to the repository's
#: ``data/megatron-ops`` and ``models/default`` in a checkout, the files themselves in a wheel).
SAMPLE_ROOTS: tuple[Path, ...] = (Path("."), Path("..") / "shared",
                                  Path(__file__).resolve().parents[1] / "_bundled")
REPORT, SUMMARY = "report.md", "demo.json"
LIVE_STAGES, LIVE_MICROBATCHES = 2, 4


def sample_path(relative: str | Path) -> Path | None:
    """The sample file or folder ``relative`` (``data/megatron-ops/trace-ST.parquet``,
    ``models/default``) under the first of :data:`SAMPLE_ROOTS` that has it, absolute; None
    when none has it. The package carries ``data/megatron-ops`` and ``models/default``."""
    found = [root / relative for root in SAMPLE_ROOTS if (root / relative).exists()]
    return found[0].resolve() if found else None


def default_megatron() -> str | None:
    """The Megatron-LM trace (:data:`TRACE` via :func:`sample_path`), or None when none exists."""
    found = sample_path(TRACE)
    return str(found) if found is not None and found.is_file() else None


@dataclass(frozen=True)
class DemoConfig:
    """The demo's workload: ``runs`` / ``heldout_runs`` simulated runs per scenario (different
    seeds) of ``steps`` steps; dataset ``horizons``/``windows``/``lags``; model sizes; the
    ``megatron`` trace (None skips it); ``live``: the 2-process CPU closed loop of
    ``live_steps`` steps of an MLP of ``live_layers`` x ``live_hidden`` under ``live_inject``
    (``collect --inject`` syntax), once per ``live_policies`` (predictive uses the champion);
    ``balanced_steps``: steps of each launch of the balanced-work stage (with ``live``)."""

    seed: int = 0
    scenarios: tuple[str, ...] = SCENARIOS
    runs: int = 5
    heldout_runs: int = 2
    steps: int = 400
    horizons: tuple[int, ...] = (1, 5, 10)
    windows: tuple[int, ...] = (5, 20, 60)
    lags: int = 32
    lgbm_estimators: int = 300
    lgbm_leaves: int = 31
    seq_epochs: int = 12
    seq_hidden: int = 32
    max_train_rows: int = 60_000
    track: bool = True
    policies: tuple[str, ...] = POLICIES
    megatron: str | None = field(default_factory=default_megatron)
    live: bool = True
    live_steps: int = 240
    live_layers: int = 12
    live_hidden: int = 512
    live_inject: str = "rank=1,factor=2.0,start=60,ramp=40,end=220"
    live_policies: tuple[str, ...] = ("static", "predictive")
    balanced_steps: int = 40

    def __post_init__(self) -> None:
        from bubblecast.sim.scenarios import SCENARIOS as KNOWN

        for name in ("scenarios", "horizons", "windows", "policies", "live_policies"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        for name, value in self.to_json().items():
            if type(value) is int and value < (name != "seed"):
                where = "--seed" if name == "seed" else f"demo config: '{name}'"
                raise BubblecastError(f"{where}: must be an integer >= {int(name != 'seed')}, "
                                      f"got {value}")
        for name, values, known in (("scenarios", self.scenarios, KNOWN),
                                    ("policies", self.policies, POLICIES),
                                    ("live_policies", self.live_policies, POLICIES[:3])):
            if not values or not set(values) <= set(known):
                raise BubblecastError(f"demo config: '{name}' must be among "
                                      f"{', '.join(known)}, got {list(values)}")
        if len(self.scenarios) * self.runs < 4:
            raise BubblecastError("demo config: need at least 4 training runs in all "
                                  "(scenarios x runs) to fit and hold out")
        need = self.forecast().dataset_config().min_steps + 2 * max(self.horizons)
        if self.steps < need:
            raise BubblecastError(f"demo config: 'steps' must be at least {need} for windows "
                                  f"{list(self.windows)} and horizons {list(self.horizons)}, "
                                  f"got {self.steps}")

    def forecast(self) -> Any:
        """The :class:`bubblecast.BubbleForecast` of this demo's dataset settings."""
        from bubblecast import BubbleForecast

        return BubbleForecast(horizons=self.horizons, windows=self.windows, lags=self.lags,
                              seed=self.seed)

    def to_json(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


def preset(name: str, **overrides: Any) -> DemoConfig:
    """``default`` (what ``make demo`` runs), ``quick`` (about a third of the time) or ``tiny``
    (seconds per stage, no live loop and no MLflow; for tests)."""
    presets: dict[str, dict[str, Any]] = {
        "default": {},
        "quick": dict(runs=3, heldout_runs=1, steps=240, lgbm_estimators=120, seq_epochs=5,
                      max_train_rows=20_000, live_steps=150, balanced_steps=24,
                      live_inject="rank=1,factor=2.0,start=30,ramp=30,end=140"),
        "tiny": dict(scenarios=("throttle", "failslow", "periodic"), runs=2, heldout_runs=1,
                     steps=60, horizons=(1, 4), windows=(4, 8, 16), lags=8, lgbm_estimators=20,
                     lgbm_leaves=7, seq_epochs=2, seq_hidden=8, max_train_rows=5_000,
                     track=False, live=False, live_steps=30, live_hidden=64, balanced_steps=8,
                     live_inject="rank=1,factor=2.0,start=8,ramp=8")}
    if name not in presets:
        raise BubblecastError(f"unknown demo preset '{name}' (default, quick, tiny)")
    return DemoConfig(**{**presets[name], **overrides})


@dataclass
class Demo:
    """A running demo: config, output folder, stage records so far, events handed on."""

    config: DemoConfig
    out: Path
    records: dict[str, dict[str, Any]] = field(default_factory=dict)
    memo: dict[str, Any] = field(default_factory=dict)

    def dir(self, stage: str) -> Path:
        (self.out / stage).mkdir(parents=True, exist_ok=True)
        return self.out / stage


def simulate(demo: Demo) -> dict[str, Any]:
    """Simulate the training and held-out suites (``forecast.suite``, other seeds)."""
    from bubblecast import write_events
    from bubblecast.app.demo_report import plot_scenarios
    from bubblecast.forecast.suite import SuiteConfig, suite_events
    from bubblecast.sim.accounting import bubble_fraction, rank_step_table

    c, fractions, examples, runs = demo.config, {}, {}, {}
    for k, split in enumerate(SPLITS):
        suite = SuiteConfig(scenarios=c.scenarios, runs=c.runs if k == 0 else c.heldout_runs,
                            steps=c.steps, replicas=1, seed=2 * c.seed + k)
        events = demo.memo[split] = suite_events(suite)
        write_events(events, demo.dir("simulate") / f"{split}.parquet")
        runs[split] = len(events.run_ids)
        for run_id, run in events.by_run():
            scenario = run_id.split(f"-s{suite.seed}-")[0]
            if k == 0:
                examples.setdefault(scenario, run)
            fractions.setdefault(scenario, {})[run_id] = bubble_fraction(
                rank_step_table(run.frame))
    plot_scenarios(examples, demo.out / "simulate" / "scenarios.png")
    return {"runs": runs, "steps": c.steps, "bubble_fraction": fractions,
            "scenarios": {s: {"runs": len(v), "bubble_fraction": float(np.mean(list(v.values())))}
                          for s, v in fractions.items()},
            "files": [f"simulate/{s}.parquet" for s in SPLITS],
            "figures": {"simulate/scenarios.png": "bubblecast.app.demo_report.plot_scenarios"}}


def dataset(demo: Demo) -> dict[str, Any]:
    """Features and targets of both splits (``BubbleForecast.features``: ``bubblecast dataset``)."""
    from bubblecast.dataset import write_features

    out: dict[str, Any] = {"horizons": list(demo.config.horizons),
                           "windows": list(demo.config.windows)}
    for split in SPLITS:
        frame, meta = demo.config.forecast().features(demo.memo[split])
        write_features(frame, meta, demo.dir("dataset") / f"{split}.parquet")
        out[split] = {"rows": len(frame), "runs": len(meta.runs),
                      "fingerprint": meta.fingerprint,
                      "features": sum(c.startswith(("f_", "x")) for c in frame.columns)}
    return out


def train(demo: Demo) -> dict[str, Any]:
    """Train both models as ``bubblecast train`` does (fit, hold out runs, save; log and
    register in the demo's MLflow store); alias the one of higher held-out skill champion."""
    from bubblecast.forecast.tracking import create_experiment
    from bubblecast.forecast.training import train_model

    c, uri = demo.config, f"sqlite:///{(demo.out / 'mlflow.db').as_posix()}"
    uri = uri if c.track else None
    if uri:  # the experiment first, so that its artifacts go to <out>/mlruns
        create_experiment(uri, EXPERIMENT, demo.dir("mlruns"))
    params = {"lgbm": {"n_estimators": c.lgbm_estimators, "num_leaves": c.lgbm_leaves},
              "seq": {"epochs": c.seq_epochs, "hidden": c.seq_hidden}}
    models: dict[str, Any] = {}
    for kind in MODELS:
        r = train_model(demo.out / "dataset" / "train.parquet", kind, demo.dir("train") / kind,
                        params={"seed": c.seed, "max_train_rows": c.max_train_rows,
                                **params[kind]}, holdout=0.2, seed=c.seed, track=c.track,
                        tracking_uri=uri, register=MODEL_NAME if uri else None,
                        alias=kind if uri else None)
        skills = [m["skill"] for m in r["metrics"].values()
                  if m["skill"] is not None and np.isfinite(m["skill"])]
        models[kind] = {"dir": f"train/{kind}", "metrics": r["metrics"], "rows": r["rows"],
                        "skill": float(np.mean(skills)) if skills else None,
                        "mlflow_run_id": r.get("mlflow_run_id"),
                        "uri": r.get("registered", {}).get("uri")}
    champion = max(MODELS, key=lambda k: -np.inf if models[k]["skill"] is None
                   else models[k]["skill"])
    if uri:
        import mlflow

        client = mlflow.MlflowClient(tracking_uri=uri)
        version = client.get_model_version_by_alias(MODEL_NAME, champion).version
        client.set_registered_model_alias(MODEL_NAME, "champion", version)
    return {"models": models, "champion": champion, "tracked": c.track, "tracking_uri": uri,
            "champion_uri": f"models:/{MODEL_NAME}@champion" if uri else None}


def champion_dir(demo: Demo) -> Path:
    """The trained champion's model directory."""
    rec = demo.records["train"]
    return demo.out / rec["models"][rec["champion"]]["dir"]


def forecast_eval(demo: Demo) -> dict[str, Any]:
    """Score both models (from the registry when tracked) and the baselines on the held-out
    suite as ``bubblecast evaluate`` does (per horizon and scenario, plots, logged)."""
    from bubblecast.app.demo_report import plot_skill
    from bubblecast.forecast.evaluation_run import run_evaluation

    c, models = demo.config, demo.records["train"]["models"]
    refs = [m["uri"] or str(demo.out / m["dir"]) for m in models.values()]
    folder = demo.dir("forecast_eval")
    result = run_evaluation(demo.out / "dataset" / "heldout.parquet", refs, seed=c.seed,
                            track=c.track, tracking_uri=demo.records["train"]["tracking_uri"],
                            plot_dir=folder / "forecasts")
    table, learnt = result.table, [m for m in result.models if m not in result.baselines]
    table.to_csv(folder / "evaluation.csv", index=False)
    plot_skill(table, result.models, list(result.baselines), folder / "skill.png")
    mine = table[table["model"].isin(learnt)].sort_values(["model", "horizon"])
    columns = ["model", "horizon", "n", "mae", "coverage_80", "skill", "best_baseline"]
    figures = {"forecast_eval/skill.png": "bubblecast.app.demo_report.plot_skill", **{
        f"forecast_eval/forecasts/{m}.png": "`bubblecast evaluate --plot`" for m in learnt}}
    return {"models": dict(zip(learnt, refs, strict=False)), "baseline": result.baseline,
            "table": mine.loc[mine["scenario"] == "all", columns].to_dict("records"),
            "skill_per_scenario": {f"{r.model}/{r.scenario}/h{r.horizon}": r.skill
                                   for r in mine[mine["scenario"] != "all"].itertuples()},
            "bubbles": [] if result.bubbles is None else result.bubbles[
                ["model", "horizon", "n", "mae", "predicted", "actual"]].to_dict("records"),
            "figures": figures}


def policy_eval(demo: Demo) -> dict[str, Any]:
    """Replay the held-out runs under each policy (``evaluate_policies``, what ``bubblecast
    policy-eval`` runs); the predictive policy forecasts with the champion model."""
    from bubblecast import evaluate_policies
    from bubblecast.app.demo_report import dumps
    from bubblecast.telemetry.io import atomic_write_text

    names = list(demo.config.policies)
    result = evaluate_policies(demo.memo["heldout"], policies=names,
                               forecaster=str(champion_dir(demo)))
    result.plot(demo.dir("policy_eval") / "policies.png")
    full = result.to_json()
    atomic_write_text(demo.out / "policy_eval" / "policy_eval.json", dumps(full))
    return {"policies": full["policies"], "runs": len(full["runs"]),
            "model": champion_dir(demo).name,
            "speedup_per_run": {r: {n: v["policies"][n]["speedup_vs_static"] for n in names}
                                for r, v in full["runs"].items()},
            "figures": {"policy_eval/policies.png": "`evaluate_policies(...).plot(path)` "
                                                    "(`bubblecast policy-eval --plot`)"}}


def megatron(demo: Demo) -> dict[str, Any]:
    """Bubble accounting and what-ifs of the real Megatron-LM trace (``BubbleAnalysis``, what
    ``bubblecast inspect`` / ``whatif`` run)."""
    from bubblecast import BubbleAnalysis
    from bubblecast.app.demo_report import dumps, reference
    from bubblecast.telemetry.io import atomic_write_text

    trace = Path(demo.config.megatron) if demo.config.megatron else None
    if trace is None or not trace.is_file():
        return {"skipped": f"no Megatron-LM trace at {trace or TRACE}"}
    analysis = BubbleAnalysis(trace)
    summary, answers = analysis.summary(), analysis.whatif()
    analysis.plot(demo.dir("megatron") / "inspect.png")
    atomic_write_text(demo.out / "megatron" / "inspect.json", dumps(summary))
    atomic_write_text(demo.out / "megatron" / "whatif.json", dumps(answers))
    return {"trace": str(trace), "inspect": {k: v for k, v in summary.items() if k != "per_rank"},
            "whatif": {k: answers[k] for k in ("observed_step_s", "replayed_step_s",
                                               "replay_error", "scenarios")},
            "reference": reference(trace),
            "figures": {"megatron/inspect.png": "`BubbleAnalysis(trace).plot(path)` "
                                                "(`bubblecast inspect --plot`)"}}


def live(demo: Demo) -> dict[str, Any]:
    """The 2-process CPU pipeline under the emulated slowdown, once per live policy, closed
    loop (what ``bubblecast run --policy`` does): step times, throughput while slowed,
    actions, control overhead; the predictive policy forecasts with the champion."""
    from bubblecast.app.demo_report import ideal_speedup, plot_live, slowed_steps
    from bubblecast.runtime.control.control_config import ControllerConfig
    from bubblecast.runtime.control.job import launch_controlled, write_actions
    from bubblecast.runtime.train_config import ModelSpec, TrainConfig

    c = demo.config
    if not c.live:
        return {"skipped": "live stage disabled in this configuration"}
    (lo, hi), runs, series = slowed_steps(c), {}, {}
    for policy in c.live_policies:
        control = ControllerConfig(policy=policy, model=str(champion_dir(demo))
                                   if policy == "predictive" else None)
        job = TrainConfig(model=ModelSpec(kind="mlp", layers=c.live_layers, hidden=c.live_hidden),
                          stages=LIVE_STAGES, microbatches=LIVE_MICROBATCHES, schedule="1f1b",
                          steps=c.live_steps, batch_size=16 * LIVE_MICROBATCHES, seed=c.seed,
                          optimizer="sgd", lr=1e-3, inject=c.live_inject,
                          run_id=f"live-{policy}", flush_every=50, layer_cost_every=10)
        s = launch_controlled(job, control, demo.dir("live") / f"{policy}.parquet", timeout=600)
        write_actions(demo.out / "live" / f"{policy}-actions.json", s, control, job.run_id)
        ends = np.asarray(s.get("step_end_s") or [], dtype=np.float64)
        times = series[policy] = np.diff(np.r_[0.0, ends]) if ends.size else np.full(
            int(s["steps"]), float(s["mean_step_s"]))
        slow = float((times[lo:hi] if hi > lo else times).mean())
        runs[policy] = {
            "events": f"live/{policy}.parquet", "mean_step_s": float(times.mean()),
            "slowed_step_s": slow, "slowed_steps_per_s": 1.0 / slow if slow > 0 else None,
            "actions_taken": int(s["actions_taken"]), "first_action_step":
                s.get("first_action_step"), "final_partition": s.get("partition"),
            "control_pct_of_wall": s.get("control_pct_of_wall")}
    for r in runs.values():
        r["speedup_vs_static"] = (runs["static"]["slowed_step_s"] / r["slowed_step_s"]
                                  if "static" in runs else None)
    plot_live(series, (lo, hi), demo.out / "live" / "live.png", c.live_inject)
    return {"closed_loop": True, "policies": runs, "slowed": [lo, hi], "steps": c.live_steps,
            "inject": c.live_inject, "layers": c.live_layers, "stages": LIVE_STAGES,
            "ideal_speedup": ideal_speedup(c),
            "model": str(champion_dir(demo)) if "predictive" in runs else None,
            "figures": {"live/live.png": "bubblecast.app.demo_report.plot_live"}}


def balanced(demo: Demo) -> dict[str, Any]:
    """Balanced work live: collect, fit the cost model, run ``balance`` beside static on the
    packed GPT (:mod:`bubblecast.app.demo_balance`); skipped with the live stage."""
    from bubblecast.app.demo_balance import balanced as run_balanced

    c = demo.config
    if not c.live:
        return {"skipped": "live stages disabled in this configuration"}
    return run_balanced(demo, c.balanced_steps, c.seed)


#: (name, title, function) in the order they run.
STAGES: tuple[tuple[str, str, Callable[[Demo], dict[str, Any]]], ...] = (
    ("simulate", "Simulate the scenario suite", simulate),
    ("dataset", "Build features and targets", dataset),
    ("train", "Train LightGBM and the GRU", train),
    ("forecast_eval", "Evaluate forecasters on held-out runs", forecast_eval),
    ("policy_eval", "Evaluate policies offline", policy_eval),
    ("megatron", "Inspect the real Megatron-LM trace", megatron),
    ("live", "Live closed loop on CPU", live),
    ("balanced", "Balanced work live on CPU", balanced),
)
#: What a fresh run removes first (the files and folders of an earlier demo).
OWNED: tuple[str, ...] = (REPORT, SUMMARY, "mlflow.db", "mlruns",
                          *(name for name, _, _ in STAGES))


def _prepare(out: Path) -> None:
    """Refuse a folder holding something else (one line); remove an earlier demo's files."""
    if out.exists() and not out.is_dir():
        raise BubblecastError(f"--out {out}: exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not any((out / n).exists() for n in OWNED):
        raise BubblecastError(f"--out {out}: folder is not empty and holds no bubblecast "
                              "demo; choose a new or empty folder")
    out.mkdir(parents=True, exist_ok=True)
    for path in (out / name for name in OWNED):
        if path.is_dir():
            shutil.rmtree(path)
        path.unlink(missing_ok=True)


def run_demo(config: DemoConfig, out: str | Path, *, say: Callable[[str], None] | None = None,
             command: str | None = None) -> dict[str, Any]:
    """Run every stage into ``out``, then write ``report.md`` and ``demo.json``; returns the
    ``demo.json`` object. ``say`` gets one line per finished stage."""
    from bubblecast.app.demo_report import dumps, next_steps, write_report
    from bubblecast.telemetry.io import atomic_write_text

    demo = Demo(config, Path(out).resolve())
    _prepare(demo.out)
    started, seconds = time.perf_counter(), {}
    for index, (name, title, fn) in enumerate(STAGES, start=1):
        t0 = time.perf_counter()
        demo.records[name] = fn(demo)
        seconds[name] = round(time.perf_counter() - t0, 3)
        if say is not None:
            note = demo.records[name].get("skipped")
            say(f"[{index}/{len(STAGES)}] {title:<40} {seconds[name]:6.1f} s"
                + (f"  (skipped: {note})" if note else ""))
    doc = {"config": config.to_json(), "out": str(demo.out), "report": str(demo.out / REPORT),
           "seconds": round(time.perf_counter() - started, 3), "stage_seconds": seconds,
           **next_steps(demo.records["train"], demo.out), "stages": demo.records}
    write_report(doc, command)
    return json.loads(atomic_write_text(demo.out / SUMMARY, dumps(doc)).read_text())
