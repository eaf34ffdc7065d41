"""Decisions, not MAE: predictive driven by a trained LightGBM does not lose to the trend.

A small held-out version of ``benchmarks/bench_decisions.py`` (same code): LightGBM trained on
six tuning-seed runs of ``failslow-ramped`` in the sample setup (1F1B, 4 x 8, ``uniform:16``,
200 steps), then predictive with it and with the built-in trend forecaster on four runs of
other seeds (three of which the oracle gains on). Six, because LightGBM splits its training
runs three ways (fit / early stopping / calibration): of three, one run is left to fit on.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_decisions as bd  # noqa: E402

#: The paired per-run difference lgbm - trend of the oracle share over the 48 held-out
#: failslow-ramped runs of the sample setup in two draws of ``python
#: benchmarks/bench_decisions.py`` (results/decisions-pooled.json, 150 trees on 48 runs) is
#: -0.010 +- 0.010, LightGBM ahead on 25 runs and behind on 9 (with 16 training runs: -0.014 +-
#: 0.008, behind on 20): the goal is missed there, and the results notes say why. This
#: test's smaller model (30 trees) is noisier: trained on 5, 6 and 8 runs its mean difference
#: over these three scored runs was -0.006, -0.000 and -0.015, its worst run -0.045. The
#: tolerance is 2x the worst of those means; a model that loses a few points on every run
#: fails (with 3 training runs, one left to fit on: -0.11).
TOLERANCE = 0.03
TRAIN_RUNS = 6
STEPS = 200


def test_lgbm_is_not_worse_than_trend_on_held_out_runs() -> None:
    setup = bd.SETUPS["sample"]
    family = "failslow-ramped"
    train = bd.simulate(setup, family, bd.TRAIN_BASE, TRAIN_RUNS, "train", STEPS)
    model = bd.train_model([train], trees=30, covariates=False)
    assert max(model.horizons_) == max(bd.HORIZONS)  # the policy is not left with h=10 held flat
    events, _ = bd.simulate(setup, family, bd.TEST_BASE, 4, "test", STEPS)
    rows = [bd.compare_run(events, run_id, model, None) for run_id in events.run_ids]
    summary = bd.summarize(rows, margin=-TOLERANCE)
    assert summary["scored_runs"] >= 3  # the oracle gains on most of them: there is a decision
    shares = [r["lgbm"]["share"] for r in rows if r["scored"]]
    assert all(np.isfinite(shares)) and min(shares) > 0  # the model's moves gain
    assert summary["lgbm_minus_trend"] >= -TOLERANCE, summary
    assert summary["met"]
