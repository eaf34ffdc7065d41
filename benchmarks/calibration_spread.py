"""Held-out p10-p90 coverage of LightGBM and the GRU on runs of new seeds, per horizon and scenario.

Runs are simulated by :func:`~bubblecast.forecast.suite.suite_events` (its pipeline shapes,
4 stages, one replica, ``--steps`` steps); every model is trained on runs of one seed and
scored on runs of other seeds (no run shared). Three training mixes:

* ``one-seed``: 24 ``mixed`` runs of one seed, tested on 8 ``mixed`` runs of each held-out seed
  (issue 23's case);
* ``single``: 24 runs of one scenario, tested on 8 runs of that scenario per held-out seed;
* ``pooled``: 6 runs of each scenario (throttle, seqlen, thermal, failslow, mixed) of one
  seed, tested on 8 runs of each scenario per held-out seed (overall and per scenario).

Models: ``gru`` (:class:`~bubblecast.forecast.seq.SeqForecaster`) and ``lgbm``
(:class:`~bubblecast.forecast.lgbm.LGBMForecaster`), each as its module fits it: fit /
early-stop / calibrate on three disjoint sets of runs (50% / 20% / 30%), Mondrian shifts by
volatility regime (:func:`~bubblecast.forecast.conformal.regime_shifts`).

Beside each model's own intervals (``static``), the intervals as the policy layer serves them
(``online``): :class:`~bubblecast.forecast.conformal.AdaptiveConformal` run over each held-out
run origin by origin, as :class:`~bubblecast.policy.speeds.ModelSpeeds` runs it (``served``:
:data:`~bubblecast.policy.speeds.SERVED_ACI`, a step decaying from 0.3 to 0.02), each interval
scored only once its target step is observed; and, for comparison, ACI with constant steps
(``--gammas``; 0.02 is the step served before the decaying one). A run's online coverage
includes ACI's burn-in from its first origin.

Each coverage comes with its standard error over runs (``se``: the standard deviation of the
per-run coverages over the square root of the number of test runs; neighbouring steps share
their errors, so runs, not rows, set the spread). Prints tables; writes
``benchmarks/results/calibration.json``.
Usage: ``python benchmarks/calibration_spread.py [--train-seeds 1 3] [--held-seeds 2 4]
[--steps 300] [--epochs 10] [--mixes one-seed single pooled] [--gammas 0.02 0.05 0.1]``.
With ``--record-model DIR`` it only scores a saved model on new runs of the scenarios
``models/default`` was trained on and records that in ``DIR/model.json`` (``coverage``;
:func:`record_model`).
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

from bubblecast.dataset import DatasetConfig, build_dataset  # noqa: E402
from bubblecast.forecast.suite import SuiteConfig, suite_events  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "calibration.json"
HORIZONS = (1, 5, 10)
SCENARIOS = ("throttle", "seqlen", "thermal", "failslow", "mixed")
BAND, SCENARIO_BAND = (0.78, 0.82), (0.75, 0.85)


def runs_frame(counts: dict[str, int], seed: int, steps: int) -> pd.DataFrame:
    """Features of ``counts[scenario]`` runs of each scenario (the same count for each), one
    replica, the suite's pipeline shapes, seeded by ``seed`` (:func:`suite_events`)."""
    runs = set(counts.values())
    assert len(runs) == 1, counts
    events = suite_events(SuiteConfig(scenarios=tuple(counts), runs=runs.pop(), steps=steps,
                                      replicas=1, seed=seed))
    return build_dataset(events, DatasetConfig())[0]


def makers(epochs: int) -> dict[str, Any]:
    from bubblecast.forecast.lgbm import LGBMForecaster
    from bubblecast.forecast.seq import SeqForecaster

    return {"lgbm": lambda s: LGBMForecaster(seed=s),
            "gru": lambda s: SeqForecaster(epochs=epochs, seed=s)}


def coverage(model: Any, held: pd.DataFrame, by: str | None = None) -> dict[str, Any]:
    """Per horizon: p10-p90 coverage of ``held``'s rows (``"all"``), its standard error over
    runs and the number of runs; with ``by``, also per value of that column."""
    return interval_coverage(held, model.predict_signal(held, list(HORIZONS)), by)


def aci_settings(gammas: list[float]) -> dict[str, dict[str, float]]:
    """The ACI settings scored online: ``served`` (:data:`~bubblecast.policy.speeds.
    SERVED_ACI`, what ``ModelSpeeds`` uses) and a constant step ``g`` for each of ``gammas``."""
    return {"served": served_aci(), **{f"{g:g}": {"gamma": g} for g in gammas}}


def online_intervals(held: pd.DataFrame, pred: dict[int, np.ndarray], aci_kw: dict[str, float]
                     ) -> dict[int, np.ndarray]:
    """``pred`` (``{h: (n, 3)}`` on ``held``'s rows) with each run's p10-p90 intervals
    recalibrated online by :class:`AdaptiveConformal` (``aci_kw``): origin by origin, the
    intervals whose target step the origin has observed are scored first (the run's ``y``
    per stage), then the origin's own are adjusted, as ``ModelSpeeds`` does live."""
    from bubblecast.forecast.conformal import AdaptiveConformal

    out = {h: np.array(pred[h], dtype=np.float64, copy=True) for h in HORIZONS}
    for _, part in held.reset_index(drop=True).groupby("run_id", sort=False):
        steps, stages = np.unique(part["step"]), np.unique(part["stage"])
        si = np.searchsorted(steps, part["step"].to_numpy())
        pi = np.searchsorted(stages, part["stage"].to_numpy())
        rows = part.index.to_numpy()
        q = np.full((len(steps), len(HORIZONS), len(stages), 3), np.nan)
        y = np.full((len(steps), len(stages)), np.nan)
        y[si, pi] = part["y"].to_numpy(np.float64)
        for j, h in enumerate(HORIZONS):
            q[si, j, pi] = pred[h][rows]
        aci = AdaptiveConformal(**aci_kw)
        for i in range(len(steps)):
            aci.observe(y[: i + 1], i)
            q[i] = aci.adjust(q[i], list(HORIZONS), i)
        for j, h in enumerate(HORIZONS):
            out[h][rows] = q[si, j, pi]
    return out


def interval_coverage(held: pd.DataFrame, pred: dict[int, np.ndarray], by: str | None = None
                      ) -> dict[str, Any]:
    """:func:`coverage` of the intervals ``pred`` (``{h: (n, 3)}`` on ``held``'s rows)."""
    out: dict[str, Any] = {}
    for h in HORIZONS:
        y = held[f"y_h{h}"].to_numpy(np.float64)
        ok = np.isfinite(y)
        inside = (y >= pred[h][:, 0]) & (y <= pred[h][:, 2])
        rows = pd.DataFrame({"run": held["run_id"].astype(str), "in": inside,
                             "group": held[by].astype(str) if by else "all"})[ok]
        parts = [("all", rows)] + (list(rows.groupby("group")) if by else [])
        for group, part in parts:
            per_run = part.groupby("run")["in"].mean()
            out.setdefault(str(group), {})[f"h{h}"] = {
                "coverage": float(part["in"].mean()),
                "se": float(per_run.std(ddof=1) / np.sqrt(len(per_run))),
                "runs": len(per_run), "rows": len(part)}
    return out


def mixes(args: argparse.Namespace) -> dict[str, list[tuple[str, dict[str, int], dict[str, int]]]]:
    """Per mix: (name, training counts, test counts) of each training set."""
    out: dict[str, list[tuple[str, dict[str, int], dict[str, int]]]] = {
        "one-seed": [("mixed", {"mixed": 24}, {"mixed": 8})],
        "single": [(s, {s: 24}, {s: 8}) for s in SCENARIOS if s != "mixed"],
        "pooled": [("pooled", dict.fromkeys(SCENARIOS, 6), dict.fromkeys(SCENARIOS, 8))]}
    return {k: v for k, v in out.items() if k in args.mixes}


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    records = []
    make = makers(args.epochs)
    for mix, sets in mixes(args).items():
        for name, train_counts, test_counts in sets:
            held = {s: runs_frame(test_counts, s, args.steps) for s in args.held_seeds}
            for t in args.train_seeds:
                train = runs_frame(train_counts, t, args.steps)
                for model_name, mk in make.items():
                    start = time.perf_counter()
                    model = mk(0).fit(train)
                    fit_s = time.perf_counter() - start
                    for s, frame in held.items():
                        by = "scenario" if mix == "pooled" else None
                        pred = model.predict_signal(frame, list(HORIZONS))
                        online = {name: interval_coverage(
                            frame, online_intervals(frame, pred, kw), by)
                            for name, kw in aci_settings(args.gammas).items()}
                        records.append({"mix": mix, "train": name, "model": model_name,
                                        "train_seed": t, "held_seed": s, "fit_s": fit_s,
                                        "train_runs": int(train["run_id"].nunique()),
                                        "coverage": interval_coverage(frame, pred, by),
                                        "online": online})
                        _print(records[-1])
    return records


def served_aci() -> dict[str, float]:
    """The ACI keywords the policy layer serves intervals with."""
    from bubblecast.policy.speeds import SERVED_ACI

    return dict(SERVED_ACI)


def _print(r: dict[str, Any]) -> None:
    kinds = [("static", r["coverage"])] + [(f"aci {g}", c) for g, c in r["online"].items()]
    for label, coverage_ in kinds:
        for group, cov in coverage_.items():
            cells = "  ".join(f"h{h} {cov[f'h{h}']['coverage']:.3f}±{cov[f'h{h}']['se']:.3f}"
                              for h in HORIZONS)
            print(f"{r['mix']:9} {r['train']:9} {r['model']:5} {label:12} train "
                  f"s{r['train_seed']} held s{r['held_seed']} {group:9} {cells}", flush=True)


def summary(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (mix, training set, model, intervals, test group): the coverages over every
    training and held-out seed and horizon, their range, and how many fall in the band
    (0.78-0.82 for the whole test set, 0.75-0.85 for a scenario of the pooled mix).
    ``intervals`` is ``static`` (the model's own) or ``online`` (ACI: ``aci`` ``served``, the
    policy layer's, or a constant step ``gamma``)."""
    rows: dict[tuple[str, str, str, str, str | None, str], list[float]] = {}
    for r in records:
        kinds = [("static", None, r["coverage"])] + [
            ("online", name, c) for name, c in r.get("online", {}).items()]
        for intervals, aci, coverage_ in kinds:
            for group, cov in coverage_.items():
                rows.setdefault((r["mix"], r["train"], r["model"], intervals, aci, group),
                                []).extend(cov[f"h{h}"]["coverage"] for h in HORIZONS)
    out = []
    for (mix, train, model, intervals, aci, group), values in rows.items():
        lo, hi = SCENARIO_BAND if group != "all" else BAND
        v = np.array(values)
        out.append({"mix": mix, "train": train, "model": model, "intervals": intervals,
                    "aci": aci,
                    "gamma": None if aci in (None, "served") else float(aci),
                    "group": group,
                    "mean": float(v.mean()), "min": float(v.min()), "max": float(v.max()),
                    "band": [lo, hi], "in_band": int(((v >= lo) & (v <= hi)).sum()),
                    "n": len(v)})
    return out


def headline(table: list[dict[str, Any]]) -> dict[str, str]:
    """Per model and mix, ``"k/n"``: how many of the readings (seeds x horizons) fall in the
    band; for the pooled mix, the whole test set and its scenarios apart. The model's own
    intervals are ``..._in_band``; served (the policy layer's ACI) ``..._online_in_band``;
    with a constant step ``..._online_g{gamma}_in_band``."""
    counts: dict[str, list[int]] = {}
    for s in table:
        part = "_scenarios" if s["group"] != "all" else ""
        if s.get("intervals", "static") == "online":
            part += "_online" if s["aci"] == "served" else f"_online_g{s['aci']}"  # its value
        key = f"{s['model']}_{s['mix'].replace('-', '_')}{part}_in_band"
        k, n = counts.setdefault(key, [0, 0])
        counts[key] = [k + s["in_band"], n + s["n"]]
    return {key: f"{k}/{n}" for key, (k, n) in counts.items()}


#: The scenarios of the sample runs ``models/default`` was trained on (``data/sim``).
SAMPLE_SCENARIOS = ("throttle", "failslow", "periodic", "seqlen", "mixed", "jitter")


def record_model(directory: str, seed: int, runs: int, steps: int) -> dict[str, Any]:
    """Score the saved model in ``directory`` on ``runs`` new runs of each scenario it was
    trained on, simulated as the sample runs were but with seeds ``seed * 1000 + i`` (the
    sample's are 11-16), and write the result as its ``model.json``'s
    ``coverage`` field (overall and per scenario, with standard errors over runs)."""
    from bubblecast.forecast.modeldir import load_model, record_coverage
    from bubblecast.sim.simulator import SimConfig, simulate_events
    from bubblecast.telemetry.events import Events

    model = load_model(directory)
    parts = [simulate_events(SimConfig(  # the sample runs' pipeline (data/README.md)
        schedule="1f1b", stages=4, microbatches=8, model="uniform:16", steps=steps,
        scenario=scenario, seed=seed * 1000 + i, runs=runs, run_id=scenario))
        for i, scenario in enumerate(SAMPLE_SCENARIOS)]
    held = build_dataset(Events.concat(parts), model.dataset_config_ or DatasetConfig())[0]
    held["scenario"] = held["run_id"].astype(str).str.rsplit("-", n=1).str[0]
    cov = coverage(model, held, by="scenario")
    whole = cov.pop("all")
    doc = {"held_out": whole, "per_scenario": cov, "band": list(BAND),
           "scenario_band": list(SCENARIO_BAND),
           "runs": f"{runs} runs of {steps} steps per scenario (1F1B, 4 stages, 8 "
                   f"micro-batches, 16 layers, as data/sim), seeds {seed}000-"
                   f"{seed}00{len(SAMPLE_SCENARIOS) - 1} (no training run shared)",
           "command": f"python benchmarks/calibration_spread.py --record-model {directory} "
                      f"--record-seed {seed} --record-runs {runs} --steps {steps}"}
    record_coverage(directory, doc)
    for group, c in {"all": whole, **cov}.items():
        print(f"{directory} {group:9} " + "  ".join(
            f"h{h} {c[f'h{h}']['coverage']:.3f}±{c[f'h{h}']['se']:.3f}" for h in HORIZONS))
    return doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train-seeds", type=int, nargs="+", default=[1, 3])
    ap.add_argument("--held-seeds", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--epochs", type=int, default=10, help="GRU epochs (early stopping).")
    ap.add_argument("--mixes", nargs="+", default=["one-seed", "single", "pooled"])
    ap.add_argument("--gammas", type=float, nargs="+",
                    default=[0.02, 0.05, 0.1],
                    help="other constant ACI steps the online intervals are also scored at, "
                         "beside the policy layer's own (decaying) one.")
    ap.add_argument("--record-model", help="Only score this saved model directory on new "
                    "runs and record its coverage in its model.json (no benchmark).")
    ap.add_argument("--record-seed", type=int, default=7)
    ap.add_argument("--record-runs", type=int, default=8)
    args = ap.parse_args()
    if not all(g > 0 for g in args.gammas):
        ap.error(f"--gammas: every ACI step must be > 0, got {args.gammas}")
    if args.record_model:
        record_model(args.record_model, args.record_seed, args.record_runs, args.steps)
        return
    records = run(args)
    table = summary(records)
    print(f"\n{'mix':9} {'train':9} {'model':5} {'intervals':11} {'test':9} mean   min    "
          "max    in band")
    for s in table:
        label = s["intervals"] + (f" {s['aci']}" if s["aci"] is not None else "")
        print(f"{s['mix']:9} {s['train']:9} {s['model']:5} {label:11} {s['group']:9} "
              f"{s['mean']:.3f}  "
              f"{s['min']:.3f}  {s['max']:.3f}  {s['in_band']}/{s['n']} in {s['band']}")
    doc = run_header("calibration", script="calibration_spread.py",
                     train_seeds=args.train_seeds, held_seeds=args.held_seeds, steps=args.steps,
                     epochs=args.epochs, band=list(BAND), gammas=args.gammas,
                     served_aci=served_aci(), scenario_band=list(SCENARIO_BAND))
    doc.update(headline(table))
    write_json(RESULTS, {**doc, "summary": table, "records": records})


if __name__ == "__main__":
    main()
