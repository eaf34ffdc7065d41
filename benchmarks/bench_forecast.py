"""Forecast skill and coverage on a held-out suite of simulated runs (the issue's done-means).

Simulates a training suite and, with other seeds (so no run is shared), a held-out suite of
the scenarios throttle, failslow, periodic, seqlen and mixed, plus a jitter-only suite (pure
noise). Trains LightGBM and the GRU sequence model on the training suite (each splits its runs
internally into train / early-stopping / conformal calibration), then evaluates both against
the four baselines on the held-out suite: MAE, coverage of p10-p90, and skill = 1 - MAE / MAE
of the best baseline at that horizon on the same rows, overall and per scenario; the predicted
vs actual bubble fraction; and skill on jitter (where no model should claim any).
Prints tables and writes ``benchmarks/results/forecast.json``.
Usage: ``python benchmarks/bench_forecast.py [--train-runs 16] [--test-runs 8] [--steps 400]``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pandas as pd

from bubblecast.dataset import DatasetConfig, build_dataset
from bubblecast.forecast.evaluation_run import bubbles_per_model
from bubblecast.forecast.forecast_evaluation import evaluate
from bubblecast.forecast.lgbm import LGBMForecaster
from bubblecast.forecast.seq import SeqForecaster
from bubblecast.forecast.suite import HELD_OUT, SuiteConfig, suite_events
from bubblecast.telemetry.io import atomic_write_text

RESULTS = Path(__file__).resolve().parent / "results" / "forecast.json"


def _suite(scenarios: tuple[str, ...], runs: int, steps: int, seed: int,
           config: DatasetConfig) -> tuple[pd.DataFrame, dict]:
    events = suite_events(SuiteConfig(scenarios=scenarios, runs=runs, steps=steps, seed=seed))
    frame, meta = build_dataset(events, config)
    return frame, meta.run_info


def _timed(fn):
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, {"wall_s": time.perf_counter() - w, "cpu_s": time.process_time() - c}


def _table(ev, names: list[str]) -> pd.DataFrame:
    t = ev.table[ev.table["model"].isin(names)]
    return t.pivot_table(index=["model", "scenario"], columns="horizon",
                         values=["skill", "coverage_80", "mae"]).round(3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-runs", type=int, default=16, help="Runs per scenario.")
    parser.add_argument("--test-runs", type=int, default=8, help="Runs per scenario.")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--max-rows", type=int, default=150_000, help="Training rows cap.")
    parser.add_argument("--epochs", type=int, default=30, help="Sequence model epochs.")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    config = DatasetConfig()
    train, _ = _suite(HELD_OUT, args.train_runs, args.steps, 1000 + args.seed, config)
    held, run_info = _suite(HELD_OUT, args.test_runs, args.steps, 2000 + args.seed, config)
    jitter, _ = _suite(("jitter",), args.test_runs, args.steps, 3000 + args.seed, config)
    assert not set(train["run_id"].astype(str)) & set(held["run_id"].astype(str))
    print(f"train {len(train):,} rows ({train['run_id'].nunique()} runs), held-out "
          f"{len(held):,} rows ({held['run_id'].nunique()} runs), jitter {len(jitter):,} rows")
    fits = {}
    lgbm, fits["lgbm"] = _timed(lambda: LGBMForecaster(max_train_rows=args.max_rows,
                                                       seed=args.seed).fit(train))
    print(f"lgbm fitted in {fits['lgbm']['wall_s']:.0f} s", flush=True)
    seq, fits["seq"] = _timed(lambda: SeqForecaster(max_train_rows=args.max_rows,
                                                    epochs=args.epochs, seed=args.seed).fit(train))
    print(f"seq fitted in {fits['seq']['wall_s']:.0f} s ({len(seq.history_)} epochs)", flush=True)
    models = {"lgbm": lgbm, "seq": seq}
    ev = evaluate(held, models, seed=args.seed)
    ev_jitter = evaluate(jitter, models, seed=args.seed)
    preds = {name: m.predict_signal(held, list(m.horizons_)) for name, m in models.items()}
    bubbles = bubbles_per_model(held, preds, run_info)

    pd.set_option("display.width", 200)
    print("\nheld-out suite, all rows (skill vs the best baseline at each horizon):")
    print(_table(ev, list(ev.models)).loc[(slice(None), "all"), :].to_string())
    print("\nheld-out suite, per scenario:")
    print(_table(ev, list(models)).to_string())
    print("\njitter only (pure noise):")
    print(_table(ev_jitter, list(models)).to_string())
    print("\nbubble fraction at t+h replayed with forecast vs actual stage times:")
    print(bubbles.round(4).to_string(index=False))
    result = {
        "args": vars(args), "rows": {"train": len(train), "held_out": len(held),
                                     "jitter": len(jitter)},
        "fit_time": fits, "held_out": ev.summary(), "jitter": ev_jitter.summary(),
        "held_out_table": ev.table.to_dict(orient="records"),
        "jitter_table": ev_jitter.table.to_dict(orient="records"),
        "bubbles": bubbles.to_dict(orient="records"),
        "targets": {"skill_min": 0.3, "coverage": [0.78, 0.82], "jitter_skill_max": 0.05},
    }
    atomic_write_text(RESULTS, json.dumps(result, indent=1, default=float))


if __name__ == "__main__":
    main()
