"""Per-decision latency of the controller: predictive with a covariate LightGBM model vs reactive.

Trains a small LightGBM model on ``--train-runs`` simulated ``thermal`` runs (2 stages, 1F1B,
4 micro-batches) with the device metrics the controller gathers (``temperature_c``,
``temperature_slowdown_c``), ``bubblecast dataset --covariates auto``, horizons 1,5,10,20 (the
learned lead's). Then feeds one :class:`bubblecast.runtime.control.decide.Decider` per policy
the same gathered rows, ``--every`` steps per boundary: per-step compute of a held-out
simulated thermal run (seed ``--seed`` + 1000) and every rank's temperature, a slow wave below
its reported slowdown temperature, so that the covariate model is asked at every decision (the
learned lead's path: a rank below its slowdown temperature). The first ``--warmup`` decisions
are not timed; each of the next ``--decisions`` is timed around ``Decider.decide`` (in one
process, on this machine's load).

Goal (issue 23, the live learned lead's decision cost): a covariate decision's median within 3x
of reactive's. For scale, predictive with the built-in trend forecaster (no model) is timed
too: the predictive policy's own cost (forecast guard, solver) without a model.

    python benchmarks/bench_decision_latency.py [--decisions 200] [--every 10] [--seed 1]

Prints a table; writes benchmarks/results/decision_latency.json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import run_header, write_json  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
HORIZONS = "1,5,10,20"
STAGES, MICROBATCHES, LAYERS = 2, 4, 8
GOAL_RATIO = 3.0


def train(work: Path, runs: int, steps: int, seed: int) -> str:
    """A LightGBM model directory trained on covariate features of simulated thermal runs."""
    from bubblecast.cli import main
    from bubblecast.runtime.control.covariate_model import GATHERED
    from bubblecast.telemetry.metrics import metrics_path, read_metrics, write_metrics

    events = work / "runs.parquet"
    assert main(["simulate", "--schedule", "1f1b", "--stages", str(STAGES), "--microbatches",
                 str(MICROBATCHES), "--steps", str(steps), "--scenario", "thermal", "--seed",
                 str(seed), "--runs", str(runs), "--out", str(events)]) == 0
    metrics = read_metrics(events)
    write_metrics(metrics[metrics["metric"].isin(GATHERED)], metrics_path(events))
    feats, model = work / "features.parquet", work / "model"
    assert main(["dataset", str(events), "--out", str(feats), "--covariates", "auto",
                 "--horizons", HORIZONS]) == 0
    assert main(["train", str(feats), "--model", "lgbm", "--out", str(model), "--no-track",
                 "--seed", str(seed)]) == 0
    return str(model)


def test_compute(steps: int, seed: int) -> np.ndarray:
    """``(steps, stages)`` compute seconds per step of a held-out simulated thermal run."""
    from bubblecast.sim.simulator import SimConfig, simulate_events

    ev = simulate_events(SimConfig(schedule="1f1b", stages=STAGES, microbatches=MICROBATCHES,
                                   model=f"uniform:{LAYERS}", steps=steps, scenario="thermal",
                                   seed=seed, runs=1)).frame
    comp = ev[ev["op"].isin(["F", "B", "W"])]
    per = comp.groupby(["step", "stage"])["duration_s"].sum().unstack("stage")
    return per.sort_index().to_numpy(np.float64)


def timed(policy: str, model: str | None, compute: np.ndarray, every: int, warmup: int,
          decisions: int) -> tuple[np.ndarray, list[str]]:
    """Seconds per timed decision of a fresh Decider, and the distinct reasons it gave."""
    from bubblecast.runtime.control.control_config import ControllerConfig
    from bubblecast.runtime.control.decide import Decider
    from bubblecast.runtime.control.observe import pack
    from bubblecast.runtime.plan import check_plan

    config = ControllerConfig(policy=policy, every=every, model=model, timeout_s=30.0)
    plan = check_plan("1f1b", STAGES, MICROBATCHES, LAYERS)
    decider = Decider(config, plan, np.full(LAYERS, 1e3))
    samples = [{"layer": i, "forward_s": 0.1, "total_s": 0.3} for i in range(LAYERS)]
    steps_all = np.arange(len(compute))
    temps = 70.0 + 5.0 * np.sin(steps_all / 40.0)[:, None] + np.arange(STAGES)[None, :]
    out, reasons = [], set()
    for b in range(warmup + decisions):
        steps = list(range(b * every, (b + 1) * every))
        rows = np.stack([pack(compute[steps, r].tolist(), every, samples, LAYERS,
                              temps[steps, r], 85.0) for r in range(STAGES)])
        decider.observe(rows, [(s, plan.partition, MICROBATCHES) for s in steps])
        t0 = time.perf_counter()
        _, record = decider.decide(plan, steps[-1], None)
        dt = time.perf_counter() - t0
        if b >= warmup:
            out.append(dt)
            reasons.add(str(record["reason"]).split(":")[0])
    return np.asarray(out), sorted(reasons)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--decisions", type=int, default=200, help="timed decisions per policy")
    ap.add_argument("--warmup", type=int, default=12,
                    help="decisions before timing (the model needs its feature history)")
    ap.add_argument("--every", type=int, default=10, help="steps between decisions")
    ap.add_argument("--train-runs", type=int, default=3)
    ap.add_argument("--train-steps", type=int, default=160)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=RESULTS / "decision_latency.json")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        model = train(Path(tmp), args.train_runs, args.train_steps, args.seed)
        compute = test_compute((args.warmup + args.decisions) * args.every, args.seed + 1000)
        rows: dict[str, Any] = {}
        for name, policy, m in (("reactive", "reactive", None),
                                ("predictive-trend", "predictive", None),
                                ("predictive-covariate-lgbm", "predictive", model)):
            sec, reasons = timed(policy, m, compute, args.every, args.warmup, args.decisions)
            rows[name] = {"decisions": len(sec), "median_ms": 1e3 * float(np.median(sec)),
                          "p90_ms": 1e3 * float(np.percentile(sec, 90)),
                          "mean_ms": 1e3 * float(sec.mean()), "max_ms": 1e3 * float(sec.max()),
                          "reasons": reasons}
    ratio = rows["predictive-covariate-lgbm"]["median_ms"] / rows["reactive"]["median_ms"]
    over_trend = rows["predictive-covariate-lgbm"]["median_ms"] / \
        rows["predictive-trend"]["median_ms"]
    print(f"{'policy':<28}{'n':>5}{'median ms':>11}{'p90 ms':>9}{'mean ms':>9}{'max ms':>9}")
    for name, r in rows.items():
        print(f"{name:<28}{r['decisions']:>5}{r['median_ms']:>11.2f}{r['p90_ms']:>9.2f}"
              f"{r['mean_ms']:>9.2f}{r['max_ms']:>9.2f}")
    print(f"covariate/reactive median: {ratio:.2f}x (goal <= {GOAL_RATIO:g}x: "
          f"{'met' if ratio <= GOAL_RATIO else 'not met'}); "
          f"covariate/trend median: {over_trend:.2f}x")
    header = run_header("decision_latency", argv, stages=STAGES, microbatches=MICROBATCHES,
                        layers=LAYERS, every=args.every, horizons=HORIZONS,
                        train_runs=args.train_runs, train_steps=args.train_steps,
                        seed=args.seed, warmup=args.warmup)
    write_json(args.out, {**header, "wall_s": time.perf_counter() - t0, "policies": rows,
                          "median_ratio": ratio, "median_ratio_to_trend": over_trend,
                          "goal_ratio": GOAL_RATIO,
                          "goal_met": bool(ratio <= GOAL_RATIO)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
