"""Event output: ``write_events`` against a plain ``pyarrow.parquet.write_table`` of the same
frame, and ``simulate`` end to end.

For each size, ``simulate_events`` builds a 1F1B run (8 stages, 32 microbatches, the
``--scenario`` noise; ``--events`` / 512 steps). Then, in ``--rounds`` interleaved rounds
(order swapped each round, so machine drift hits both alike), the same events are written by

- ``write_events`` (validation, Arrow table, Parquet with bubblecast's settings and page
  checksums, atomic rename), and
- the plain way: ``pyarrow.parquet.write_table(pyarrow.Table.from_pandas(frame))`` with
  pyarrow's defaults (snappy, dictionary on every column, no validation, no checksums).

Each round records wall and process-CPU seconds (numpy and the Parquet writer run on this
thread; CPU time is less disturbed by other processes on a shared machine); the figures are
medians over rounds, and the ratio is the median of the per-round ratios. ``write_events`` is
also split into its parts (validate, to_table, Parquet write). Finally ``bubblecast simulate``
runs end to end: in process (``simulate_events`` + ``write_events``) and as a command (a new
interpreter, imports included), in compute events per second.

    python benchmarks/bench_write.py [--events 2560000,10240000] [--rounds 5]

Prints a table and writes benchmarks/results/bench_write.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from bubblecast.sim.simulator import SimConfig, simulate_events
from bubblecast.telemetry.events import Events
from bubblecast.telemetry.io import parquet_options, to_table, write_events
from bubblecast.telemetry.validate import validate_frame

RESULTS = Path(__file__).resolve().parent / "results" / "bench_write.json"
STAGES, MICROBATCHES = 8, 32
OPS_PER_STEP = 2 * STAGES * MICROBATCHES  # 1F1B: one F and one B per stage and microbatch


def _timed(fn: Callable[[], Any]) -> tuple[float, float]:
    """(wall, process CPU) seconds of one call."""
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w0, time.process_time() - c0


def _plain(events: Events, path: Path) -> None:
    pq.write_table(pa.Table.from_pandas(events.frame, preserve_index=False), path)


def _parts(events: Events, path: Path) -> dict[str, tuple[float, float]]:
    """write_events split into validation, Arrow table and Parquet write."""
    runs = dict(events.runs)
    frame: list[Any] = []
    tables: list[pa.Table] = []
    out = {"validate": _timed(lambda: frame.append(validate_frame(events.frame, runs, "b")))}
    out["to_table"] = _timed(lambda: tables.append(to_table(Events(frame[0], runs))))
    out["parquet"] = _timed(lambda: pq.write_table(tables[0], path,
                                                   **parquet_options(tables[0])))
    return out


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def bench_size(events_wanted: int, scenario: str, rounds: int, tmp: Path) -> dict[str, Any]:
    steps = max(1, events_wanted // OPS_PER_STEP)
    config = SimConfig(schedule="1f1b", stages=STAGES, microbatches=MICROBATCHES, steps=steps,
                       scenario=scenario)
    holder: list[Events] = []
    sim_wall, sim_cpu = _timed(lambda: holder.append(simulate_events(config)))
    events = holder[0]
    n = len(events)
    ours, plain = tmp / "ours.parquet", tmp / "plain.parquet"
    rec: dict[str, list[float]] = {k: [] for k in ("ours_wall", "ours_cpu", "plain_wall",
                                                   "plain_cpu", "ratio_wall", "ratio_cpu")}
    parts: dict[str, list[float]] = {}
    for r in range(rounds):
        order = [("ours", lambda: write_events(events, ours)),
                 ("plain", lambda: _plain(events, plain))]
        got = {}
        for name, fn in order if r % 2 == 0 else order[::-1]:
            got[name] = _timed(fn)
            rec[f"{name}_wall"].append(got[name][0])
            rec[f"{name}_cpu"].append(got[name][1])
        rec["ratio_wall"].append(got["ours"][0] / got["plain"][0])
        rec["ratio_cpu"].append(got["ours"][1] / got["plain"][1])
        for key, (wall, _) in _parts(events, tmp / "parts.parquet").items():
            parts.setdefault(key, []).append(wall)
    med = {k: _median(v) for k, v in rec.items()}
    return {
        "events": n, "steps": steps, "scenario": scenario,
        "simulate_events_s": sim_wall, "simulate_events_cpu_s": sim_cpu,
        "write_events_s": med["ours_wall"], "write_events_cpu_s": med["ours_cpu"],
        "plain_write_table_s": med["plain_wall"], "plain_write_table_cpu_s": med["plain_cpu"],
        "ratio_wall": med["ratio_wall"], "ratio_cpu": med["ratio_cpu"],
        "ratio_wall_range": [min(rec["ratio_wall"]), max(rec["ratio_wall"])],
        "write_events_rows_per_s": n / med["ours_wall"],
        "write_events_rows_per_cpu_s": n / med["ours_cpu"],
        "plain_rows_per_s": n / med["plain_wall"],
        "parts_s": {k: _median(v) for k, v in parts.items()},
        "file_mb": {"write_events": ours.stat().st_size / 1e6,
                    "plain": plain.stat().st_size / 1e6},
        "rounds": {k: v for k, v in rec.items()},
    }


def bench_simulate(events_wanted: int, scenario: str, rounds: int, tmp: Path) -> dict[str, Any]:
    """``simulate`` end to end: in process, and as a command (median of ``rounds``)."""
    steps = max(1, events_wanted // OPS_PER_STEP)
    config = SimConfig(schedule="1f1b", stages=STAGES, microbatches=MICROBATCHES, steps=steps,
                       scenario=scenario)
    out = tmp / "sim.parquet"
    argv = [str(Path(sys.executable).parent / "bubblecast"), "simulate", "--schedule", "1f1b",
            "--stages", str(STAGES), "--microbatches", str(MICROBATCHES), "--steps", str(steps),
            "--scenario", scenario, "--out", str(out)]
    inproc, command = [], []
    for _ in range(rounds):
        inproc.append(_timed(lambda: write_events(simulate_events(config), out))[0])
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
        command.append(time.perf_counter() - t0)
    n = steps * OPS_PER_STEP
    return {"events": n, "in_process_s": _median(inproc), "command_s": _median(command),
            "in_process_events_per_s": n / _median(inproc),
            "command_events_per_s": n / _median(command),
            "command": " ".join(["bubblecast"] + argv[1:-1] + ["OUT"])}


def main() -> None:
    from _results import run_header, write_json

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", default="2560000,10240000",
                        help="comma-separated event counts (rounded down to whole steps)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--scenario", default="jitter")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    sizes = [int(x) for x in args.events.split(",")]
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench_write.") as d:
        tmp = Path(d)
        writes = [bench_size(n, args.scenario, args.rounds, tmp) for n in sizes]
        sims = [bench_simulate(n, args.scenario, max(3, args.rounds // 2), tmp) for n in sizes]
    print(f"{'events':>10} {'write_events':>13} {'plain':>9} {'ratio':>13} {'rows/s':>9} "
          f"{'validate':>9} {'to_table':>9} {'parquet':>9} {'MB ours/plain':>14}")
    for w in writes:
        p, lo, hi = w["parts_s"], *w["ratio_wall_range"]
        print(f"{w['events']:>10} {w['write_events_s']:>12.3f}s {w['plain_write_table_s']:>8.3f}s"
              f" {w['ratio_wall']:>5.2f} ({lo:.2f}-{hi:.2f}) "
              f"{w['write_events_rows_per_s'] / 1e6:>7.2f}M {p['validate']:>8.3f}s "
              f"{p['to_table']:>8.3f}s {p['parquet']:>8.3f}s "
              f"{w['file_mb']['write_events']:>6.1f}/{w['file_mb']['plain']:.1f}")
    for s in sims:
        print(f"simulate {s['events']} events: in process {s['in_process_s']:.3f}s "
              f"({s['in_process_events_per_s'] / 1e6:.2f}M/s), command {s['command_s']:.3f}s "
              f"({s['command_events_per_s'] / 1e6:.2f}M/s)")
    print(f"load average at start {load:.2f}, at end {os.getloadavg()[0]:.2f}")
    doc = run_header("write", load_average=[load, os.getloadavg()[0]],
                     timing="wall and process-CPU seconds, median of interleaved rounds",
                     writes=writes, simulate=sims)
    write_json(args.out, doc)


if __name__ == "__main__":
    main()
