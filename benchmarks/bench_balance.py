"""Balance the work every step: the planner's goals on simulated packed documents.

Setting (the issue's): 1F1B, 4 stages, 8 micro-batches, 4 data-parallel replicas, attention
share 0.5, ``uniform:16``, token budget 4096, scenario ``jitter`` at 1% per-op noise (the other
scenarios' default spread); two document regimes, (a)
``lognormal`` (documents at most a quarter of the budget) and (b) ``long-tail`` (single
documents up to the whole budget). Per regime:

1. **Cost model**: ``CostModel`` (LightGBM or non-negative linear, chosen on held-out runs)
   fitted on ``--train-runs`` runs of their own seed; its error is scored on the evaluation
   runs, which it never saw, beside the floor the per-op noise alone sets (the p90 of
   ``|noise - 1|``).
2. **Policies** on ``--runs`` evaluation runs, as ``policy-eval --policies
   static,tokens,balance,oracle --cost-model`` evaluates them: step time against the
   simulator's truth (noise-free), speed-up over static, share of the oracle's gain,
   imbalance degree (slowest micro-batch's true cost x micro-batches / total), and the bound
   (every micro-batch at the step's mean cost).
3. **One slow replica** (regime (a) and (b)): the same documents under ``slow-replica`` (one
   replica's ranks 1.5x from a step at 25-50% of the run). Recovery of the slowdown after the
   onset, from the first decision that has seen it (``onset + 1``) on: (blind - balance) /
   (blind - no fault), where blind is the same planner given equal replica speeds and no
   fault the same documents without the slowdown. The bound of integer micro-batch counts
   alone (equal-cost micro-batches, ``s_r (M_r + P - 1)``) is printed beside it.
4. **Outlier delay** (opt-in, regime (b)): the evaluation runs' document streams re-cut by
   :func:`bubblecast.policy.outlier_delay.delayed_batches`, planned by the learned cost, timed
   against the truth: speed-up in tokens per second over the same planner without the queue,
   and the mean delay of the delayed documents' tokens in steps.
5. **Decision time**: ``plan_batch`` on 1,024 ``lognormal`` documents, 8 replicas x 16
   micro-batches, 4 stages, with equal speeds and with one replica at 1.5x.

    python benchmarks/bench_balance.py [--runs 3] [--steps 200] [--train-runs 4]

Prints one table per part; writes benchmarks/results/balance.json. Headline figures are plain
means over the runs.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import run_header, write_json  # noqa: E402

REGIMES = {"a": "lognormal", "b": "long-tail"}
POLICIES = ("static", "tokens", "balance", "oracle")
SHAPE = {"schedule": "1f1b", "stages": 4, "microbatches": 8, "replicas": 4,
         "model": "uniform:16", "attention_share": 0.5, "token_budget": 4096}
SEEDS = {"train": 1000, "eval": 2000}


NOISE = 0.01


@functools.cache  # the outlier-delay part reads the regime's runs again
def simulate(preset: str, scenario: str, seed: int, runs: int, steps: int, tag: str) -> Any:
    from bubblecast.sim.scenarios import make_scenario
    from bubblecast.sim.simulator import SimConfig, simulate_events

    if scenario == "jitter":
        scenario = make_scenario("jitter", sigma=NOISE)
    return simulate_events(SimConfig(**SHAPE, documents=preset, scenario=scenario, seed=seed,
                                     runs=runs, steps=steps, run_id=f"{tag}-{preset}"))


def fit_cost_model(preset: str, runs: int, steps: int) -> tuple[Any, dict[str, Any]]:
    from bubblecast.forecast.cost_model import CostModel

    events = simulate(preset, "jitter", SEEDS["train"], runs, steps, "train")
    model = CostModel(learner="auto", seed=0).fit(events)
    return model, {"learner": model.learner_, "runs": runs, "steps": steps}


def policies(events: Any, model: Any, names: tuple[str, ...] = POLICIES,
             use_speeds: bool = True) -> Any:
    from bubblecast.policy.api import Policy, evaluate_policies

    specs = [Policy.balance(use_speeds=use_speeds) if n == "balance" else Policy(n)
             for n in names]
    return evaluate_policies(events, specs, cost_model=model)


def per_run(result: Any) -> list[dict[str, Any]]:
    """One row per run and policy: the figures the tables print."""
    rows = []
    for run_id, rep in result.report["runs"].items():
        for name, p in rep["policies"].items():
            rows.append({"run": run_id, "policy": name, "step_ms": 1e3 * p["step_s"],
                         "speedup": p["speedup_vs_static"], "oracle_share": p["oracle_share"],
                         "imbalance": p["imbalance_degree"], "decision_ms": p["decision_ms"],
                         "bound_ms": 1e3 * rep["bound_step_s"]})
    return rows


def step_series(result: Any, name: str) -> dict[str, np.ndarray]:
    """Per run, the policy's step seconds against the truth."""
    return {run_id: np.asarray(tr[name].step_s) for run_id, tr in result.traces.items()}


def regime_part(key: str, model: Any, fit: dict[str, Any], args: argparse.Namespace
                ) -> dict[str, Any]:
    preset = REGIMES[key]
    events = simulate(preset, "jitter", SEEDS["eval"] + ord(key), args.runs, args.steps,
                      f"eval-{key}")
    score = model.score(events)
    noise = np.random.default_rng(0).lognormal(-NOISE ** 2 / 2, NOISE, 200_000)
    score["noise_floor_p90"] = float(np.percentile(np.abs(noise - 1), 90))
    result = policies(events, model)
    rows = per_run(result)
    means = {n: {k: float(np.mean([r[k] for r in rows if r["policy"] == n]))
                 for k in ("step_ms", "speedup", "oracle_share", "imbalance", "decision_ms",
                           "bound_ms")} for n in POLICIES}
    bound_speedup = means["static"]["step_ms"] / means["static"]["bound_ms"]
    per_run_ahead = [r_b["speedup"] / r_t["speedup"] - 1 for r_b, r_t in zip(
        [r for r in rows if r["policy"] == "balance"],
        [r for r in rows if r["policy"] == "tokens"], strict=True)]
    return {"preset": preset, "cost_model": {**fit, "heldout": score}, "runs": rows,
            "mean": means, "bound_speedup": bound_speedup,
            "balance_ahead_of_tokens": {"per_run": per_run_ahead,
                                        "mean": float(np.mean(per_run_ahead))}}


def count_bound(speeds: list[float], microbatches: int, stages: int) -> float:
    """Recovery the best integer counts reach alone, micro-batches of equal cost: a replica
    takes ``s_r (M_r + P - 1)``; over every split of the same total."""
    r, total = len(speeds), len(speeds) * microbatches
    none = max(s * (microbatches + stages - 1) for s in speeds)
    fine = microbatches + stages - 1
    best = none
    for split in itertools.product(range(1, total), repeat=r - 1):
        last = total - sum(split)
        if last < 1:
            continue
        best = min(best, max(s * (m + stages - 1)
                             for s, m in zip(speeds, (*split, last), strict=True)))
    return (none - best) / (none - fine)


def slow_part(key: str, model: Any, args: argparse.Namespace) -> dict[str, Any]:
    preset = REGIMES[key]
    seed = SEEDS["eval"] + 100 + ord(key)
    fault = simulate(preset, "slow-replica", seed, args.runs, args.steps, f"slow-{key}")
    twin = simulate(preset, "none", seed, args.runs, args.steps, f"slow-{key}")
    aware = step_series(policies(fault, model, ("static", "balance")), "balance")
    blind = step_series(policies(fault, model, ("static", "balance"), use_speeds=False),
                        "balance")
    calm = step_series(policies(twin, model, ("static", "balance")), "balance")
    rows = []
    for run_id, info in ((r, fault.runs[r].extra["scenario"]["realised"]) for r in aware):
        start = int(info["onset"]) + 1
        a, b, c = (float(s[run_id][start:].mean()) for s in (aware, blind, calm))
        rows.append({"run": run_id, "onset": int(info["onset"]), "factor": info["factor"],
                     "replica": info["replica"], "aware_ms": 1e3 * a, "blind_ms": 1e3 * b,
                     "no_fault_ms": 1e3 * c, "recovery": (b - a) / (b - c)})
    speeds = [1.0] * (SHAPE["replicas"] - 1) + [float(rows[0]["factor"])]
    return {"preset": preset, "runs": rows,
            "recovery_mean": float(np.mean([r["recovery"] for r in rows])),
            "integer_counts_bound": count_bound(speeds, SHAPE["microbatches"],
                                                SHAPE["stages"])}


def delay_part(model: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Outlier delay on regime (b)'s evaluation streams (see the module doc)."""
    from bubblecast.policy.outlier_delay import delayed_batches, mean_token_delay
    from bubblecast.policy.work_plan import PlanConfig, plan_batch
    from bubblecast.policy.work_timing import predicted_plan_step
    from bubblecast.sim.documents import WorkCost, microbatch_stats

    events = simulate("long-tail", "jitter", SEEDS["eval"] + ord("b"), args.runs, args.steps,
                      "eval-b")
    cost = model.work_cost()
    config = PlanConfig(token_budget=SHAPE["token_budget"], replicas=SHAPE["replicas"],
                        microbatches=SHAPE["microbatches"], stages=SHAPE["stages"],
                        kind_weights=tuple(model.kind_weights()))
    ones = np.ones((SHAPE["replicas"], SHAPE["stages"]))

    def seconds_per_token(batches: list[np.ndarray], truth: WorkCost) -> float:
        total, tokens = 0.0, 0
        for x in batches:
            plan = plan_batch(x, config, cost)
            _, slot = plan.assignment(len(x))
            t, sq, d = microbatch_stats(x, slot, sum(plan.counts))
            true = truth.microbatch(t, sq, d)
            edges = np.cumsum([0, *plan.counts])
            total += predicted_plan_step("1f1b", SHAPE["stages"],
                                         [true[edges[r]:edges[r + 1]]
                                          for r in range(len(plan.counts))], ones, (1, 1, 1))
            tokens += int(x.sum())
        return total / tokens

    out = []
    for share in args.delay_shares:
        gains, delayed_mean, all_mean = [], [], []
        for run_id in events.run_ids:
            extra = events.runs[run_id].extra["documents"]
            truth = WorkCost.from_json(extra["cost"])
            batches = [np.asarray(x, dtype=np.int64) for x in extra["lengths"]]
            steps, tokens, delays = delayed_batches(
                np.concatenate(batches), config.total, config.token_budget,
                config.replicas, share, args.max_wait)
            base = seconds_per_token(batches[:len(steps)], truth)
            gains.append(base / seconds_per_token(steps, truth))
            late = delays > 0
            delayed_mean.append(mean_token_delay(tokens[late], delays[late]))
            all_mean.append(mean_token_delay(tokens, delays))
        out.append({"min_share": share, "max_wait": args.max_wait,
                    "speedup_per_run": gains, "speedup": float(np.mean(gains)),
                    "delayed_token_delay_steps": float(np.mean(delayed_mean)),
                    "all_token_delay_steps": float(np.mean(all_mean))})
    return {"preset": "long-tail", "settings": out}


def decision_part(args: argparse.Namespace) -> dict[str, Any]:
    from bubblecast.policy.work_plan import PlanConfig, plan_batch
    from bubblecast.sim.documents import DocumentSource, WorkCost

    source = DocumentSource("lognormal", SHAPE["token_budget"])
    cost = WorkCost.attention(0.5, source.mean_length(), SHAPE["token_budget"])
    config = PlanConfig(token_budget=SHAPE["token_budget"], replicas=8, microbatches=16,
                        stages=4)
    rng = np.random.default_rng(7)
    batches = [source.sample(rng, 1024) for _ in range(args.decisions)]
    out = {}
    for label, speeds in (("equal speeds", None), ("one replica 1.5x", [1.0] * 7 + [1.5])):
        times = []
        for x in batches:
            start = time.perf_counter()
            plan_batch(x, config, cost, speeds)
            times.append(time.perf_counter() - start)
        ms = 1e3 * np.asarray(times)
        out[label] = {"median_ms": float(np.median(ms)), "p90_ms": float(np.percentile(ms, 90)),
                      "mean_ms": float(ms.mean())}
    return {"documents": 1024, "replicas": 8, "microbatches": 16, "stages": 4,
            "samples": args.decisions, **out}


def show(doc: dict[str, Any]) -> None:
    for key, part in doc["regimes"].items():
        print(f"\n({key}) {part['preset']}: cost model {part['cost_model']['learner']}, "
              f"held-out p90 relative error {part['cost_model']['heldout']['p90_rel_error']:.4f}"
              f" (per-op noise alone: {part['cost_model']['heldout']['noise_floor_p90']:.4f})")
        print(f"{'run':<22}{'policy':<9}{'step ms':>9}{'speedup':>9}{'oracle':>8}"
              f"{'imbal.':>8}{'plan ms':>9}")
        for r in part["runs"]:
            share = "-" if r["oracle_share"] is None else f"{r['oracle_share']:.3f}"
            print(f"{r['run']:<22}{r['policy']:<9}{r['step_ms']:>9.2f}{r['speedup']:>9.3f}"
                  f"{share:>8}{r['imbalance']:>8.3f}{r['decision_ms']:>9.2f}")
        for name, m in part["mean"].items():
            print(f"{'mean':<22}{name:<9}{m['step_ms']:>9.2f}{m['speedup']:>9.3f}"
                  f"{m['oracle_share']:>8.3f}{m['imbalance']:>8.3f}{m['decision_ms']:>9.2f}")
        print(f"bound (every micro-batch at the step's mean): "
              f"{part['mean']['static']['bound_ms']:.2f} ms = {part['bound_speedup']:.3f}x "
              f"static; balance ahead of tokens by "
              f"{100 * part['balance_ahead_of_tokens']['mean']:.1f}% (mean)")
    for key, part in doc["slow_replica"].items():
        print(f"\nslow replica ({key}) {part['preset']}: recovery per run "
              + ", ".join(f"{r['recovery']:.3f}" for r in part["runs"])
              + f"; mean {part['recovery_mean']:.3f} (integer counts alone, equal micro-batches: "
              f"{part['integer_counts_bound']:.3f})")
    for s in doc["outlier_delay"]["settings"]:
        print(f"outlier delay (b), min share {s['min_share']}: speed-up {s['speedup']:.3f} "
              f"(tokens/s), delayed tokens wait {s['delayed_token_delay_steps']:.2f} steps, "
              f"all tokens {s['all_token_delay_steps']:+.2f}")
    d = doc["decision"]
    for label in ("equal speeds", "one replica 1.5x"):
        print(f"decision, 1,024 documents, 8x16, {label}: median {d[label]['median_ms']:.2f} ms,"
              f" p90 {d[label]['p90_ms']:.2f} ms")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--train-runs", type=int, default=4)
    parser.add_argument("--decisions", type=int, default=50)
    parser.add_argument("--delay-shares", type=float, nargs="+", default=[0.5, 0.75])
    parser.add_argument("--max-wait", type=int, default=4)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"
                                             / "balance.json"))
    args = parser.parse_args(argv)
    start = time.perf_counter()
    fits = {k: fit_cost_model(REGIMES[k], args.train_runs, args.steps) for k in REGIMES}
    regimes = {k: regime_part(k, *fits[k], args) for k in REGIMES}
    models = {k: fits[k][0] for k in REGIMES}
    slow = {k: slow_part(k, models[k], args) for k in REGIMES}
    doc = {**run_header("balance", argv, setting=SHAPE,
                        scenario=f"jitter (per-op noise sigma {NOISE})", runs=args.runs,
                        steps=args.steps),
           "regimes": regimes, "slow_replica": slow,
           "outlier_delay": delay_part(models["b"], args), "decision": decision_part(args),
           "seconds": time.perf_counter() - start}
    show(doc)
    write_json(args.out, doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
