"""Load-and-validate benchmark: ``read_events`` on 10M events from one Parquet file.

Generates a realistic events table with numpy (many steps of a 1F1B-like pipeline: 8 stages,
2 replicas, 16 microbatches, F/B plus sends, receives, an all-reduce and the optimizer step),
writes it with ``write_events``, then times ``read_events`` (Parquet read + validation) in a
fresh subprocess per repeat and reads its peak RSS (``VmHWM``). A second subprocess times
the phases (Parquet read, Arrow -> pandas, validation) to show where the time goes.

    python benchmarks/bench_load.py [--events 10000000] [--repeats 3] [--seed 0]

Prints a table and writes benchmarks/results/load.json. Target: < 10 s and < 3 GB peak.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from bubblecast.telemetry import Events, RunMeta, atomic_write_text, write_events

RESULTS = Path(__file__).resolve().parent / "results" / "load.json"
STAGES, REPLICAS, MICROBATCHES = 8, 2, 16
TARGET_S, TARGET_GB = 10.0, 3.0

# Peak RSS from VmHWM: ru_maxrss survives exec, so a child would report its parent's peak.
_MEASURE = """
import json, resource, sys, time
def hwm_kb():
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
from bubblecast.telemetry import read_events
t1 = time.perf_counter()
base = hwm_kb()
c1 = time.process_time()
ev = read_events(sys.argv[1])
t2 = time.perf_counter()
cpu = time.process_time() - c1
peak = hwm_kb()
print(json.dumps({"rows": len(ev), "import_s": t1 - t0, "load_s": t2 - t1, "cpu_s": cpu,
                  "base_rss_kb": base, "peak_rss_kb": peak}))
"""

_PHASES = """
import json, sys, time
import pyarrow.parquet as pq
from bubblecast.telemetry.schema import METADATA_KEY, decode_metadata
from bubblecast.telemetry.validate import validate_frame
t0 = time.perf_counter()
table = pq.read_table(sys.argv[1], read_dictionary=["run_id", "op"])
t1 = time.perf_counter()
frame = table.to_pandas()
t2 = time.perf_counter()
runs = decode_metadata(table.schema.metadata[METADATA_KEY])
validate_frame(frame, runs, sys.argv[1])
t3 = time.perf_counter()
print(json.dumps({"parquet_read_s": t1 - t0, "to_pandas_s": t2 - t1, "validate_s": t3 - t2}))
"""


def step_layout() -> pd.DataFrame:
    """The ops of one step on every rank: (rank, stage, replica, microbatch, op, start, dur)."""
    rows = []
    f, b, comm = 1.0, 2.0, 0.05
    for replica in range(REPLICAS):
        for stage in range(STAGES):
            rank = replica * STAGES + stage
            warm = STAGES - stage  # 1F1B: warm-up forwards, then alternate, then cool-down
            for mb in range(MICROBATCHES):
                f_start = (stage + mb) * f if mb < warm else (stage + mb) * f + (mb - warm) * b
                b_start = (2 * STAGES - stage + mb) * f + mb * b
                rows.append((rank, stage, replica, mb, "F", f_start, f))
                rows.append((rank, stage, replica, mb, "B", b_start, b))
                if stage > 0:
                    rows.append((rank, stage, replica, mb, "RECV_F", f_start - comm, comm))
                    rows.append((rank, stage, replica, mb, "SEND_B", b_start + b, comm))
                if stage < STAGES - 1:
                    rows.append((rank, stage, replica, mb, "SEND_F", f_start + f, comm))
                    rows.append((rank, stage, replica, mb, "RECV_B", b_start - comm, comm))
            end = (2 * STAGES + MICROBATCHES) * (f + b)
            rows.append((rank, stage, replica, -1, "ALLREDUCE", end, 4 * comm))
            rows.append((rank, stage, replica, -1, "OPTIMIZER", end + 1.0, 0.5))
    return pd.DataFrame(
        rows, columns=["rank", "stage", "replica", "microbatch", "op", "start", "dur"]
    )


def generate(n_events: int, seed: int) -> Events:
    """About ``n_events`` events: whole steps of :func:`step_layout` with lognormal noise."""
    rng = np.random.default_rng(seed)
    one = step_layout()
    steps = max(1, round(n_events / len(one)))
    n = steps * len(one)
    tile = np.tile(np.arange(len(one)), steps)
    scale = 1e-3 * rng.lognormal(0.0, 0.1, size=n)  # ms -> s with 10% jitter
    frame = pd.DataFrame(
        {
            "run_id": pd.Categorical.from_codes(np.zeros(n, dtype=np.int8), categories=["bench"]),
            "step": np.repeat(np.arange(steps, dtype=np.int64), len(one)),
            "rank": one["rank"].to_numpy(np.int32)[tile],
            "stage": one["stage"].to_numpy(np.int32)[tile],
            "replica": one["replica"].to_numpy(np.int32)[tile],
            "chunk": np.zeros(n, dtype=np.int32),
            "microbatch": one["microbatch"].to_numpy(np.int32)[tile],
            "op": pd.Categorical.from_codes(
                one["op"].astype("category").cat.codes.to_numpy()[tile],
                one["op"].astype("category").cat.categories,
            ),
            "start_s": one["start"].to_numpy()[tile] * 1e-3,
            "duration_s": one["dur"].to_numpy()[tile] * scale,
        }
    )
    meta = RunMeta(
        schedule="1f1b",
        stages=STAGES,
        microbatches=MICROBATCHES,
        chunks=1,
        replicas=REPLICAS,
        source="benchmark",
    )
    return Events(frame, {"bench": meta})


def _run(script: str, path: Path) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", script, str(path)], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    load_before = os.getloadavg()[0]  # the machine is shared: say how busy it was
    with tempfile.TemporaryDirectory(prefix="bubblecast-bench-") as tmp:
        path = Path(tmp) / "events.parquet"
        t0 = time.perf_counter()
        events = generate(args.events, args.seed)
        write_events(events, path)
        write_s = time.perf_counter() - t0
        rows, size_mb = len(events), path.stat().st_size / 2**20
        del events
        runs = [_run(_MEASURE, path) for _ in range(args.repeats)]
        phases = _run(_PHASES, path)

    load_s = statistics.median(r["load_s"] for r in runs)
    cpu_s = statistics.median(r["cpu_s"] for r in runs)  # less sensitive to a busy machine
    peak_gb = max(r["peak_rss_kb"] for r in runs) / 2**20
    base_gb = statistics.median(r["base_rss_kb"] for r in runs) / 2**20
    result = {
        "benchmark": "load",
        "rows": rows,
        "file_mb": round(size_mb, 1),
        "generate_and_write_s": round(write_s, 2),
        "repeats": args.repeats,
        "load_s_median": round(load_s, 3),
        "load_s_all": [round(r["load_s"], 3) for r in runs],
        "load_cpu_s_median": round(cpu_s, 3),
        "peak_rss_gb": round(peak_gb, 3),
        "rss_after_imports_gb": round(base_gb, 3),
        "phases_s": {k: round(v, 3) for k, v in phases.items()},
        "target": {"load_s": TARGET_S, "peak_rss_gb": TARGET_GB},
        "meets_target": bool(load_s < TARGET_S and peak_gb < TARGET_GB),
        "machine": {
            "python": platform.python_version(),
            "cpus": _cpus(),
            "platform": platform.platform(),
            "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        },
        "command": "python benchmarks/bench_load.py " + " ".join(argv or sys.argv[1:]),
    }
    print(f"{'measure':<28}{'value':>12}")
    for label, value in [
        ("rows", f"{rows:,}"),
        ("parquet file (MB)", f"{size_mb:.1f}"),
        ("read_events median (s)", f"{load_s:.2f}"),
        ("  of which CPU time (s)", f"{cpu_s:.2f}"),
        ("peak RSS (GB)", f"{peak_gb:.2f}"),
        ("RSS after imports (GB)", f"{base_gb:.2f}"),
        *[(f"  phase {k}", f"{v:.2f}") for k, v in phases.items()],
        ("load average 1 min", f"{load_before:.1f}"),
        ("target met", str(result["meets_target"])),
    ]:
        print(f"{label:<28}{value:>12}")
    atomic_write_text(args.out, json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


if __name__ == "__main__":
    sys.exit(main())
