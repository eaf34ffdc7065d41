"""Drive an HTTP server with ``wrk`` (a compiled generator, in its own process) for benchmarks.

``bench_serve.lua`` (next to this file) makes wrk 4 an open-loop constant-rate generator with
latency counted from each request's due time, as wrk2 does; see its header. Used by
``bench_serve.py``; ``require_wrk`` exits with one line when wrk is not installed.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

LUA = Path(__file__).resolve().parent / "bench_serve.lua"
INSTALL = "apt-get install -y wrk (Debian/Ubuntu), or build it from github.com/wg/wrk"


def require_wrk() -> str:
    """The wrk executable; exit with one line saying how to install it when missing."""
    exe = shutil.which("wrk")
    if exe is None:
        sys.exit(f"bench_serve.py: wrk not found on PATH; install it: {INSTALL}")
    return exe


def write_bodies(bodies: list[bytes], directory: Path) -> Path:
    """The request bodies, one a line (JSON has no raw newlines), for the Lua script."""
    path = Path(tempfile.mkstemp(prefix="bodies-", suffix=".txt", dir=directory)[1])
    path.write_bytes(b"\n".join(bodies) + b"\n")
    return path


def process_cpu_s(pgid: int | None) -> float:
    """User + system CPU seconds so far of the processes in group ``pgid`` (a server started
    in its own session, with its workers; 0.0 when unknown). Exited children are not seen."""
    if pgid is None:
        return 0.0
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def run_wrk(port: int, path: str, bodies: Path, *, rate: float, seconds: float,
            connections: int = 16, server_pid: int | None = None) -> dict:
    """One wrk run: ``rate`` req/s offered (0 = closed loop) over ``connections`` (one thread
    each) for ``seconds``. Latency percentiles in ms from the due times, achieved rate,
    non-200 answers and socket errors, the load average before and after, and the server's
    CPU ms per request when ``server_pid`` is given."""
    cmd = [require_wrk(), f"-t{connections}", f"-c{connections}", f"-d{seconds:g}s",
           "--timeout", "30s", "-s", str(LUA), f"http://127.0.0.1:{port}{path}", "--",
           f"{rate:g}", str(bodies), str(connections)]
    load_before = round(os.getloadavg()[0], 2)
    cpu0, gen0 = process_cpu_s(server_pid), _children_cpu_s()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60)
    wall = time.perf_counter() - t0
    cpu, gen = process_cpu_s(server_pid) - cpu0, _children_cpu_s() - gen0
    if "BENCH_JSON " not in proc.stdout:
        raise RuntimeError(f"wrk gave no result (exit {proc.returncode}): "
                           f"{(proc.stderr or proc.stdout)[-500:]}")
    raw = json.loads(proc.stdout.split("BENCH_JSON ", 1)[1].splitlines()[0])
    lat = np.asarray(raw["lat_us"], dtype=np.float64) / 1e3
    n = int(lat.size)
    errors = sum(raw[k] for k in ("connect_errors", "read_errors", "write_errors", "timeouts"))
    out = {"rate": rate, "seconds": seconds, "connections": connections, "requests": n,
           "achieved_rps": round(n / (raw["duration_us"] / 1e6), 1),
           "non200": raw["non200"], "first_non200": raw["first_non200"] or None,
           "socket_errors": int(errors), "load_before": load_before,
           "load_after": round(os.getloadavg()[0], 2), "wall_s": round(wall, 2),
           "latency_ms": lat.round(3).tolist()}
    if n:
        out["generator_cpu_ms_per_req"] = round(gen * 1e3 / n, 3)
    if server_pid is not None and n:
        out["server_cpu_ms_per_req"] = round(cpu * 1e3 / n, 3)
    return out


def gc_stats(port: int) -> dict[str, float]:
    """bubblecast's own garbage-collection figures from ``/metrics``, summed over generations:
    ``collections``, ``pause_s`` (total) and ``pause_max_s`` (longest so far)."""
    import re
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for key, name in (("collections", "collections_total"), ("pause_s", "pause_seconds_total"),
                      ("pause_max_s", "pause_max_seconds")):
        vals = [float(v) for v in re.findall(rf"^bubblecast_gc_{name}{{[^}}]*}} (\S+)$", text,
                                             re.MULTILINE)]
        out[key] = max(vals, default=0.0) if key == "pause_max_s" else sum(vals)
    return out


def _children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def python_load(port: int, path: str, bodies: list[bytes], *, rate: float, seconds: float,
                server_pid: int | None = None) -> dict:
    """The same open-loop level driven by ``loadgen.py`` (Python, asyncio, 32 connections, in
    this process), as bench_serve measured before: for comparison with wrk only."""
    from loadgen import load

    load_before = round(os.getloadavg()[0], 2)
    cpu0, gen0 = process_cpu_s(server_pid), time.process_time()
    r = load("127.0.0.1", port, lambda i: ("POST", path, bodies[i % len(bodies)]),
             total=int(rate * seconds), concurrency=32, time_limit_s=seconds + 10, rate=rate)
    cpu, gen = process_cpu_s(server_pid) - cpu0, time.process_time() - gen0
    n = max(r.completed, 1)
    return {"rate": rate, "seconds": seconds, "connections": 32, "requests": r.completed,
            "achieved_rps": round(r.throughput, 1), "non200": len(r.errors),
            "socket_errors": 0, "load_before": load_before,
            "load_after": round(os.getloadavg()[0], 2),
            "generator_cpu_ms_per_req": round(gen * 1e3 / n, 3),
            "server_cpu_ms_per_req": round(cpu * 1e3 / n, 3),
            "latency_ms": (r.latency_s * 1e3).round(3).tolist()}


def generator_check(port: int, path: str, body_file: Path, bodies: list[bytes], *,
                    rate: float, seconds: float, server_pid: int | None) -> dict:
    """wrk, Python, wrk, Python at ``rate`` on one server: pooled percentiles per generator,
    and each slot's generator and server CPU per request."""
    slots = []
    for gen in ("wrk", "python") * 2:
        if gen == "wrk":
            r = run_wrk(port, path, body_file, rate=rate, seconds=seconds,
                        server_pid=server_pid)
        else:
            r = python_load(port, path, bodies, rate=rate, seconds=seconds,
                            server_pid=server_pid)
        slots.append({"generator": gen, **r})
    out: dict = {g: percentiles([x for s in slots if s["generator"] == g
                                 for x in s["latency_ms"]]) for g in ("wrk", "python")}
    out["slots"] = [{k: v for k, v in s.items() if k != "latency_ms"} for s in slots]
    return out


def percentiles(lat_ms: list[float] | np.ndarray) -> dict:
    """p50 / p99 / p99.9 / max of a latency sample, in ms (None when empty)."""
    a = np.asarray(lat_ms, dtype=np.float64)
    if not a.size:
        return {"p50_ms": None, "p99_ms": None, "p999_ms": None, "max_ms": None}
    p50, p99, p999 = np.percentile(a, [50, 99, 99.9])
    return {"p50_ms": round(float(p50), 3), "p99_ms": round(float(p99), 3),
            "p999_ms": round(float(p999), 3), "max_ms": round(float(a.max()), 3)}


def summarize(runs: list[list[dict]], rates: list[float]) -> dict:
    """Per server and rate: each run's pooled percentiles, then median and range of runs."""
    out: dict = {}
    for name in ("bubblecast", "mlflow"):
        for rate in [*rates, 0.0]:
            per_run = []
            for slots in runs:
                mine = [s for s in slots if s["server"] == name and s["rate"] == rate]
                lat = [x for s in mine for x in s["latency_ms"]]
                per_run.append({**percentiles(lat), "achieved_rps": round(float(np.mean(
                    [s["achieved_rps"] for s in mine])), 1),
                    "errors": sum(s["non200"] + s["socket_errors"] for s in mine),
                    "load": [s["load_before"] for s in mine]})
            agg = {k: {"median": float(np.median([r[k] for r in per_run])),
                       "min": min(r[k] for r in per_run), "max": max(r[k] for r in per_run)}
                   for k in ("p50_ms", "p99_ms", "achieved_rps")}
            out[f"{name}@{'capacity' if rate == 0 else f'{rate:g}'}"] = {"runs": per_run, **agg}
    return out


def table(summary: dict, speedups: list[float], check: dict | None) -> str:
    """The printed summary: median (range) of the runs per server and rate."""
    lines = [f"{'server@rate':<22} {'p50 ms (median, range)':>28} "
             f"{'p99 ms (median, range)':>28} {'req/s':>8}"]
    for key, s in summary.items():
        p50, p99, thr = s["p50_ms"], s["p99_ms"], s["achieved_rps"]
        lines.append(f"{key:<22} {p50['median']:>10.2f} ({p50['min']:.2f}-{p50['max']:.2f})"
                     f"{'':>3} {p99['median']:>10.2f} ({p99['min']:.2f}-{p99['max']:.2f})"
                     f"{'':>3} {thr['median']:>8.1f}")
    lines.append("capacity bubblecast / mlflow, per pair: "
                 + ", ".join(f"{x:.2f}x" for x in speedups))
    for gen, p in (check or {}).items():
        if gen != "slots":
            lines.append(f"generator check, {gen}: p50 {p['p50_ms']} ms, p99 {p['p99_ms']} ms")
    return "\n".join(lines)
