"""The forecasts behind bench_decisions' moves: how close each forecaster's planning speeds are.

bench_decisions scores the predictive policy driven by a trained LightGBM against the built-in
trend forecaster on the decisions' outcome. This benchmark looks at what the two feed the
policy, on the same trained models and held-out runs (the same seeds and setups), at the
horizons the policy plans over (1, 2, 4, ..., 256 steps): at origins every ``--every`` steps
of each run, for each forecaster and horizon,

- ``coverage``: the share of (origin, rank) pairs whose realised speed (the policy's history
  row ``h`` steps later) falls in the served p10-p90 interval, and ``above_p90`` the share
  above it;
- ``p50_log_bias`` and ``p50_log_mae``: the mean and the mean absolute value of
  ``log(p50 / realised)`` (the point forecast's error);
- ``plan_log_bias`` and ``plan_log_mae``: the same for the speed the policy plans on,
  ``0.7 x p50 + 0.3 x p90`` (:func:`bubblecast.policy.state.planning_speed`, ``risk`` 0.3).

The trained model is served as the policy serves it (:func:`bubblecast.policy.speeds.
model_forecaster`, with adaptive conformal intervals updated at every step). Both are scored
on the same origins: those where the model has a forecast of its own (in a run's first steps
it has none and the policy asks the trend), so a horizon no such origin reaches within the run
is not reported. A forecaster whose planning speeds are closer on
average can still lose decisions: these figures say whether a loss comes from the forecasts
on the mean or from a few runs' moves.

    python benchmarks/bench_decision_forecasts.py [--setups sample] [--train 12] [--test 24]
                                                  [--every 4] [--trees 150]

Prints a table and writes benchmarks/results/decision_forecasts.json.
"""

from __future__ import annotations

import argparse
import sys
import time
import types
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import run_header, write_json  # noqa: E402
from bench_decisions import (  # noqa: E402
    COVARIATES,
    FAMILIES,
    SETUPS,
    TEST_BASE,
    TRAIN_BASE,
    TRAIN_RUNS,
    Setup,
    simulate,
    train_models,
)

from bubblecast.policy.state import horizon_grid, planning_speed  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
RISK = 0.3  # PredictivePolicy's default
FORECASTERS = ("trend", "lgbm")


class _Tally:
    """Running sums for one (forecaster, horizon): covered, above p90, pairs, log errors."""

    def __init__(self) -> None:
        self.covered = self.above = self.pairs = 0
        self.plan_err: list[np.ndarray] = []
        self.p50_err: list[np.ndarray] = []

    def add(self, q: np.ndarray, realised: np.ndarray) -> None:
        """``q``: ``(P, 3)`` p10/p50/p90 speeds; ``realised``: ``(P,)`` speeds."""
        self.covered += int(((realised >= q[:, 0]) & (realised <= q[:, 2])).sum())
        self.above += int((realised > q[:, 2]).sum())
        self.pairs += len(realised)
        plan = planning_speed(q[None], RISK)[0]
        self.plan_err.append(np.log(plan / realised))
        self.p50_err.append(np.log(q[:, 1] / realised))

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"coverage": self.covered / self.pairs,
                               "above_p90": self.above / self.pairs}
        for name, parts in (("p50", self.p50_err), ("plan", self.plan_err)):
            err = np.concatenate(parts)
            out[f"{name}_log_bias"] = float(err.mean())
            out[f"{name}_log_mae"] = float(np.abs(err).mean())
        return {**out, "pairs": self.pairs}


def score_run(events: Any, run_id: str, model: Any, metrics: Any, hz: np.ndarray, every: int,
              tallies: dict[str, dict[int, _Tally]]) -> None:
    """Add one held-out run's forecasts at origins ``every`` steps apart to ``tallies``."""
    from bubblecast.policy.forecasting import TrendForecaster
    from bubblecast.policy.run_data import load_run
    from bubblecast.policy.speeds import model_forecaster

    run = load_run(events, run_id)
    history = run.history
    steps = len(history)
    trend = TrendForecaster()  # no state: asked at the scored origins only
    lgbm = model_forecaster(model, events, run_id, run.steps, run.unit, metrics=metrics)
    for t in range(8, steps - 1):  # PredictivePolicy's min_history
        state = types.SimpleNamespace(t=t, history=history[: t + 1])
        q_lgbm = lgbm.forecast(state, hz)  # every step: the served ACI observes each
        own = bool(np.all(np.isfinite(lgbm.table[t])))  # the model's own, not the trend's
        if t % every or not own:
            continue
        for name, q in (("trend", trend.forecast(state, hz)), ("lgbm", q_lgbm)):
            for i, h in enumerate(hz):
                if t + h < steps:
                    tallies[name][int(h)].add(q[i], history[t + h])


def run_setup(setup: Setup, train: int, test: int, trees: int, every: int) -> dict[str, Any]:
    """Train as bench_decisions does, then score both forecasters on its held-out runs."""
    t0 = time.perf_counter()
    models = train_models(setup, FAMILIES, train, trees)
    hz, _ = horizon_grid(256)
    out: dict[str, Any] = {}
    for k, family in enumerate(FAMILIES):
        events, metrics = simulate(setup, family, TEST_BASE + 100 * k, test, "test")
        mine = metrics if family == COVARIATES else None
        tallies = {n: {int(h): _Tally() for h in hz} for n in FORECASTERS}
        for run_id in events.run_ids:
            score_run(events, run_id, models[mine is not None], mine, hz, every, tallies)
        out[family] = {n: {str(h): t.summary() for h, t in by_h.items() if t.pairs}
                       for n, by_h in tallies.items()}
        print(f"[{setup.name}] {family}: {time.perf_counter() - t0:.0f} s", flush=True)
    return out


def print_table(results: dict[str, Any]) -> None:
    for setup, families in results.items():
        for family, by_name in families.items():
            print(f"\n{setup} {family}: coverage, above p90, log MAE of p50 and of the "
                  "planning speed (its bias)")
            for name, by_h in by_name.items():
                print(f"  {name:5} " + "  ".join(
                    f"h{h}: {s['coverage']:.2f} {s['above_p90']:.2f} {s['p50_log_mae']:.3f} "
                    f"{s['plan_log_mae']:.3f} ({s['plan_log_bias']:+.3f})"
                    for h, s in by_h.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--setups", default="sample")
    ap.add_argument("--train", type=int, default=TRAIN_RUNS, help="training runs per family")
    ap.add_argument("--test", type=int, default=24, help="held-out runs per family")
    ap.add_argument("--every", type=int, default=4, help="steps between scored origins")
    ap.add_argument("--trees", type=int, default=150)
    ap.add_argument("--out", default=str(RESULTS / "decision_forecasts.json"))
    args = ap.parse_args()
    t0 = time.perf_counter()
    setups = [s for s in args.setups.split(",") if s]
    results = {name: run_setup(SETUPS[name], args.train, args.test, args.trees, args.every)
               for name in setups}
    print_table(results)
    doc = {**run_header("decision_forecasts", train_runs=args.train, test_runs=args.test,
                        every=args.every, trees=args.trees, risk=RISK,
                        train_seed_base=TRAIN_BASE, test_seed_base=TEST_BASE),
           "results": results, "wall_s": time.perf_counter() - t0}
    write_json(args.out, doc)


if __name__ == "__main__":
    main()
