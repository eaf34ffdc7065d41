"""The forecast guard with any model: predictive vs static and its moves vs the oracle's.

Issue 13's bound: with any model, ``models/default`` included, on the default simulated setup,
predictive is never more than 0.5% slower than static and makes at most 2x the oracle's moves.
For each scenario this simulates ``--runs`` held-out runs of the setup the shipped sample runs
use (``data/README.md``: 1F1B, 4 stages, 8 micro-batches, ``uniform:16``, 300 steps; seeds from
``--seed``, not those of ``data/sim`` or of the shipped model's training runs) and evaluates, as
``policy-eval`` does (default migration model), static, reactive, oracle and predictive with
three forecasters:

- ``default``: the shipped LightGBM model (``models/default``);
- ``trend``: the built-in trend forecaster;
- ``wrong``: ``models/default`` made deliberately wrong: each rank's forecast is the mirrored
  rank's, inverted (the slow rank forecast fast and the reverse); not backtestable, so the
  guard scores it online only.

    python benchmarks/bench_guard.py [--runs 3] [--steps 300] [--seed 70000]

Prints one row per run and forecaster and a summary; writes benchmarks/results/guard.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import run_header, write_json  # noqa: E402

SCENARIOS = ("none", "jitter", "throttle", "thermal", "failslow", "periodic", "seqlen",
             "imbalance", "mixed")
FORECASTERS = ("default", "trend", "wrong")
BOUND_PCT, MOVES_RATIO = 0.5, 2.0


class Mirrored:
    """A deliberately wrong forecaster: ``inner``'s forecast of the mirrored rank, inverted."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name = inner, f"wrong({getattr(inner, 'name', 'model')})"

    def forecast(self, state: Any, horizons: np.ndarray) -> np.ndarray:
        q = np.asarray(self.inner.forecast(state, horizons), dtype=np.float64)
        return np.sort(1.0 / np.maximum(q[:, ::-1, :], 1e-12), axis=2)


def evaluate(scenario: str, seed: int, runs: int, steps: int, model: Any) -> list[dict]:
    """Per run: each forecaster's gain vs static (%), its moves, the oracle's and reactive's."""
    from bubblecast.policy.forecasting import TrendForecaster
    from bubblecast.policy.policies import PredictivePolicy
    from bubblecast.policy.policy_evaluation import (
        EvalConfig,
        evaluate_run,
        migration_model,
        run_policy,
    )
    from bubblecast.policy.run_data import load_run
    from bubblecast.policy.speeds import model_forecaster
    from bubblecast.sim.simulator import SimConfig, simulate_events

    events = simulate_events(SimConfig(schedule="1f1b", stages=4, microbatches=8,
                                       model="uniform:16", steps=steps, scenario=scenario,
                                       seed=seed, runs=runs, run_id=scenario))
    rows = []
    for run_id in events.run_ids:
        run = load_run(events, run_id)
        config = EvalConfig()
        migration, _ = migration_model(run, config)
        report, _ = evaluate_run(run, ["static", "reactive", "oracle"], config)
        pol = report["policies"]
        base = pol["static"]["step_s"]
        shipped = model_forecaster(model, events, run_id, run.steps, run.unit)
        forecasters = {"default": shipped, "trend": TrendForecaster(),
                       "wrong": Mirrored(model_forecaster(model, events, run_id, run.steps,
                                                          run.unit))}
        row: dict[str, Any] = {"run_id": run_id, "static_step_s": base,
                               "oracle_moves": pol["oracle"]["actions"],
                               "oracle_gain_pct": 100.0 * pol["oracle"]["gain_vs_static"],
                               "reactive_gain_pct": 100.0 * pol["reactive"]["gain_vs_static"],
                               "reactive_moves": pol["reactive"]["actions"]}
        for name, fc in forecasters.items():
            trace = run_policy(run, PredictivePolicy(forecaster=fc), migration)
            row[name] = {"gain_pct": 100.0 * (1.0 - float(trace.step_s.mean()) / base),
                         "moves": len(trace.decisions),
                         "fallback_decisions": (trace.guard or {}).get("fallback_decisions")}
        rows.append(row)
    return rows


def summarize(rows: list[dict]) -> dict[str, Any]:
    """Per forecaster: the worst gain, runs beyond the bound, the most moves over the oracle's
    (runs where the oracle moves; where it does not, the moves made), plain mean gain."""
    out = {}
    for name in FORECASTERS:
        gains = [r[name]["gain_pct"] for r in rows]
        over = [r[name]["moves"] / r["oracle_moves"] for r in rows if r["oracle_moves"]]
        idle = [r[name]["moves"] for r in rows if not r["oracle_moves"]]
        out[name] = {"worst_gain_pct": min(gains), "mean_gain_pct": float(np.mean(gains)),
                     "runs_slower_than_bound": sum(g < -BOUND_PCT for g in gains),
                     "max_moves_over_oracle": max(over) if over else None,
                     "moves_where_oracle_idle": int(sum(idle)), "runs": len(rows)}
        out[name]["met"] = out[name]["runs_slower_than_bound"] == 0 and \
            (not over or max(over) <= MOVES_RATIO) and out[name]["moves_where_oracle_idle"] == 0
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="held-out runs per scenario")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seed", type=int, default=70000)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "guard.json"))
    args = ap.parse_args()
    from bubblecast.forecast.modeldir import load_model

    model = load_model(str(ROOT / "models" / "default"))
    t0 = time.perf_counter()
    rows: list[dict] = []
    print(f"{'run':14} {'oracle':>13} {'reactive':>13} " +
          " ".join(f"{n:>15}" for n in FORECASTERS) + "   (gain vs static %, moves)")
    for k, scenario in enumerate(s for s in args.scenarios.split(",") if s):
        for r in evaluate(scenario, args.seed + 100 * k, args.runs, args.steps, model):
            rows.append(r)
            cells = " ".join(f"{r[n]['gain_pct']:+8.2f}% {r[n]['moves']:>4}" for n in FORECASTERS)
            print(f"{r['run_id']:14} {r['oracle_gain_pct']:+8.2f}% {r['oracle_moves']:>3} "
                  f"{r['reactive_gain_pct']:+8.2f}% {r['reactive_moves']:>3} {cells}", flush=True)
    summary = summarize(rows)
    for name, s in summary.items():
        print(f"{name:8} worst {s['worst_gain_pct']:+.2f}%, mean {s['mean_gain_pct']:+.2f}%, "
              f"runs beyond -{BOUND_PCT}%: {s['runs_slower_than_bound']}/{s['runs']}, "
              f"max moves / oracle's {s['max_moves_over_oracle']}, moves where the oracle "
              f"makes none {s['moves_where_oracle_idle']}: {'met' if s['met'] else 'NOT met'}")
    doc = {**run_header("guard", runs=args.runs, steps=args.steps, seed=args.seed,
                        setup={"schedule": "1f1b", "stages": 4, "microbatches": 8,
                               "model": "uniform:16"}, model="models/default"),
           "wall_s": time.perf_counter() - t0, "bound_pct": BOUND_PCT,
           "moves_ratio": MOVES_RATIO, "summary": summary, "runs": rows}
    write_json(args.out, doc)


if __name__ == "__main__":
    main()
