"""Reading events: ~10M simulated events read in a fresh process, and ``dataset``'s peak memory.

Simulates ``--events`` compute-op events once (the configuration of ``bench_dataset.py``: 1F1B,
8 stages x 4 replicas x 16 microbatches, 500 steps per run, the held-out scenario mix: 20 runs
for 10.24M events) into one events file under ``--dir`` (kept between invocations), then, each
in a fresh subprocess, ``--rounds`` times:

- ``read_events(FILE)``: wall and CPU seconds of the call, and the process's peak RSS;
- ``read_events(FILE, columns=...)``: the same with the columns ``dataset`` reads;
- ``bubblecast dataset FILE --out F`` (in process, no cluster): wall seconds and peak RSS of the
  command (``ru_maxrss`` of that child, from ``os.wait4``).

Prints a table (medians over rounds) and writes ``benchmarks/results/bench_read.json``.
Goals (issue 14): reading <= 2 s, ``dataset`` <= 1.2 GiB peak.
Usage: ``python benchmarks/bench_read.py [--events 10240000] [--rounds 3] [--dir /tmp/bench_read]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import run_header, write_json  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "bench_read.json"
GIB = 1 << 30

_READ = """
import json, resource, sys, time
t0, c0 = time.perf_counter(), time.process_time()
from bubblecast.telemetry.io import read_events
t1, c1 = time.perf_counter(), time.process_time()
columns = json.loads(sys.argv[2])
ev = read_events(sys.argv[1], columns=columns) if columns else read_events(sys.argv[1])
import bubblecast
t2, c2 = time.perf_counter(), time.process_time()
print(json.dumps({"rows": len(ev), "import_s": t1 - t0, "read_s": t2 - t1,
                  "read_cpu_s": c2 - c1, "columns": list(ev.frame.columns),
                  "package": bubblecast.__file__,
                  "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def make_events(path: Path, n_events: int) -> int:
    """Simulate and write the events file once; its row count."""
    from bench_dataset import simulated_events

    from bubblecast.telemetry import read_events, write_events

    if path.exists():
        import pyarrow.parquet as pq

        return int(pq.ParquetFile(path).metadata.num_rows)
    t0 = time.perf_counter()
    events = simulated_events(n_events)
    write_events(events, path)
    print(f"simulated and wrote {len(events):,} events to {path} in "
          f"{time.perf_counter() - t0:.1f} s")
    del events
    return len(read_events(path, columns=["run_id"]))


def _env(src: Path | None) -> dict[str, str] | None:
    """The environment of a child running the bubblecast at ``src`` (None: this one). Children
    run in the events' folder: ``python -c`` puts its working directory first on the path."""
    return None if src is None else {**os.environ, "PYTHONPATH": str(src)}


def read_round(path: Path, columns: list[str] | None, src: Path | None = None) -> dict:
    """One fresh-process read."""
    out = subprocess.run([sys.executable, "-c", _READ, str(path), json.dumps(columns)],
                         capture_output=True, text=True, check=True, env=_env(src),
                         cwd=path.parent)
    return json.loads(out.stdout.strip().splitlines()[-1])


def dataset_round(path: Path, out: Path, src: Path | None = None) -> dict:
    """One ``bubblecast dataset`` run in a child: wall seconds and that child's peak RSS
    (``os.wait4``'s resource usage of the child, i.e. getrusage of it alone)."""
    t0 = time.perf_counter()
    import tempfile

    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, "-c", "from bubblecast.cli import main; main()",
                                 "dataset", str(path), "--out", str(out), "--json"],
                                stdout=subprocess.PIPE, stderr=err, text=True, env=_env(src),
                                cwd=path.parent)
        stdout = proc.stdout.read()  # one JSON line
        _, status, usage = os.wait4(proc.pid, 0)
        err.seek(0)
        stderr = err.read()
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"dataset failed: {stderr[-2000:]}")
    summary = json.loads(stdout)
    return {"wall_s": wall, "peak_rss": usage.ru_maxrss * 1024, "rows": summary["rows"],
            "fingerprint": summary["fingerprint"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10_240_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/bench_read"))
    parser.add_argument("--baseline", type=Path, default=None,
                        help="A source tree of the code before (e.g. `git archive COMMIT "
                             "bubblecast | tar -x -C DIR`): measured the same way, interleaved.")
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    path = args.dir / f"events-{args.events}.parquet"
    rows = make_events(path, args.events)
    from bubblecast.dataset.series import EVENT_COLUMNS

    load = [round(x, 2) for x in os.getloadavg()]
    datasets, full, needed, before_ds, before_read = [], [], [], [], []
    for _ in range(args.rounds):  # interleaved: the machine's load hits both alike
        datasets.append(dataset_round(path, args.dir / "features.parquet"))
        full.append(read_round(path, None))
        needed.append(read_round(path, list(EVENT_COLUMNS)))
        if args.baseline is not None:
            before_ds.append(dataset_round(path, args.dir / "features-before.parquet",
                                           args.baseline))
            before_read.append(read_round(path, None, args.baseline))

    def med(items: list[dict], key: str) -> float:
        return statistics.median(float(i[key]) for i in items)

    table = [
        ("read_events (all columns)", med(full, "read_s"), med(full, "read_cpu_s"),
         med(full, "peak_rss") / GIB),
        ("read_events (dataset's columns)", med(needed, "read_s"), med(needed, "read_cpu_s"),
         med(needed, "peak_rss") / GIB),
        ("bubblecast dataset (whole command)", med(datasets, "wall_s"), float("nan"),
         max(d["peak_rss"] for d in datasets) / GIB),
    ]
    if args.baseline is not None:
        table += [
            ("before: read_events (all columns)", med(before_read, "read_s"),
             med(before_read, "read_cpu_s"), med(before_read, "peak_rss") / GIB),
            ("before: bubblecast dataset", med(before_ds, "wall_s"), float("nan"),
             max(d["peak_rss"] for d in before_ds) / GIB),
        ]
        same = {d["fingerprint"] for d in datasets} == {d["fingerprint"] for d in before_ds}
        print(f"same features fingerprint before and after: {same}")
    print(f"{rows:,} events, {path.stat().st_size / 2**20:.0f} MiB on disk, load {load}")
    print(f"{'':38s} {'wall s':>8s} {'CPU s':>8s} {'peak GiB':>9s}")
    for name, wall, cpu, peak in table:
        print(f"{name:38s} {wall:8.2f} {cpu:8.2f} {peak:9.2f}")
    doc = run_header("read", load_average_before=load, load_average_after=[
        round(x, 2) for x in os.getloadavg()], events=rows, file_mib=path.stat().st_size / 2**20,
        rounds=args.rounds, goals={"read_s": 2.0, "dataset_peak_gib": 1.2},
        read_all=full, read_dataset_columns=needed, dataset=datasets,
        baseline=str(args.baseline) if args.baseline else None, before_read=before_read,
        before_dataset=before_ds,
        summary={name: {"wall_s": wall, "cpu_s": None if cpu != cpu else cpu, "peak_gib": peak}
                 for name, wall, cpu, peak in table})
    write_json(RESULTS, doc)


if __name__ == "__main__":
    main()
