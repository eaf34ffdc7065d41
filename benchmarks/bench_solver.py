"""Partition-solver speed: exact min-bottleneck partition of L layers over P stages.

Times, on random per-layer costs and per-stage speeds (seeded), :func:`min_bottleneck`, the
full :func:`solve` (min bottleneck, then min weighted total, tie-break), the fewest-moves solve
against a current partition, the same with a per-stage memory cap, and :func:`candidates` (the
set the policies score with the engine) without and with ``neighbours`` (the predictive
policy's: one-layer shifts of every candidate), with how many partitions each gives (the
engine scores each one), and the engine's scoring of each set (1F1B, 2P micro-batches, at the
horizon grid of a 256-step horizon, as the predictive policy scores them), for several (L, P)
up to the target case L=128, P=16. Each time is the median of ``--repeats`` calls after one
warm-up call.

    python benchmarks/bench_solver.py [--repeats 50] [--seed 0]

Prints a table and writes benchmarks/results/solver.json. Target: solve(L=128, P=16) < 10 ms.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bubblecast.policy.solver import (
    PartitionProblem,
    candidates,
    min_bottleneck,
    solve,
)
from bubblecast.policy.state import horizon_grid
from bubblecast.sim.shape import PipelineShape, even_partition
from bubblecast.sim.steptime import predicted_step
from bubblecast.telemetry import atomic_write_text

RESULTS = Path(__file__).resolve().parent / "results" / "solver.json"
CASES = [(16, 4), (32, 8), (64, 8), (128, 16), (256, 16)]
TARGET_MS = 10.0
#: The predictive policy's default horizon: the engine scores each candidate at its grid points.
HORIZON = 256


def timed(fn: Callable[[], object], repeats: int) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    rows = []
    for layers, stages in CASES:
        costs = rng.uniform(0.5, 2.0, layers)
        speeds = rng.uniform(1.0, 1.6, stages)
        memory = rng.uniform(1.0, 2.0, layers)
        cap = 1.5 * memory.sum() / stages
        plain = PartitionProblem(costs, speeds)
        capped = PartitionProblem(costs, speeds, memory=memory, memory_cap=cap)
        current = even_partition(layers, stages)
        shape = PipelineShape("1f1b", stages, 2 * stages)
        fbw = np.stack([costs, 2 * costs, np.zeros(layers)], axis=1)
        plan = np.repeat(speeds[None, :], len(horizon_grid(HORIZON)[0]), axis=0)
        few = candidates(plain, current=current)
        many = candidates(plain, current=current, neighbours=True)
        row = {
            "layers": layers, "stages": stages,
            "min_bottleneck_ms": timed(lambda p=plain: min_bottleneck(p), args.repeats),
            "solve_ms": timed(lambda p=plain: solve(p), args.repeats),
            "solve_moves_ms": timed(lambda p=plain, c=current: solve(p, objective="moves",
                                                                     current=c), args.repeats),
            "solve_memory_cap_ms": timed(lambda p=capped: solve(p), args.repeats),
            "candidates_ms": timed(lambda p=plain, c=current: candidates(p, current=c),
                                   max(5, args.repeats // 5)),
            "neighbours_ms": timed(lambda p=plain, c=current: candidates(
                p, current=c, neighbours=True), max(5, args.repeats // 5)),
            "candidates": len(few), "with_neighbours": len(many),
            "score_ms": timed(lambda f=few, s=shape, c=fbw, p=plan: predicted_step(s, f, c, p),
                              max(5, args.repeats // 5)),
            "score_neighbours_ms": timed(
                lambda f=many, s=shape, c=fbw, p=plan: predicted_step(s, f, c, p),
                max(5, args.repeats // 5)),
        }
        rows.append(row)
    cols = ["min_bottleneck_ms", "solve_ms", "solve_moves_ms", "solve_memory_cap_ms",
            "candidates_ms", "neighbours_ms", "candidates", "with_neighbours", "score_ms",
            "score_neighbours_ms"]
    print(f"{'L':>5} {'P':>4} " + " ".join(f"{c:>19}" for c in cols))
    for r in rows:
        print(f"{r['layers']:5d} {r['stages']:4d} " + " ".join(
            f"{r[c]:19d}" if isinstance(r[c], int) else f"{r[c]:19.3f}" for c in cols))
    target = next(r for r in rows if (r["layers"], r["stages"]) == (128, 16))
    ok = target["solve_ms"] < TARGET_MS
    print(f"\nsolve(L=128, P=16): {target['solve_ms']:.2f} ms (target < {TARGET_MS} ms: "
          f"{'pass' if ok else 'FAIL'})")
    doc = {"benchmark": "solver", "repeats": args.repeats, "seed": args.seed, "rows": rows,
           "target": {"case": [128, 16], "solve_ms": target["solve_ms"],
                      "limit_ms": TARGET_MS, "pass": ok},
           "python": platform.python_version(), "numpy": np.__version__}
    atomic_write_text(RESULTS, json.dumps(doc, indent=1))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
