"""How often a *static* p10-p90 interval can read in band on new runs: the run-sampling bound.

``calibration_spread.py`` scores each model's own intervals once per training and held-out
seed: 8 test runs per scenario, shifts fitted on the 7 (24 ``mixed`` runs) or 9 (30 pooled
runs) calibration runs a 50/20/30 split leaves. Both counts are small against how much a
``mixed`` run's coverage varies from run to run. This benchmark measures what those counts
allow, with the model's own raw quantiles and its own calibration procedure
(:func:`~bubblecast.forecast.conformal.regime_shifts`, the Mondrian shifts by volatility
regime every model fits):

1. train the model on the mix's runs of ``--train-seeds`` (as ``calibration_spread.py``);
2. simulate a pool of ``--pool`` new runs per test scenario (``--pool-seed``) and take the
   model's raw intervals on it (its shifts set to zero);
3. ``--resamples`` times: draw 8 test runs per scenario from the pool (and, apart, 24: a test
   set three times larger), and calibration runs
   from the rest of it: as many as the model's own split had (``own``), every training run
   (``train``: 24 or 30, more than any split can leave) and every remaining pool run
   (``rest``: calibrated on the test runs' own distribution, leaving the test draw and, for
   the pooled mix, the regime groups' conditioning); fit the regime shifts on the
   calibration runs, score the test runs.

For the pooled mix, also calibrations by *oracle groups*: each scenario's shifts fitted on its
own runs alone (``scenario_own``: 2 runs per scenario, the 9 of the model's split spread over
the five; ``scenario_train``: 6, as many as the mix trains on; ``scenario_rest``: all the rest
of its pool runs). No model knows a run's scenario; these say what conditioning on it would
reach at those run counts.

Each reading (coverage of one test draw at one horizon) is judged as
``calibration_spread.py`` judges it: 0.78-0.82 for the whole test set, 0.75-0.85 for a
scenario of the pooled mix. ``in_band`` is the share of resampled readings in band, ``sd``
their standard deviation, ``all_horizons_in_band`` the share of test draws whose readings
are in band at every horizon (what the goal asks of one model on one test set). Also
reported: the readings of the model's own shifts (``fitted``) on the same test draws, and
the per-run coverage spread.
Prints a table; writes ``benchmarks/results/calibration_bound.json``.
Usage: ``python benchmarks/calibration_bound.py [--train-seeds 1 3] [--pool 64]
[--pool-seed 5] [--resamples 200] [--models lgbm gru] [--mixes one-seed pooled]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import run_header, write_json  # noqa: E402
from calibration_spread import (  # noqa: E402
    BAND,
    HORIZONS,
    SCENARIO_BAND,
    SCENARIOS,
    makers,
    runs_frame,
)

from bubblecast.forecast.conformal import (  # noqa: E402
    frame_regimes,
    group_bounds,
    regime_ids,
    regime_shifts,
)

RESULTS = Path(__file__).resolve().parent / "results" / "calibration_bound.json"
#: The calibrations scored (module docstring).
KINDS = ("fitted", "own", "train", "rest", "scenario_own", "scenario_train", "scenario_rest")
#: Test runs per scenario of each resample: the 8 ``calibration_spread.py`` scores, and 24.
TEST_RUNS = (8, 24)
#: Per mix: training counts, test scenarios, and the calibration runs a 50/20/30 split of the
#: training runs leaves (``fit_splits``: floor(0.3 x runs)).
MIXES: dict[str, tuple[dict[str, int], tuple[str, ...], int]] = {
    "one-seed": ({"mixed": 24}, ("mixed",), 7),
    "pooled": (dict.fromkeys(SCENARIOS, 6), SCENARIOS, 9),
}


class RawPool:
    """A model's raw (unshifted) log p10/p90, the log targets and regime values of a pool of
    runs, per horizon, with each row's run index: what resampled calibrations score."""

    def __init__(self, model: Any, frame: pd.DataFrame) -> None:
        own = model.shifts_
        window = own[HORIZONS[0]].get("window", ())
        self.window = int(window[0]) if window else None
        try:  # zero shifts, one group: the model's raw sorted quantiles
            model.shifts_ = {h: {"all": (0.0, 0.0), "edges": (), "window": tuple(window)}
                             for h in HORIZONS}
            raw = model.predict_signal(frame, list(HORIZONS))
        finally:
            model.shifts_ = own
        runs = frame["run_id"].astype(str).to_numpy()
        self.run_names, self.run_of = np.unique(runs, return_inverse=True)
        self.row_scenario = frame["scenario"].astype(str).to_numpy()
        self.run_scenario = np.empty(len(self.run_names), dtype=object)  # per run index
        self.run_scenario[self.run_of] = self.row_scenario
        self.regime = frame_regimes(frame, self.window)
        with np.errstate(divide="ignore", invalid="ignore"):
            self.lo = {h: np.log(raw[h][:, 0]) for h in HORIZONS}
            self.hi = {h: np.log(raw[h][:, 2]) for h in HORIZONS}
            self.y = {h: np.log(frame[f"y_h{h}"].to_numpy(np.float64)) for h in HORIZONS}
        self.own = own

    def rows(self, runs: np.ndarray) -> np.ndarray:
        """Row mask of the runs with indices ``runs``."""
        return np.isin(self.run_of, runs)

    def inside(self, h: int, shifts: dict[str, tuple[float, ...]], rows: np.ndarray
               ) -> np.ndarray:
        """Whether each of ``rows``'s targets at ``h`` lies in its interval under ``shifts``
        (NaN where the target is unknown)."""
        ids = regime_ids(shifts, self.regime[rows])
        lo_b, hi_b = group_bounds(shifts, int(ids.max()) + 1 if len(ids) else 1)
        y = self.y[h][rows]
        out = ((y >= self.lo[h][rows] - lo_b[ids]) & (y <= self.hi[h][rows] + hi_b[ids]))
        return np.where(np.isfinite(y), out, np.nan)

    def fit(self, h: int, rows: np.ndarray) -> dict[str, tuple[float, ...]]:
        """The model's calibration (:func:`regime_shifts`) fitted on ``rows``."""
        return regime_shifts(self.lo[h][rows], self.hi[h][rows], self.y[h][rows],
                             self.regime[rows], 0.8, window=self.window)


def draw(pool: RawPool, scenarios: tuple[str, ...], n_test: int, n_cal: dict[str, int | None],
         rng: np.random.Generator) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """One resample: ``n_test`` test runs per scenario, and per calibration size the
    calibration runs drawn from the rest of the pool (``None``: all of the rest)."""
    by = {s: np.flatnonzero(pool.run_scenario == s) for s in scenarios}
    test = np.concatenate([rng.choice(v, n_test, replace=False) for v in by.values()])
    rest = rng.permutation(np.setdiff1d(np.concatenate(list(by.values())), test))
    return test, {k: rest if n is None else rest[:n] for k, n in n_cal.items()}


def readings(pool: RawPool, h: int, shifts: dict[str, dict[str, tuple[float, ...]]],
             rows: np.ndarray, scenarios: tuple[str, ...]) -> dict[str, float]:
    """Coverage of the test runs' ``rows`` (a row mask) at ``h``, each scenario's runs under
    ``shifts[scenario]``: ``all`` and, with several scenarios, per scenario."""
    index = np.flatnonzero(rows)
    names = pool.row_scenario[index]
    inside = np.full(len(index), np.nan)
    for sc in scenarios:
        part = names == sc
        inside[part] = pool.inside(h, shifts[sc], index[part])
    out = {"all": float(np.nanmean(inside))}
    if len(scenarios) > 1:
        out.update({sc: float(np.nanmean(inside[names == sc])) for sc in scenarios})
    return out


def by_scenario(pool: RawPool, runs: np.ndarray, per: int | None, scenarios: tuple[str, ...]
                ) -> dict[str, np.ndarray]:
    """Per scenario, its first ``per`` runs of ``runs`` (``None``: all of them)."""
    names = pool.run_scenario[runs]
    return {sc: runs[names == sc][:per] for sc in scenarios}


def per_run_sd(pool: RawPool, h: int, shifts: dict[str, tuple[float, ...]],
               scenario: str) -> float:
    """Standard deviation over the pool's runs of ``scenario`` of each run's own coverage."""
    rows = pool.rows(np.flatnonzero(pool.run_scenario == scenario))
    inside = pool.inside(h, shifts, rows)
    per = pd.Series(inside).groupby(pool.run_of[rows]).mean()
    return float(per.std(ddof=1))


def resample(pool: RawPool, mix: str, n_test: int, resamples: int, seed: int
             ) -> dict[str, Any]:
    """Summaries of every reading of every resample with ``n_test`` test runs per scenario,
    per calibration size and group (horizons pooled)."""
    train_counts, scenarios, own_cal = MIXES[mix]
    n_cal = {"own": own_cal, "train": sum(train_counts.values()), "rest": None}
    per_own = -(-own_cal // len(scenarios))  # the own count spread over the scenarios
    per_train = max(train_counts.values())
    rng = np.random.default_rng(seed)
    values: dict[str, dict[str, list[float]]] = {}
    oracle = (("scenario_own", per_own), ("scenario_train", per_train),
              ("scenario_rest", None)) if len(scenarios) > 1 else ()
    for _ in range(resamples):
        test, cals = draw(pool, scenarios, n_test, n_cal, rng)
        # row masks once per resample, for every horizon
        test_rows = pool.rows(test)
        cal_rows = {kind: pool.rows(runs) for kind, runs in cals.items()}
        # oracle groups: each scenario calibrated on its own runs
        group_rows = {kind: {sc: pool.rows(runs) for sc, runs in
                             by_scenario(pool, cals["rest"], per, scenarios).items()}
                      for kind, per in oracle}
        for h in HORIZONS:
            fits = {kind: dict.fromkeys(scenarios, pool.fit(h, rows))
                    for kind, rows in cal_rows.items()}
            fits["fitted"] = dict.fromkeys(scenarios, pool.own[h])
            fits.update({kind: {sc: pool.fit(h, rows) for sc, rows in by.items()}
                         for kind, by in group_rows.items()})
            for kind, shifts in fits.items():
                for g, v in readings(pool, h, shifts, test_rows, scenarios).items():
                    values.setdefault(kind, {}).setdefault(g, []).append(v)
    out = {}
    for kind, groups in values.items():
        out[kind] = {}
        for g, v in groups.items():
            lo, hi = BAND if g == "all" else SCENARIO_BAND
            a = np.array(v)  # resample-major, horizons within
            inside = (a >= lo) & (a <= hi)
            out[kind][g] = {"mean": float(a.mean()), "sd": float(a.std(ddof=1)),
                            "in_band": float(inside.mean()), "n": len(a),
                            "all_horizons_in_band": float(
                                inside.reshape(-1, len(HORIZONS)).all(axis=1).mean()),
                            "band": [lo, hi]}
    out["calibration_runs"] = {k: (v if v is not None else "rest") for k, v in n_cal.items()}
    if len(scenarios) > 1:
        out["calibration_runs"].update({"scenario_own": f"{per_own} per scenario",
                                        "scenario_train": f"{per_train} per scenario",
                                        "scenario_rest": "rest, per scenario"})
    out["per_run_sd"] = {s: float(np.mean([per_run_sd(pool, h, pool.own[h], s)
                                           for h in HORIZONS])) for s in scenarios}
    return out


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    records = []
    make = {k: v for k, v in makers(args.epochs).items() if k in args.models}
    for mix in args.mixes:
        train_counts, scenarios, _ = MIXES[mix]
        pool_frame = runs_frame(dict.fromkeys(scenarios, args.pool), args.pool_seed, args.steps)
        for t in args.train_seeds:
            train = runs_frame(train_counts, t, args.steps)
            for name, mk in make.items():
                start = time.perf_counter()
                model = mk(0).fit(train)
                pool = RawPool(model, pool_frame)
                for n_test in TEST_RUNS:
                    rec = {"mix": mix, "model": name, "train_seed": t, "test_runs": n_test,
                           **resample(pool, mix, n_test, args.resamples, args.seed + t)}
                    rec["seconds"] = time.perf_counter() - start
                    records.append(rec)
                    _print(rec)
    return records


def _print(r: dict[str, Any]) -> None:
    for kind in KINDS:
        for g, v in r.get(kind, {}).items():
            n = r["calibration_runs"].get(kind, "model's")
            print(f"{r['mix']:9} {r['model']:5} s{r['train_seed']} test {r['test_runs']:2} "
                  f"{kind:6} cal {n!s:5} "
                  f"{g:9} mean {v['mean']:.3f}  sd {v['sd']:.3f}  in band "
                  f"{v['in_band']:.2f}, every horizon {v['all_horizons_in_band']:.2f} "
                  f"{v['band']}", flush=True)
    print(f"{r['mix']:9} {r['model']:5} s{r['train_seed']} per-run sd "
          + "  ".join(f"{s} {v:.3f}" for s, v in r["per_run_sd"].items()), flush=True)


def headline(records: list[dict[str, Any]]) -> dict[str, float]:
    """Per model, mix, calibration size, test size (``t8``, ``t24``) and test group (the
    whole set, or ``scenarios``: every scenario of the pooled mix): the share of resampled
    readings in band, over the training seeds (``..._in_band_share``), and of test draws
    in band at every horizon (``..._every_horizon_share``)."""
    acc: dict[str, list[float]] = {}
    for r in records:
        for kind in KINDS:
            for g, v in r.get(kind, {}).items():
                part = "" if g == "all" else "_scenarios"
                key = f"{r['model']}_{r['mix'].replace('-', '_')}{part}_{kind}_t{r['test_runs']}"
                acc.setdefault(f"{key}_in_band_share", []).append(v["in_band"])
                acc.setdefault(f"{key}_every_horizon_share", []).append(
                    v["all_horizons_in_band"])
    return {k: round(float(np.mean(v)), 3) for k, v in acc.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train-seeds", type=int, nargs="+", default=[1, 3])
    ap.add_argument("--pool", type=int, default=64, help="pool runs per test scenario")
    ap.add_argument("--pool-seed", type=int, default=5)
    ap.add_argument("--resamples", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0, help="seed of the resampling")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--epochs", type=int, default=10, help="GRU epochs (early stopping).")
    ap.add_argument("--models", nargs="+", default=["lgbm", "gru"], choices=["lgbm", "gru"])
    ap.add_argument("--mixes", nargs="+", default=list(MIXES), choices=list(MIXES))
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    need = max(TEST_RUNS) + max(sum(MIXES[m][0].values()) for m in args.mixes)
    if args.pool < need:
        ap.error(f"--pool: needs at least {need} runs per scenario ({max(TEST_RUNS)} test "
                 f"runs and as many calibration runs as the mix trains on), got {args.pool}")
    records = run(args)
    doc = run_header("calibration_bound", script="calibration_bound.py",
                     train_seeds=args.train_seeds, pool=args.pool, pool_seed=args.pool_seed,
                     resamples=args.resamples, seed=args.seed, steps=args.steps,
                     epochs=args.epochs, test_runs=list(TEST_RUNS), band=list(BAND),
                     scenario_band=list(SCENARIO_BAND))
    doc.update(headline(records))
    write_json(args.out, {**doc, "records": records})


if __name__ == "__main__":
    main()
