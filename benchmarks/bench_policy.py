"""Offline policy evaluation on a held-out scenario suite: static, reactive, predictive, oracle.

Simulates runs (1F1B, 4 stages, 8 microbatches, 32 equal layers sized like the zero-bubble
paper's 1.3B-class stage times, 0.6 ms p2p) for each scenario with seeds never used for
training or tuning (90000 + k; tuning used ``--dev`` seeds 1000 + k), evaluates every policy
with :func:`bubblecast.policy.policy_evaluation.evaluate_events` and reports, per scenario, mean
step time and the saving over static of each policy, the predictive policy's share of the
oracle's gain, and the Done-means checks of issue 6:

- predictive captures >= 90% of the oracle's gain over static, on average (the plain mean over
  runs where the oracle gains anything; the gain-weighted ratio is reported beside it);
- predictive is never > 0.5% slower than static on any run;
- on throttle and ramped-failslow runs, predictive's saving over static >= 1.1 x reactive's;
- on stationary runs (none, jitter) predictive is never > 1% slower than static.

``failslow-ramped`` is the simulator's failslow with a gradual onset (a ``Scenario`` defined
here: the simulator's own failslow ramps over 1-5 steps, which no forecaster can foresee).
Migration: per-layer parameters of 40M bf16 values (80 MB; with Adam state 560 MB moved per
layer) over 5 GB/s plus a 2 s pause per repartition (barrier, two-phase commit, rebuilding the
stages and schedule); ``--sensitivity`` reruns throttle and failslow-ramped with other pauses,
``--ramps`` reruns failslow-ramped with longer ramps (how foreseeable a slowdown is decides
what prediction can earn over reacting: the oracle's own ratio is reported as the bound).

    python benchmarks/bench_policy.py [--steps 1500] [--seeds 4] [--dev] [--model DIR]
                                      [--forecasters trend,lgbm,model]
                                      [--sensitivity 0.5,8] [--ramps 150-400,400-800]

Predictive runs once per forecaster: the built-in trend, a LightGBM model trained here on
tuning-seed runs of the same setup (``lgbm``), and ``--model`` (``model``). Reported side by
side: predictive's share of the oracle's gain as the plain mean over runs (the headline) and
gain-weighted (summed gains over summed oracle gains), and each run's loss against static.
Prints a table per forecaster and writes benchmarks/results/bench_policy.json (``--dev``:
bench_policy_dev.json).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from bubblecast.policy.cost import MigrationConstants
from bubblecast.policy.policy_evaluation import EvalConfig, evaluate_events
from bubblecast.sim.scenarios import RunShape, Scenario, ScenarioDraw, make_scenario
from bubblecast.sim.simulator import SimConfig, simulate_events
from bubblecast.sim.workload import Workload
from bubblecast.telemetry import atomic_write_text

RESULTS = Path(__file__).resolve().parent / "results"
SCENARIOS = ("none", "jitter", "throttle", "failslow", "failslow-ramped", "periodic", "seqlen",
             "mixed")
POLICIES = ["static", "reactive", "predictive", "oracle"]
LAYERS, STAGES, MICROBATCHES = 32, 4, 8
F_MS, B_MS, W_MS, COMM_MS = 18.522, 18.086, 9.337, 0.601  # per stage (zero-bubble Table 5)
PARAM_BYTES = 80e6
MIGRATION = MigrationConstants(bandwidth_Bps=5e9, fixed_pause_s=2.0, optimizer_factor=6.0)


@dataclass(frozen=True)
class RampedFailSlow(Scenario):
    """Fail-slow with a gradual onset: a rank's slowdown ramps to ``factor`` over ``ramp_min..
    ramp_max`` steps, holds for ``duration_min..duration_max`` steps, then recovers as fast
    as the simulator's failslow (1-5 steps)."""

    name: ClassVar[str] = "failslow-ramped"
    factor_min: float = 1.5
    factor_max: float = 3.0
    ramp_min: int = 30
    ramp_max: int = 150
    duration_min: int = 200
    duration_max: int = 1000
    noise_sigma: float = 0.01

    def draw(self, shape: RunShape) -> ScenarioDraw:
        rng = self.rng()
        rank = int(rng.integers(0, shape.ranks))
        onset = int(rng.integers(0, max(1, shape.steps // 2)))
        ramp = int(rng.integers(self.ramp_min, self.ramp_max + 1))
        duration = int(rng.integers(self.duration_min, self.duration_max + 1))
        factor = float(rng.uniform(self.factor_min, self.factor_max))
        recover = int(rng.integers(1, 6))
        s = np.arange(shape.steps, dtype=np.float64)
        up = np.clip((s - onset) / ramp, 0, 1)
        down = np.clip((onset + ramp + duration + recover - s) / recover, 0, 1)
        speed = np.ones((shape.steps, shape.ranks))
        speed[:, rank] = 1.0 + (factor - 1.0) * np.minimum(up, down)
        return ScenarioDraw(speed, self.noise_sigma, info={
            "rank": rank, "onset": onset, "ramp": ramp, "duration": duration, "factor": factor})


def scenario(name: str) -> Scenario | str:
    if name == "failslow-ramped":
        return RampedFailSlow()
    make_scenario(name)  # validates the name
    return name


def workload() -> Workload:
    base = Workload.uniform(LAYERS, F_MS, B_MS, W_MS, stages=STAGES)
    return Workload(base.forward, base.backward, base.weight,
                    param_bytes=np.full(LAYERS, PARAM_BYTES), name=f"uniform:{LAYERS}")


def run_suite(steps: int, seeds: int, base_seed: int, model: Any | None,
              scenarios: tuple[str, ...], migration: MigrationConstants = MIGRATION,
              overrides: dict[str, Scenario] | None = None) -> dict[str, Any]:
    """Evaluate every policy on ``seeds`` runs of each scenario (``overrides`` replaces a
    scenario's default parameters, e.g. a longer ramp)."""
    config = EvalConfig(migration=migration)
    out: dict[str, Any] = {}
    for name in scenarios:
        t0 = time.perf_counter()
        ev = simulate_events(SimConfig(
            schedule="1f1b", stages=STAGES, microbatches=MICROBATCHES, model=workload(),
            comm=COMM_MS, steps=steps, scenario=(overrides or {}).get(name) or scenario(name),
            seed=base_seed, runs=seeds, run_id=name))
        result, _ = evaluate_events(ev, POLICIES, config, model)
        out[name] = {"runs": result["runs"], "policies": result["policies"],
                     "forecaster": result["forecaster"], "seconds": time.perf_counter() - t0}
        print(f"  {name}: {time.perf_counter() - t0:.1f} s", flush=True)
    return out


def train_lgbm(steps: int, seeds: int, scenarios: tuple[str, ...]) -> Any:
    """A LightGBM forecaster trained on tuning-seed runs (1000 + k, never evaluated) of the
    same setup, small settings (150 trees)."""
    from bubblecast.dataset import DatasetConfig, build_dataset
    from bubblecast.forecast.lgbm import LGBMForecaster
    from bubblecast.telemetry.events import Events

    parts = [simulate_events(SimConfig(
        schedule="1f1b", stages=STAGES, microbatches=MICROBATCHES, model=workload(),
        comm=COMM_MS, steps=steps, scenario=scenario(name), seed=1000 + i, runs=max(seeds, 3),
        run_id=f"train-{name}")) for i, name in enumerate(scenarios)]
    frame, _ = build_dataset(Events.concat(parts), DatasetConfig())
    return LGBMForecaster(n_estimators=150, seed=0).fit(frame)


def checks(suite: dict[str, Any]) -> dict[str, Any]:
    runs = [r for s in suite.values() for r in s["runs"].values()]
    scored = [r for r in runs if r["oracle_gain"] is not None]
    pred = sum(r["policies"]["predictive"]["gain_vs_static"] for r in scored)
    orac = sum(r["oracle_gain"] for r in scored)
    ratios = {}
    for name in ("throttle", "failslow-ramped"):
        if name not in suite:
            continue
        rs = suite[name]["runs"].values()
        p, q, o = (float(np.mean([r["policies"][k]["gain_vs_static"] for r in rs]))
                   for k in ("predictive", "reactive", "oracle"))
        # The oracle's ratio bounds what any policy can reach on these runs.
        ratios[name] = {"predictive_saving": p, "reactive_saving": q, "oracle_saving": o,
                        "ratio": p / q if q > 0 else None,
                        "oracle_ratio": o / q if q > 0 else None,
                        "pass": bool(p >= 1.1 * q and p > 0)}
    stationary = [r for n in ("none", "jitter") if n in suite for r in suite[n]["runs"].values()]
    worst = max((r["policies"]["predictive"]["step_s"] / r["policies"]["static"]["step_s"] - 1
                 for r in stationary), default=None)
    share = pred / orac if orac > 0 else None
    plain = [r["policies"]["predictive"]["gain_vs_static"] / r["oracle_gain"] for r in scored]
    losses = sorted(((r["policies"]["predictive"]["step_s"] / r["policies"]["static"]["step_s"]
                      - 1, r["run_id"]) for r in runs), reverse=True)
    mean_share = float(np.mean(plain)) if plain else None
    return {
        "oracle_share_mean": {"value": mean_share, "runs": len(plain),
                              "pass": bool(mean_share is not None and mean_share >= 0.9)},
        "oracle_share": {"value": share, "runs": len(scored), "weighting": "gain-weighted",
                         "pass": bool(share is not None and share >= 0.9)},
        "losses_vs_static": {"worst": losses[0][0] if losses else None,
                             "runs_slower": [{"run": r, "loss": v} for v, r in losses if v > 0],
                             "runs_over_0.5%": sum(v > 0.005 for v, _ in losses),
                             "pass": bool(not losses or losses[0][0] <= 0.005)},
        "predictive_vs_reactive": ratios,
        "stationary_worst_slowdown": {"value": worst,
                                      "pass": bool(worst is not None and worst <= 0.01)},
    }


def _scenarios(suite: dict[str, Any]) -> dict[str, Any]:
    """The JSON form of a suite: per scenario its policies' summaries and every run's."""
    return {n: {"policies": s["policies"], "forecaster": s["forecaster"],
                "seconds": s["seconds"],
                "runs": {k: {"policies": r["policies"], "oracle_gain": r["oracle_gain"]}
                         for k, r in s["runs"].items()}}
            for n, s in suite.items()}


def print_table(suite: dict[str, Any], verdict: dict[str, Any]) -> None:
    head = f"{'scenario':16} {'runs':>4} " + " ".join(f"{p + ' ms':>13}" for p in POLICIES)
    head += (f" {'react gain':>10} {'pred gain':>10} {'orac gain':>10} {'share mean':>10}"
             f" {'share wtd':>10} {'worst loss':>10} {'moves P/O':>9}")
    print(head)
    for name, s in suite.items():
        pol = s["policies"]
        rs = list(s["runs"].values())
        gain = {p: float(np.mean([r["policies"][p]["gain_vs_static"] for r in rs]))
                for p in ("reactive", "predictive", "oracle")}
        share = pol["predictive"]["oracle_share"]
        mean = pol["predictive"].get("oracle_share_mean")
        worst = max(r["policies"]["predictive"]["step_s"] / r["policies"]["static"]["step_s"] - 1
                    for r in rs)
        moves = f"{pol['predictive']['actions']}/{pol['oracle']['actions']}"
        line = f"{name:16} {len(rs):>4} " + " ".join(
            f"{pol[p]['step_s'] * 1e3:13.2f}" for p in POLICIES)
        line += (f" {gain['reactive']:10.2%} {gain['predictive']:10.2%} {gain['oracle']:10.2%} "
                 f"{'-' if mean is None else f'{mean:.1%}':>10} "
                 f"{'-' if share is None else f'{share:.1%}':>10} {worst:10.2%} {moves:>9}")
        print(line)
    print()
    print(json.dumps(verdict, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--seeds", type=int, default=4, help="runs per scenario")
    ap.add_argument("--dev", action="store_true", help="tuning seeds (1000+), not held-out")
    ap.add_argument("--model", default=None, help="trained forecaster (dir or models:/ URI)")
    ap.add_argument("--forecasters", default="trend,lgbm",
                    help="predictive's forecasters: trend (built-in), lgbm (trained here on "
                         "tuning seeds), model (--model)")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--sensitivity", default="0.5,8",
                    help="other migration pauses (s) to rerun throttle and failslow-ramped at "
                         "('' to skip)")
    ap.add_argument("--ramps", default="150-400,400-800",
                    help="other failslow-ramped ramp lengths (steps, MIN-MAX) to rerun at the "
                         "default pause ('' to skip)")
    args = ap.parse_args()
    base_seed = 1000 if args.dev else 90000
    names = tuple(s for s in args.scenarios.split(",") if s)
    t0 = time.perf_counter()
    models: dict[str, Any] = {}
    for kind in (k.strip() for k in args.forecasters.split(",") if k.strip()):
        if kind == "trend":
            models[kind] = None
        elif kind == "lgbm":
            t1 = time.perf_counter()
            models[kind] = train_lgbm(args.steps, args.seeds, names)
            print(f"trained lgbm on tuning seeds: {time.perf_counter() - t1:.1f} s", flush=True)
        elif kind == "model" and args.model:
            from bubblecast.forecast.modeldir import load_model

            models[kind] = load_model(args.model)
        else:
            raise SystemExit(f"--forecasters: unknown '{kind}' (trend, lgbm, model with --model)")
    per: dict[str, Any] = {}
    for kind, model in models.items():
        print(f"\npredictive forecaster: {kind}")
        part = run_suite(args.steps, args.seeds, base_seed, model, names)
        per[kind] = {"suite": part, "checks": checks(part)}
        print_table(part, per[kind]["checks"])
    first = next(iter(per))
    verdict = per[first]["checks"]
    model = models[first]
    sensitivity = {}
    pauses = [float(x) for x in args.sensitivity.split(",") if x.strip()]
    focus = tuple(n for n in ("throttle", "failslow-ramped") if n in names)
    for pause in pauses:
        print(f"\nmigration pause {pause} s (bandwidth {MIGRATION.bandwidth_Bps:.3g} B/s):")
        other = replace(MIGRATION, fixed_pause_s=pause)
        part = run_suite(args.steps, args.seeds, base_seed, model, focus, other)
        sensitivity[str(pause)] = {"checks": checks(part)["predictive_vs_reactive"],
                                   "policies": {n: s["policies"] for n, s in part.items()}}
        print_table(part, sensitivity[str(pause)]["checks"])
    ramps = {}
    for spec in (x.strip() for x in args.ramps.split(",") if x.strip()):
        if "failslow-ramped" not in names:
            break
        lo, hi = (int(x) for x in spec.split("-"))
        print(f"\nfailslow-ramped with ramps of {lo}-{hi} steps:")
        part = run_suite(args.steps, args.seeds, base_seed, model, ("failslow-ramped",),
                         overrides={"failslow-ramped": RampedFailSlow(ramp_min=lo, ramp_max=hi)})
        ramps[spec] = {"checks": checks(part)["predictive_vs_reactive"],
                       "policies": {n: s["policies"] for n, s in part.items()}}
        print_table(part, ramps[spec]["checks"])
    doc = {"benchmark": "policy", "held_out": not args.dev, "base_seed": base_seed,
           "steps": args.steps, "seeds": args.seeds, "model": args.model,
           "setup": {"schedule": "1f1b", "stages": STAGES, "microbatches": MICROBATCHES,
                     "layers": LAYERS, "f_ms": F_MS, "b_ms": B_MS, "w_ms": W_MS,
                     "comm_ms": COMM_MS, "param_bytes_per_layer": PARAM_BYTES,
                     "migration": MIGRATION.to_json()},
           "forecasters": {k: {"checks": v["checks"], "scenarios": _scenarios(v["suite"])}
                           for k, v in per.items()},
           "checks": verdict, "sensitivity_fixed_pause_s": sensitivity,
           "sensitivity_ramp_steps": ramps,
           "wall_s": time.perf_counter() - t0, "python": platform.python_version()}
    target = RESULTS / ("bench_policy_dev.json" if args.dev else "bench_policy.json")
    atomic_write_text(target, json.dumps(doc, indent=1, default=float))
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
