"""The spread of held-out p10-p90 coverage at the scale of ``tests/forecast/test_calibration.py``.

Trains LightGBM and the GRU as that test does (8 scenarios x 3 runs of 160 steps, one replica)
on several training suite seeds, scores each on several held-out suite seeds, and prints each
coverage and the standard deviations the test's tolerances are derived from.
Usage: ``python benchmarks/calibration_spread.py [--train 1 3 4 5 6] [--held 2 7 8 ...]``
(about 30 s for the defaults).
"""

from __future__ import annotations

import argparse

import numpy as np

from bubblecast.dataset import DatasetConfig, build_dataset
from bubblecast.forecast.suite import TRAINING, SuiteConfig, suite_events

HORIZONS = (1, 5, 10)


def frame(seed: int):
    """The test fixture's features frame for one suite seed."""
    events = suite_events(SuiteConfig(scenarios=TRAINING, runs=3, steps=160, replicas=1,
                                      seed=seed))
    return build_dataset(events, DatasetConfig())[0]


def coverage(model, held) -> list[float]:
    """p10-p90 coverage per horizon on ``held`` (as the test computes it)."""
    pred = model.predict_signal(held, model.horizons_)
    out = []
    for h in HORIZONS:
        y = held[f"y_h{h}"].to_numpy(float)
        ok = np.isfinite(y)
        q = pred[h][ok]
        out.append(float(np.mean((y[ok] >= q[:, 0]) & (y[ok] <= q[:, 2]))))
    return out


def main() -> None:
    from bubblecast.forecast.lgbm import LGBMForecaster
    from bubblecast.forecast.seq import SeqForecaster

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", type=int, nargs="+", default=[1, 3, 4, 5, 6])
    ap.add_argument("--held", type=int, nargs="+", default=[2, 7, 8, 9, 10, 11, 12, 13])
    args = ap.parse_args()
    held = {s: frame(s) for s in args.held}
    makers = {"lgbm": lambda: LGBMForecaster(n_estimators=60, seed=0),
              "gru": lambda: SeqForecaster(epochs=6, hidden=16, seed=0)}
    cov = {name: np.zeros((len(args.train), len(args.held), len(HORIZONS))) for name in makers}
    for i, t in enumerate(args.train):
        train = frame(t)
        for name, make in makers.items():
            model = make().fit(train)
            for j, s in enumerate(args.held):
                cov[name][i, j] = coverage(model, held[s])
                print(name, f"train {t} held {s}", np.round(cov[name][i, j], 4), flush=True)
    for name, c in cov.items():
        print(f"{name}: mean {c.mean():.4f}, sd {c.std(ddof=1):.4f}; between training suites "
              f"{c.mean(axis=(1, 2)).std(ddof=1):.4f}, between held-out suites "
              f"{c.std(axis=1, ddof=1).mean():.4f}; max |c - 0.8| {np.abs(c - 0.8).max():.4f}")


if __name__ == "__main__":
    main()
