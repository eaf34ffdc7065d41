"""Dataset builder speed and memory: ~10M simulated events -> features (target < 60 s, < 4 GB).

Simulates ``--events`` compute-op events (1F1B, 8 stages x 4 replicas x 16 microbatches, the
scenario mix of the held-out suite), then times ``step_series`` (events -> one row per rank
and step) and ``build_features`` (features and targets for horizons 1, 5, 10) in this process.
Peak memory is the process's resident set size sampled every 20 ms during the build (it
includes the events table itself); times are wall clock and process CPU time (numpy and
pandas run single-threaded here, so CPU time is what a quiet machine would show as wall time).
Prints a table and writes ``benchmarks/results/dataset-m{M}.json``.
Usage: ``python benchmarks/bench_dataset.py [--events 10000000] [--microbatches 16]``.
"""

from __future__ import annotations

import argparse
import json
import platform
import threading
import time
from pathlib import Path

from bubblecast.dataset import DatasetConfig, build_features, step_series
from bubblecast.telemetry.events import Events
from bubblecast.telemetry.io import atomic_write_text

RESULTS = Path(__file__).resolve().parent / "results" / "dataset.json"


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class PeakRSS:
    """Samples the resident set size in a thread; ``peak`` is the largest value seen."""

    def __init__(self, every: float = 0.02) -> None:
        self.every, self.peak, self._stop = every, _rss_bytes(), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss_bytes())
            self._stop.wait(self.every)

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_bytes())


def simulated_events(n_events: int, m: int = 16, seed: int = 0) -> Events:
    """About ``n_events`` compute ops from the simulator, runs cycling through the scenarios."""
    from bubblecast.forecast.suite import HELD_OUT
    from bubblecast.sim.simulator import SimConfig, simulate_events

    stages, replicas, steps = 8, 4, 500
    per_run = steps * replicas * stages * m * 2
    runs = max(1, round(n_events / per_run))
    parts = []
    for k in range(runs):
        scenario = HELD_OUT[k % len(HELD_OUT)]
        parts.append(simulate_events(SimConfig(
            schedule="1f1b", stages=stages, microbatches=m, model="uniform:32", steps=steps,
            replicas=replicas, scenario=scenario, seed=seed + k, run_id=f"bench{k}")))
    events = Events.concat(parts)
    if "tokens" in events.frame.columns:
        events.frame["tokens"] = events.frame["tokens"].astype("Int64")
    return events


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--microbatches", type=int, default=16,
                        help="Fewer microbatches = more rows per event (2 is the worst case).")
    args = parser.parse_args()
    events = simulated_events(args.events, args.microbatches)
    base_rss = _rss_bytes()
    config = DatasetConfig()
    timings: dict[str, dict[str, float]] = {}
    with PeakRSS() as mem:
        w0, c0 = time.perf_counter(), time.process_time()
        series = step_series(events)
        w1, c1 = time.perf_counter(), time.process_time()
        frame = build_features(series, config)
        w2, c2 = time.perf_counter(), time.process_time()
    timings["step_series"] = {"wall_s": w1 - w0, "cpu_s": c1 - c0}
    timings["build_features"] = {"wall_s": w2 - w1, "cpu_s": c2 - c1}
    timings["total"] = {"wall_s": w2 - w0, "cpu_s": c2 - c0}
    result = {
        "events": len(events), "microbatches": args.microbatches,
        "series_rows": len(series), "feature_rows": len(frame),
        "feature_columns": int(frame.shape[1]), "timings": timings,
        "rss_before_build_gb": base_rss / 1e9, "peak_rss_gb": mem.peak / 1e9,
        "events_mem_gb": float(events.frame.memory_usage(deep=True).sum()) / 1e9,
        "targets": {"total_s": 60.0, "peak_gb": 4.0},
        "machine": {"python": platform.python_version(), "cpus": __import__("os").cpu_count()},
    }
    print(f"{len(events):,} events -> {len(series):,} series rows -> {len(frame):,} feature "
          f"rows x {frame.shape[1]} columns")
    print(f"{'phase':<16}{'wall s':>10}{'cpu s':>10}")
    for phase, t in timings.items():
        print(f"{phase:<16}{t['wall_s']:>10.1f}{t['cpu_s']:>10.1f}")
    print(f"peak RSS during the build {mem.peak / 1e9:.2f} GB (events alone "
          f"{result['events_mem_gb']:.2f} GB; RSS before the build {base_rss / 1e9:.2f} GB)")
    atomic_write_text(RESULTS.with_name(f"dataset-m{args.microbatches}.json"),
                      json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
