"""Timing engine throughput against the reference event loop, and ``simulate`` end to end.

For each simulable schedule (P=8 stages, M=16 microbatches) the same ``(steps, ops)`` duration
matrix is timed by the vectorised engine (as a C-ordered array and as the same values in
op-major memory, which skips a transposition: the layout ``simulate_events`` builds its
durations in) and by the per-op reference loop; outputs are checked equal. Each is timed
``--repeat`` times and the fastest run counts (as ``timeit`` recommends: slower runs measure
other processes, not the code), twice: back to back (each function in its own steady state,
as ``timeit`` runs it) and alternating engine and reference within each round (the engine
then starts with the caches the reference loop left it: a colder figure). Then
``simulate_events`` (1000 steps x 8 stages x 16 microbatches, 1F1B, median of 3) and
``write_events`` are timed end to end. Times are process CPU times (numpy here is
single-threaded), so a busy shared machine distorts them less than wall-clock would. Prints a
table and writes ``benchmarks/results/engine.json``.
Usage: ``python benchmarks/bench_engine.py [--steps N] [--repeat R]`` (or ``python -m
benchmarks.bench_engine``).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a script: import benchmarks.oracles from the repo root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.oracles.sim_reference import simulate_reference  # noqa: E402
from bubblecast.sim.engine import simulate  # noqa: E402
from bubblecast.sim.schedules import SCHEDULES, SIMULABLE, schedule_graph  # noqa: E402
from bubblecast.sim.simulator import SimConfig, simulate_events  # noqa: E402
from bubblecast.telemetry.io import atomic_write_text, write_events  # noqa: E402

CASES = [(name, 2 if SCHEDULES[name].multi_chunk else 1) for name in SIMULABLE]


def _timed(fn, repeat: int = 1) -> tuple[float, object]:
    """Median CPU time of this process (one core; other processes' load does not count)."""
    times, out = [], None
    for _ in range(repeat):
        t0 = time.process_time()
        out = fn()
        times.append(time.process_time() - t0)
    return statistics.median(times), out


def _fastest(fns: list, repeat: int, alternate: bool) -> list[tuple[float, object]]:
    """Fastest CPU time of each function over ``repeat`` runs, with the output of its last run.
    ``alternate``: the functions take turns within each round (each then starts with caches the
    others left: the engine's working arrays evicted by the reference loop); else each runs its
    ``repeat`` runs back to back, as ``timeit`` does (its own steady state). Every run's time
    is appended to ``ROUNDS`` (per function) for the spread."""
    best = [(float("inf"), None)] * len(fns)
    ROUNDS.clear()
    ROUNDS.extend([] for _ in fns)
    order = ([k for _ in range(repeat) for k in range(len(fns))] if alternate
             else [k for k in range(len(fns)) for _ in range(repeat)])
    for k in order:
        t0 = time.process_time()
        out = fns[k]()
        took = time.process_time() - t0
        ROUNDS[k].append(took)
        best[k] = (min(best[k][0], took), out)
    return best


#: Per-function run times of the last :func:`_fastest` call.
ROUNDS: list[list[float]] = []


def _spread(ref: list[float], eng: list[float]) -> list[float]:
    """Min and max over rounds of the per-round speed-up (reference / engine)."""
    ratios = [r / e for r, e in zip(ref, eng, strict=True) if e > 0]
    return [min(ratios), max(ratios)] if ratios else [float("nan")] * 2


def bench_engine(steps: int, repeat: int, p: int = 8, m: int = 16) -> list[dict]:
    rows = []
    for name, v in CASES:
        sg = schedule_graph(name, p, m, v)
        n = sg.graph.n_ops
        dur = np.random.default_rng(0).lognormal(0, 0.3, (steps, n)) * 1e-3
        dur_f = np.asfortranarray(dur)  # same values, op-major memory (the engine's layout)
        simulate(sg.graph, dur, 1e-4)  # build the plan and size the scratch outside the timing
        fns = [lambda g=sg.graph, d=dur: simulate(g, d, 1e-4),
               lambda g=sg.graph, d=dur_f: simulate(g, d, 1e-4),
               lambda g=sg.graph, d=dur: simulate_reference(g, d, 1e-4)]
        (t_eng, (s1, e1)), (t_f, _), (t_ref, (s2, e2)) = _fastest(fns, repeat, alternate=False)
        assert np.array_equal(s1, s2) and np.array_equal(e1, e2), name
        (a_eng, _), (a_f, _), (a_ref, _) = _fastest(fns, repeat, alternate=True)
        spread = {"speedup": _spread(ROUNDS[2], ROUNDS[0]),
                  "speedup_opmajor": _spread(ROUNDS[2], ROUNDS[1])}
        ops = steps * n
        rows.append({"schedule": name, "chunks": v, "stages": p, "microbatches": m,
                     "steps": steps, "ops": ops, "engine_s": t_eng, "engine_opmajor_s": t_f,
                     "reference_s": t_ref, "engine_ops_per_s": ops / t_eng,
                     "engine_opmajor_ops_per_s": ops / t_f, "reference_ops_per_s": ops / t_ref,
                     "speedup": t_ref / t_eng, "speedup_opmajor": t_ref / t_f,
                     "alternating": {"engine_s": a_eng, "engine_opmajor_s": a_f,
                                     "reference_s": a_ref, "speedup": a_ref / a_eng,
                                     "speedup_opmajor": a_ref / a_f,
                                     "per_round_spread": spread}})
    return rows


def bench_simulate(steps: int) -> dict:
    cfg = SimConfig(schedule="1f1b", stages=8, microbatches=16, steps=steps, comm=0.1)
    simulate_events(SimConfig(schedule="1f1b", stages=8, microbatches=16, steps=2))
    t_sim, events = _timed(lambda: simulate_events(cfg), repeat=3)
    with tempfile.TemporaryDirectory() as tmp:
        t_write, _ = _timed(lambda: write_events(events, Path(tmp) / "e.parquet"))
    n = len(events)
    return {"steps": steps, "stages": 8, "microbatches": 16, "events": n,
            "simulate_s": t_sim, "write_s": t_write, "events_per_s": n / t_sim,
            "events_per_s_with_write": n / (t_sim + t_write)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5,
                        help="timed rounds per schedule; the fastest counts (default 5)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "engine.json"))
    args = parser.parse_args()
    engine = bench_engine(args.steps, args.repeat)
    sim = bench_simulate(args.steps)
    print("engine Mops/s: (batch, ops) C-order input | op-major input; speedups vs reference,"
          " each timed back to back | alternating with the reference")
    print(f"{'schedule':<16}{'ops':>8}{'engine':>9}{'op-major':>10}{'reference':>11}"
          f"{'speedup':>9}{'op-major':>10}{'alt':>7}{'alt op-m':>10}")
    for r in engine:
        label = r["schedule"] + (f" v={r['chunks']}" if r["chunks"] > 1 else "")
        alt = r["alternating"]
        print(f"{label:<16}{r['ops']:>8}{r['engine_ops_per_s'] / 1e6:>9.1f}"
              f"{r['engine_opmajor_ops_per_s'] / 1e6:>10.1f}"
              f"{r['reference_ops_per_s'] / 1e6:>11.2f}{r['speedup']:>8.0f}x"
              f"{r['speedup_opmajor']:>9.0f}x{alt['speedup']:>6.0f}x{alt['speedup_opmajor']:>9.0f}x")
    for r in engine:
        sp = r["alternating"]["per_round_spread"]
        print(f"  {r['schedule']:<16} alternating rounds: {sp['speedup'][0]:.0f}-"
              f"{sp['speedup'][1]:.0f}x C-ordered, {sp['speedup_opmajor'][0]:.0f}-"
              f"{sp['speedup_opmajor'][1]:.0f}x op-major")
    cold = min(r["alternating"]["speedup_opmajor"] for r in engine)
    cold_c = min(r["alternating"]["speedup"] for r in engine)
    print(f"cold caches (alternating), slowest schedule: {cold:.0f}x with op-major input (the "
          f"layout simulate_events builds), {cold_c:.0f}x with C-ordered (steps, ops) input")
    print(f"simulate 1f1b {sim['steps']} steps x 8 stages x 16 mb: {sim['events']} events in "
          f"{sim['simulate_s'] * 1e3:.0f} ms ({sim['events_per_s'] / 1e6:.2f} M events/s; "
          f"+ write {sim['write_s'] * 1e3:.0f} ms)")
    result = {"machine": {"python": platform.python_version(), "processor": platform.machine(),
                          "numpy": np.__version__},
              "timing": f"process CPU time, fastest of {args.repeat} runs, back to back "
                        "(top-level keys) and alternating with the reference ('alternating')",
              "engine": engine, "simulate": sim,
              "cold_speedup_min": {"opmajor": cold, "c_order": cold_c}}
    atomic_write_text(args.out, json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
