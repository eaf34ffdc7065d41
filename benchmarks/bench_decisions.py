"""Decisions, not MAE: the predictive policy driven by a trained LightGBM vs by the trend.

For each setup and scenario family this trains LightGBM on simulated runs of tuning seeds (A:
``1000 + 100 k + j``) and evaluates, on held-out runs of other seeds (B: ``90000 + 100 k + j``),
static, reactive, the oracle and predictive twice: with the built-in trend forecaster
(:class:`bubblecast.policy.forecasting.TrendForecaster`, as ``policy-eval`` runs it without a
model) and with the trained model. Reported per family: the oracle share of each (the
plain mean over runs where the oracle gains at least ``EvalConfig.min_oracle_gain``; beside
it, labelled, the share weighted by the oracle's gain), the paired difference LightGBM - trend
with its standard error, and the goals of issue 23 (on the plain means): LightGBM >= trend on
every family, and >= trend + 3 points on ``thermal``. ``--test-base`` draws another set of
held-out runs.

Setups:

- ``policy``: README's policy setup (``benchmarks/bench_policy.py``): 1F1B, 4 stages, 8
  micro-batches, 32 equal layers at the zero-bubble paper's stage times, 0.6 ms p2p, 1500 steps;
- ``sample``: the shipped sample runs' setup (``data/README.md``): 1F1B, 4 stages, 8
  micro-batches, ``uniform:16``, 300 steps.

Families: ``throttle``, ``failslow-ramped`` (bench_policy's fail-slow with a 30-150-step onset),
``thermal`` (with device metrics: the model is trained and run with ``covariates="auto"``, the
features ``dataset --covariates auto`` builds) and ``mixed``. Per setup, LightGBM is trained on
12 tuning runs (``--train``) of each of the four families (the pooled mix a user would train;
4 taught it too little of where a ramp ends: docs/results-notes.md) with the horizons
:data:`HORIZONS` (the policy plans over 256 steps; a model that stops at 10 steps is held flat
beyond them), twice: without covariates, for ``throttle``, ``failslow-ramped`` and ``mixed``,
and with the thermal runs' device metrics (``covariates="auto"``; the other families' runs
give those features as missing), for ``thermal``: a model trained with covariates cannot run
where they are absent (``mixed`` runs carry the metrics of their components, e.g. the tokens
of ``seqlen``, which thermal runs do not).

    python benchmarks/bench_decisions.py [--quick] [--setups policy,sample] [--train 12]
                                         [--test 24] [--steps N] [--trees 150] [--test-base 90000]
    python benchmarks/bench_decisions.py --pool results/decisions.json results/decisions-X.json

Prints a table and writes benchmarks/results/decisions.json (``--quick``: the sample setup
only, 2 training and 3 test runs per family, written to the temporary directory, not among
the results). ``--pool`` summarizes the held-out runs of several draws (results files of other
``--test-base`` seeds) as one, into results/decisions-pooled.json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import run_header, write_json  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
FAMILIES = ("throttle", "failslow-ramped", "thermal", "mixed")
HORIZONS = (1, 5, 10, 25, 50, 100)
THERMAL_MARGIN = 0.03
LEVEL = 0.001  # a per-run share difference counted as level
COVARIATES = "thermal"  # the family whose runs' device metrics the covariate model reads
TRAIN_BASE, TEST_BASE = 1000, 90000
TRAIN_RUNS = 12  # tuning runs per family (4 before: docs/results-notes.md, "Decisions")


@dataclass(frozen=True)
class Setup:
    """A simulated pipeline: schedule 1F1B, ``stages`` x ``microbatches``, its workload."""

    name: str
    steps: int
    comm_ms: float
    zero_bubble: bool  # bench_policy's 32-layer zero-bubble workload, else uniform:16

    def sim_config(self, family: str, seed: int, runs: int, tag: str, steps: int | None = None
                   ) -> Any:
        from bench_policy import MICROBATCHES, STAGES, scenario, workload

        from bubblecast.sim.simulator import SimConfig

        return SimConfig(schedule="1f1b", stages=STAGES, microbatches=MICROBATCHES,
                         model=workload() if self.zero_bubble else "uniform:16",
                         comm=self.comm_ms, steps=steps or self.steps, scenario=scenario(family),
                         seed=seed, runs=runs, run_id=f"{tag}-{family}")


SETUPS = {"policy": Setup("policy", 1500, 0.601, True),
          "sample": Setup("sample", 300, 0.0, False)}


def simulate(setup: Setup, family: str, seed: int, runs: int, tag: str,
             steps: int | None = None) -> tuple[Any, Any]:
    """``(events, device_metrics or None)`` of ``runs`` simulated runs of ``family``."""
    from bubblecast.sim.device_metrics import simulated_metrics
    from bubblecast.sim.simulator import simulate_events

    config = setup.sim_config(family, seed, runs, tag, steps)
    metrics = simulated_metrics(config)
    return simulate_events(config), (metrics if len(metrics) else None)


def train_model(parts: list[tuple[Any, Any]], trees: int, covariates: bool, seed: int = 0
                ) -> Any:
    """LightGBM on the features of ``parts`` (events, metrics), with the covariates of the
    metrics (``covariates="auto"``) or without any."""
    import pandas as pd

    from bubblecast.dataset import DatasetConfig, build_dataset
    from bubblecast.forecast.lgbm import LGBMForecaster
    from bubblecast.telemetry.events import Events

    metrics = [m for _, m in parts if m is not None and covariates]
    frame, _ = build_dataset(Events.concat([e for e, _ in parts]),
                             DatasetConfig(horizons=HORIZONS,
                                           covariates="auto" if covariates else "none"),
                             metrics=pd.concat(metrics, ignore_index=True) if metrics else None)
    return LGBMForecaster(n_estimators=trees, seed=seed).fit(frame)


def compare_run(events: Any, run_id: str, model: Any, metrics: Any) -> dict[str, Any]:
    """One held-out run: each policy's gain over static, the oracle shares of reactive, of
    predictive with the trend and with ``model`` (None when the oracle gains too little to
    score), their moves and the guard's fallback decisions."""
    from bubblecast.policy.policies import PredictivePolicy
    from bubblecast.policy.policy_evaluation import (
        EvalConfig,
        evaluate_run,
        migration_model,
        run_policy,
    )
    from bubblecast.policy.run_data import load_run
    from bubblecast.policy.speeds import model_forecaster

    run = load_run(events, run_id)
    config = EvalConfig()
    report, traces = evaluate_run(run, ["static", "reactive", "predictive", "oracle"], config)
    pol = report["policies"]
    static = pol["static"]["step_s"]
    forecaster = model_forecaster(model, events, run_id, run.steps, run.unit, metrics=metrics)
    migration, _ = migration_model(run, config)
    lgbm = run_policy(run, PredictivePolicy(forecaster=forecaster), migration, config.memory_cap)
    lgbm_gain = 1.0 - float(lgbm.step_s.mean()) / static
    oracle = pol["oracle"]["gain_vs_static"]
    scored = report["oracle_gain"] is not None
    out: dict[str, Any] = {"run_id": run_id, "oracle_gain": oracle, "scored": scored,
                           "covariates": metrics is not None}
    for name, gain, trace in (("reactive", pol["reactive"]["gain_vs_static"],
                               traces["reactive"]),
                              ("trend", pol["predictive"]["gain_vs_static"],
                               traces["predictive"]),
                              ("lgbm", lgbm_gain, lgbm)):
        out[name] = {"gain": gain, "share": gain / oracle if scored else None,
                     "moves": len(trace.decisions),
                     "fallback_decisions": (trace.guard or {}).get("fallback_decisions")}
    return out


def summarize(rows: list[dict[str, Any]], margin: float) -> dict[str, Any]:
    """Plain mean shares over the scored runs (and beside them, ``*_weighted``, the shares
    weighted by the oracle's gain), the paired difference lgbm - trend of the plain shares with
    its standard error, and whether lgbm >= trend + ``margin`` on the plain mean (``met`` None:
    no run where the oracle gains, so no share to compare; ``gains_equal`` says whether the two
    forecasters' gains over static were equal on every run then)."""
    scored = [r for r in rows if r["scored"]]
    out: dict[str, Any] = {"runs": len(rows), "scored_runs": len(scored),
                           "oracle_gain_mean": float(np.mean([r["oracle_gain"] for r in rows]))}
    oracle = sum(r["oracle_gain"] for r in scored)
    for name in ("reactive", "trend", "lgbm"):
        out[name] = float(np.mean([r[name]["share"] for r in scored])) if scored else None
        # weighted by the oracle's gain (sum of gains over the oracle's sum): a run where the
        # oracle gains little cannot swing it as it can a plain mean of ratios
        out[f"{name}_weighted"] = float(sum(r[name]["gain"] for r in scored) / oracle) \
            if scored else None
    diff = np.array([r["lgbm"]["share"] - r["trend"]["share"] for r in scored])
    out["lgbm_minus_trend"] = float(diff.mean()) if len(diff) else None
    out["diff_se"] = float(diff.std(ddof=1) / np.sqrt(len(diff))) if len(diff) > 1 else None
    # per run: LightGBM ahead, level (within LEVEL) or behind: a mean can hide one lost bet
    out["runs_ahead_level_behind"] = [int((diff > LEVEL).sum()),
                                      int((np.abs(diff) <= LEVEL).sum()),
                                      int((diff < -LEVEL).sum())]
    out["margin"] = margin
    out["met"] = bool(diff.mean() >= margin) if len(diff) else None
    if not scored:
        out["gains_equal"] = all(r["lgbm"]["gain"] == r["trend"]["gain"] for r in rows)
    return out


def train_models(setup: Setup, families: tuple[str, ...], train: int, trees: int,
                 steps: int | None = None) -> dict[bool, Any]:
    """LightGBM on ``train`` tuning runs of every family, keyed by covariates: ``False``
    without them, and ``True`` (where :data:`COVARIATES` is among the families) with the
    device metrics of its runs alone (the other families' runs give the features as
    missing)."""
    parts = [simulate(setup, f, TRAIN_BASE + 100 * k, train, "train", steps)
             for k, f in enumerate(families)]
    models = {False: train_model(parts, trees, covariates=False)}
    if COVARIATES in families:
        models[True] = train_model([(e, m if f == COVARIATES else None)
                                    for f, (e, m) in zip(families, parts, strict=True)],
                                   trees, covariates=True)
    return models


def run_setup(setup: Setup, families: tuple[str, ...], train: int, test: int, trees: int,
              steps: int | None, test_base: int = TEST_BASE) -> dict[str, Any]:
    """Train (:func:`train_models`), then compare on held-out runs."""
    t0 = time.perf_counter()
    models = train_models(setup, families, train, trees, steps)
    trained = time.perf_counter() - t0
    print(f"[{setup.name}] trained on {train} runs x {len(families)} families: {trained:.0f} s",
          flush=True)
    out: dict[str, Any] = {"train_s": trained, "families": {}}
    for k, family in enumerate(families):
        events, metrics = simulate(setup, family, test_base + 100 * k, test, "test", steps)
        rows = []
        for run_id in events.run_ids:
            mine = metrics if family == COVARIATES else None
            rows.append(compare_run(events, run_id, models[mine is not None], mine))
            r = rows[-1]
            print(f"  [{setup.name}] {run_id:22} oracle {r['oracle_gain']:+7.2%}  " + "  ".join(
                f"{n} {'-' if r[n]['share'] is None else format(r[n]['share'], '.3f')}"
                f" ({r[n]['moves']} mv)" for n in ("reactive", "trend", "lgbm")), flush=True)
        margin = THERMAL_MARGIN if family == "thermal" else 0.0
        out["families"][family] = {"summary": summarize(rows, margin), "runs": rows}
    out["seconds"] = time.perf_counter() - t0
    return out


def print_table(results: dict[str, Any]) -> None:
    print(f"\n{'setup':7} {'family':16} {'runs':>5} {'oracle':>7} {'reactive':>8} {'trend':>7} "
          f"{'lgbm':>7} {'lgbm-trend':>11} {'+/=/-':>8} {'goal':>6} {'verdict':>16} "
          f"{'weighted: trend':>15} {'lgbm':>5}")
    for name, res in results.items():
        for family, f in res["families"].items():
            s = f["summary"]

            def cell(v: float | None) -> str:
                return "-" if v is None else f"{v:.3f}"

            se = "" if s["diff_se"] is None else f"+-{s['diff_se']:.3f}"
            diff = "-" if s["lgbm_minus_trend"] is None else f"{s['lgbm_minus_trend']:+.3f}{se}"
            verdict = "no room to score" if s["met"] is None else "met" if s["met"] \
                else "NOT met"
            print(f"{name:7} {family:16} {s['scored_runs']:>2}/{s['runs']:<2} "
                  f"{s['oracle_gain_mean']:7.2%} {cell(s['reactive']):>8} {cell(s['trend']):>7} "
                  f"{cell(s['lgbm']):>7} {diff:>11} "
                  f"{'/'.join(str(n) for n in s['runs_ahead_level_behind']):>8} "
                  f"{'>=' + format(s['margin'], '+.2f'):>6} "
                  f"{verdict:>16} {cell(s['trend_weighted']):>15} {cell(s['lgbm_weighted']):>5}")


def headline(results: dict[str, Any]) -> dict[str, Any]:
    """Top-level scalars for the results page: per setup and family the two oracle shares,
    and the goals met among those with a run to score (the others named: no policy could
    gain there, so there is no share to compare)."""
    out: dict[str, Any] = {}
    met, unscored = [], []
    for name, res in results.items():
        for family, f in res["families"].items():
            s = f["summary"]
            out[f"{name} {family} oracle share trend"] = s["trend"]
            out[f"{name} {family} oracle share lgbm"] = s["lgbm"]
            out[f"{name} {family} oracle share weighted trend"] = s["trend_weighted"]
            out[f"{name} {family} oracle share weighted lgbm"] = s["lgbm_weighted"]
            if s["met"] is None:
                unscored.append(f"{name} {family}")
            else:
                met.append(s["met"])
    out["goals met"] = f"{sum(met)} of {len(met)}" + (
        f" with a run to score (none in: {', '.join(unscored)})" if unscored else "")
    return out


def pool_draws(paths: list[str], out: str) -> None:
    """Pool the held-out runs of earlier results files (draws of other seeds, the same
    setups, families and training) per setup and family, and summarize them as one draw."""
    import json

    def refuse(path: str, why: str) -> None:
        print(f"{path}: {why}", file=sys.stderr)
        raise SystemExit(2)

    docs = []
    for p in paths:
        try:
            docs.append(json.loads(Path(p).read_text()))
        except (OSError, ValueError) as exc:
            refuse(p, f"cannot read a results file: {exc}")
        if not isinstance(docs[-1], dict) or not isinstance(docs[-1].get("results"), dict):
            refuse(p, "no 'results' object: not a bench_decisions results file")
    first = docs[0]
    keys = ("train_runs", "trees", "horizons", "train_seed_base", "setups")
    bases = [d.get("test_seed_base") for d in docs]

    def families(d: dict[str, Any]) -> dict[str, list[str]]:
        return {n: list(r.get("families", {})) for n, r in d["results"].items()}

    for i, (p, d) in enumerate(zip(paths, docs, strict=True)):
        missing = [k for k in (*keys, "test_runs", "test_seed_base", "thermal_margin")
                   if k not in d]
        if missing:
            refuse(p, f"missing key '{missing[0]}': not a bench_decisions results file")
        if any(d[k] != first[k] for k in keys) or d["test_seed_base"] in bases[:i] \
                or families(d) != families(first):
            refuse(p, f"not another draw of {paths[0]}'s runs (the training, trees, horizons, "
                      "setups and families must match and the held-out seed bases differ)")
    results: dict[str, Any] = {}
    for name in first["results"]:
        fams: dict[str, Any] = {}
        for family in first["results"][name]["families"]:
            rows = [r for d in docs for r in d["results"][name]["families"][family]["runs"]]
            margin = THERMAL_MARGIN if family == "thermal" else 0.0
            fams[family] = {"summary": summarize(rows, margin), "runs": rows}
        results[name] = {"families": fams}
    print_table(results)
    keep = ("train_runs", "horizons", "trees", "train_seed_base", "thermal_margin", "setups")
    doc = {**run_header("decisions", pooled=paths,
                        test_runs=sum(d["test_runs"] for d in docs),
                        test_seed_bases=[d["test_seed_base"] for d in docs],
                        **{k: first[k] for k in keep}),
           **headline(results), "results": results}
    write_json(out, doc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="sample setup only, 2 training and 3 test runs per family")
    ap.add_argument("--setups", default="policy,sample")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--train", type=int, default=TRAIN_RUNS, help="training runs per family")
    ap.add_argument("--test", type=int, default=24,
                    help="held-out runs per family (with 6, the paired difference's standard "
                         "error was as large as the differences)")
    ap.add_argument("--steps", type=int, default=None, help="steps per run (default: setup's)")
    ap.add_argument("--trees", type=int, default=150)
    ap.add_argument("--test-base", type=int, default=TEST_BASE,
                    help="seed base of the held-out runs (another base: another draw of them)")
    ap.add_argument("--out", default=None, help="results JSON (default: results/decisions.json; "
                    "--quick: decisions-quick.json in the temporary directory; --pool: "
                    "results/decisions-pooled.json)")
    ap.add_argument("--pool", nargs="+", metavar="JSON", default=None,
                    help="pool these results files' held-out runs (other draws) instead of "
                         "running")
    args = ap.parse_args()
    if args.pool:
        pool_draws(args.pool, args.out or str(RESULTS / "decisions-pooled.json"))
        return
    setups = ["sample"] if args.quick else [s for s in args.setups.split(",") if s]
    train, test = (2, 3) if args.quick else (args.train, args.test)
    families = tuple(f for f in args.families.split(",") if f)
    t0 = time.perf_counter()
    jobs = [(SETUPS[name], families, train, test, args.trees, args.steps, args.test_base)
            for name in setups]
    if len(jobs) > 1:  # one process per setup (their lines interleave)
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(len(jobs)) as pool:
            done = list(pool.map(run_setup, *zip(*jobs, strict=True)))
    else:
        done = [run_setup(*jobs[0])]
    results = dict(zip(setups, done, strict=True))
    print_table(results)
    doc = {**run_header("decisions", quick=args.quick, train_runs=train, test_runs=test,
                        horizons=list(HORIZONS), trees=args.trees, train_seed_base=TRAIN_BASE,
                        test_seed_base=args.test_base, thermal_margin=THERMAL_MARGIN,
                        setups={n: vars(SETUPS[n]) for n in setups}),
           **headline(results), "results": results, "wall_s": time.perf_counter() - t0}
    default = Path(tempfile.gettempdir()) / "decisions-quick.json" if args.quick \
        else RESULTS / "decisions.json"
    write_json(args.out or default, doc)


if __name__ == "__main__":
    main()
