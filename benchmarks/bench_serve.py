"""``bubblecast serve`` against ``mlflow models serve`` on the same LightGBM model, on loopback.

Needs ``wrk`` (``apt-get install -y wrk``; one-line exit when missing): a compiled generator in
its own process, so generator CPU and lateness stay out of the servers' latencies (the Python
``benchmarks/loadgen.py``, kept for the client tests, is compared once: ``generator_check``).
``bench_serve.lua`` makes wrk open-loop at a constant rate, latency from due times (as wrk2,
which Debian lacks). Setup trains a small LightGBM forecaster, saves it as a model directory
and logs it to MLflow (SQLite store) as ``train`` does (``modeldir.log_model``: the pyfunc face
users get, bubblecast's source in ``code_paths``). Then ``--repeats`` runs, each with both
servers freshly started (``--workers`` each, default 2): at every offered rate, then at
closed-loop capacity (8 connections), bubblecast, mlflow, bubblecast, mlflow (paired,
alternating), ``--seconds`` each. bubblecast answers ``POST /v1/forecast`` from a raw window
(4 stages x 64 steps); MLflow, started without bubblecast on ``PYTHONPATH``, answers
``POST /invocations`` with the window's *precomputed* feature rows (the signature's columns;
less work). A run's p99 pools its two slots per server and rate; the summary gives median and
range over runs, with the load average beside every slot (the machine is shared) and
bubblecast's own GC count and pause time per slot. Also: the fail-open client and the
in-process ``Predictor``. Writes ``benchmarks/results/bench_serve.json``; 127.0.0.1 only. Usage:
``python benchmarks/bench_serve.py [--repeats 3] [--rates 100,250,500] [--seconds 6]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from wrkload import (
    gc_stats,
    generator_check,
    require_wrk,
    run_wrk,
    summarize,
    table,
    write_bodies,
)

from bubblecast.telemetry.io import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
STAGES, STEPS, MB, HORIZONS = 4, 64, 8, [1, 5, 10]

def _have(module: str) -> str | None:
    """``module`` when importable (uvicorn then uses it for both servers), else None."""
    import importlib.util

    return module if importlib.util.find_spec(module) is not None else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def window(seed: int, steps: int, stages: int = STAGES) -> np.ndarray:
    """Compute seconds ``(steps, stages)``: per-stage drift, periodic spikes, noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(steps)[:, None]
    base = 1.0 + 0.15 * np.arange(stages)[None, :]
    drift = 1.0 + 0.4 * (t / steps) * (np.arange(stages)[None, :] == seed % stages)
    spikes = 1.0 + 0.8 * ((t % (11 + seed % 7)) == 0) * (np.arange(stages)[None, :] == 1)
    return base * drift * spikes * (1.0 + 0.03 * rng.standard_normal((steps, stages)))


def train(tmp: Path, runs: int) -> tuple[Path, Any]:
    """A fitted LightGBM forecaster saved as a model directory, and a few of its training
    rows (the sample ``log_model`` checks the signature's columns on)."""
    import pandas as pd

    from bubblecast.dataset.features import build_features
    from bubblecast.dataset.window import Window
    from bubblecast.forecast.lgbm import LGBMForecaster
    from bubblecast.forecast.modeldir import save_model
    from bubblecast.forecast.served import window_series

    parts = []
    for i in range(runs):
        c = window(i, 300)
        s = window_series(Window(compute=c, cost=np.full(c.shape, 2.0), microbatches=MB), 0)
        s["run_id"] = f"run{i}"
        parts.append(s)
    series = pd.concat(parts, ignore_index=True)
    series["run_id"] = series["run_id"].astype("category")
    series["scenario"] = series["scenario"].astype("category")
    frame = build_features(series)
    model = LGBMForecaster(n_estimators=200, seed=0).fit(frame)
    return (save_model(model, tmp / "lgbm", metrics={"note": "synthetic benchmark model"}),
            frame.head(5))


def log_pyfunc(tmp: Path, model_dir: Path, sample: Any) -> tuple[str, str]:
    """Log ``model_dir`` as ``train`` does, in a SQLite store; (tracking URI, model URI)."""
    from bubblecast.forecast.modeldir import log_model
    from bubblecast.forecast.tracking import DEFAULT_EXPERIMENT, create_experiment, mlflow_run

    tracking = f"sqlite:///{tmp / 'mlflow.db'}"
    create_experiment(tracking, DEFAULT_EXPERIMENT, tmp / "mlruns")
    with mlflow_run(tracking, "bench-serve") as mlflow:
        info = log_model(mlflow, model_dir, sample, None, None)
    return tracking, info["model_uri"]


def bodies(model_dir: Path, n: int) -> tuple[list[bytes], list[bytes], list[np.ndarray]]:
    """Forecast requests for bubblecast, the same windows' feature rows for MLflow, and the
    expected work per stage (to compare the two servers' answers)."""
    from bubblecast.dataset.window import Window
    from bubblecast.forecast.modeldir import load_model
    from bubblecast.forecast.served import FeatureModel
    from bubblecast.forecast.tracking import forecaster_inputs

    model = load_model(model_dir)
    exact = FeatureModel(model, fast=False)  # the dataset's own build_features
    cols = forecaster_inputs(model)  # the logged signature's columns
    ours, theirs, work = [], [], []
    for i in range(n):
        c = window(1000 + i, STEPS)
        ours.append(json.dumps({
            "pipeline": {"schedule": "1f1b", "stages": STAGES, "microbatches": MB},
            "horizons": HORIZONS,
            "ranks": [{"rank": s, "stage": s, "compute_s": c[:, s].round(9).tolist(),
                       "work": [2.0] * STEPS} for s in range(STAGES)]}).encode())
        w = Window(compute=np.round(c, 9), cost=np.full(c.shape, 2.0), microbatches=MB)
        data = exact.origin_rows(w, HORIZONS)[cols].to_numpy(dtype=np.float64)
        data = np.where(np.isfinite(data), data, None).tolist()
        theirs.append(json.dumps({"dataframe_split": {"columns": cols, "data": data}}).encode())
        work.append(np.full(STAGES, 2.0 * MB))
    return ours, theirs, work


def start(cmd: list[str], env: dict[str, str], url: str, timeout: float = 180.0
          ) -> subprocess.Popen:
    import httpx

    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + timeout
    with httpx.Client(trust_env=False) as http:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{cmd[0]} exited: {proc.stderr.read().decode()[-3000:]}")
            try:
                if http.get(url, timeout=1.0).status_code == 200:
                    return proc
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
    stop(proc)
    raise RuntimeError(f"{' '.join(cmd)} did not become ready in {timeout} s")


def stop(proc: subprocess.Popen) -> None:
    """Stop a server we started (its whole process group: mlflow execs uvicorn)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)
    if proc.stderr is not None:
        proc.stderr.close()


def model_info(port: int) -> dict:
    import httpx

    with httpx.Client(trust_env=False, timeout=30) as http:
        return http.get(f"http://127.0.0.1:{port}/v1/model").json()


def fail_open(port: int, req: bytes, calls: int) -> dict:
    """Client latency with nothing listening on ``port`` and with a server that never
    answers; every call must return None."""
    from bubblecast.serve.client import CircuitBreaker, Client

    out = {}
    body = json.loads(req)
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(64)  # accepts the handshake, never answers
        for name, target in (("killed", port), ("hung", hung.getsockname()[1])):
            c = Client(f"http://127.0.0.1:{target}", timeout=0.05, retries=1,
                       breaker=CircuitBreaker(failures=10**9))  # never short-circuit here
            lat, nones = [], 0
            for _ in range(calls):
                t0 = time.perf_counter()
                nones += c.forecast(body) is None
                lat.append(time.perf_counter() - t0)
            c.close()
            ms = np.array(lat) * 1e3
            out[name] = {"calls": calls, "returned_none": int(nones),
                         "p50_ms": round(float(np.median(ms)), 3),
                         "p99_ms": round(float(np.percentile(ms, 99)), 3),
                         "max_ms": round(float(ms.max()), 3)}
    return out


def in_process(model_dir: Path, reqs: list[bytes], n: int) -> dict:
    from bubblecast.serve.predictor import Predictor
    from bubblecast.serve.schemas import ForecastRequest

    pred = Predictor.from_source(str(model_dir))
    parsed = [ForecastRequest.model_validate_json(b) for b in reqs]
    for r in parsed:
        pred.forecast(r)
    cpu, wall = [], []
    for i in range(n):
        t0, c0 = time.perf_counter(), time.process_time()
        pred.forecast(parsed[i % len(parsed)])
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return {"calls": n, "predict_path": getattr(pred.loaded.model, "predict_path", None),
            "wall_p50_ms": round(float(np.median(wall) * 1e3), 3),
            "wall_p99_ms": round(float(np.percentile(wall, 99) * 1e3), 3),
            "cpu_mean_ms": round(float(np.mean(cpu) * 1e3), 3)}


def agree(port_ours: int, port_mlflow: int, ours: bytes, theirs: bytes, work: np.ndarray
          ) -> bool:
    """Both servers give the same p50 for the same window (ours in seconds, theirs in the
    delay signal: seconds = signal x work)."""
    import httpx

    with httpx.Client(trust_env=False, timeout=30) as http:
        a = http.post(f"http://127.0.0.1:{port_ours}/v1/forecast", content=ours,
                      headers={"content-type": "application/json"}).json()
        b = http.post(f"http://127.0.0.1:{port_mlflow}/invocations", content=theirs,
                      headers={"content-type": "application/json"}).json()
    rows = b["predictions"] if isinstance(b, dict) else b
    for i, h in enumerate(HORIZONS):
        mine = np.array([r["p50"][i] for r in a["ranks"]])
        other = np.array([row[f"p50_h{h}"] for row in rows]) * work
        if not np.allclose(mine, other, rtol=1e-5):
            return False
    return True


def servers(model_dir: Path, model_uri: str, tracking: str, env: dict[str, str],
            workers: int) -> dict[str, tuple[subprocess.Popen, int, str]]:
    """Both servers started fresh: name -> (process, port, path); ``workers`` each."""
    p_ours, p_mlflow = free_port(), free_port()
    ours = start([str(BIN / "bubblecast"), "serve", "--model", str(model_dir), "--port",
                  str(p_ours), "--watch-interval", "0", "--workers", str(workers)], env,
                 f"http://127.0.0.1:{p_ours}/readyz")
    try:
        theirs = start([str(BIN / "mlflow"), "models", "serve", "-m", model_uri,
                        "--env-manager", "local", "-h", "127.0.0.1", "-p", str(p_mlflow),
                        "-w", str(workers)],
                       {**{k: v for k, v in env.items() if k != "PYTHONPATH"},
                        "MLFLOW_TRACKING_URI": tracking},
                       f"http://127.0.0.1:{p_mlflow}/ping")
    except Exception:
        stop(ours)
        raise
    return {"bubblecast": (ours, p_ours, "/v1/forecast"),
            "mlflow": (theirs, p_mlflow, "/invocations")}


def one_run(procs: dict, files: dict[str, Path], rates: list[float], seconds: float
            ) -> list[dict]:
    """Every level of one run, paired: at each rate (then at closed-loop capacity, rate 0 on
    8 connections) bubblecast, mlflow, bubblecast, mlflow."""
    for name, (_, port, path) in procs.items():  # warm-up, not recorded
        run_wrk(port, path, files[name], rate=0, seconds=2, connections=4)
    slots = []
    for rate in [*rates, 0.0]:
        for slot, name in enumerate(("bubblecast", "mlflow") * 2):
            proc, port, path = procs[name]
            ours = name == "bubblecast"
            g0 = gc_stats(port) if ours else {}
            r = run_wrk(port, path, files[name], rate=rate, seconds=seconds,
                        connections=16 if rate else 8, server_pid=proc.pid if ours else None)
            if ours:  # the server's own GC count and time over the slot, and longest pause
                g1 = gc_stats(port)
                r["server_gc"] = {"collections": int(g1["collections"] - g0["collections"]),
                                  "pause_ms": round((g1["pause_s"] - g0["pause_s"]) * 1e3, 3),
                                  "longest_so_far_ms": round(g1["pause_max_s"] * 1e3, 3)}
            slots.append({"server": name, "slot": slot // 2, **r})
    return slots


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="runs, each with fresh servers")
    ap.add_argument("--rates", default="100,250,500", help="offered rates, req/s")
    ap.add_argument("--seconds", type=float, default=6.0, help="seconds per slot")
    ap.add_argument("--goal-rate", type=float, default=500.0)
    ap.add_argument("--workers", type=int, default=2, help="worker processes, each server")
    ap.add_argument("--generator-check", action=argparse.BooleanOptionalAction, default=True,
                    help="in run 1, also wrk vs the Python generator at the goal rate")
    ap.add_argument("--runs", type=int, default=8, help="synthetic training runs")
    ap.add_argument("--out", type=Path,
                    default=ROOT / "benchmarks" / "results" / "bench_serve.json")
    args = ap.parse_args()
    rates = [float(x) for x in args.rates.split(",")]
    wrk = require_wrk()
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(ROOT)}
    env.pop("MLFLOW_TRACKING_URI", None)
    version = subprocess.run([wrk, "-v"], capture_output=True, text=True).stdout.split("\n")[0]
    results: dict = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                 "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
                                 "uvicorn_http": _have("httptools") or "h11",
                                 "uvicorn_loop": _have("uvloop") or "asyncio",
                                 "generator": f"{version.strip()} + benchmarks/bench_serve.lua"},
                     "stages": STAGES, "window_steps": STEPS, "horizons": HORIZONS,
                     "args": {k: str(v) for k, v in vars(args).items()}}
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmpdir:
        tmp = Path(tmpdir)
        t0 = time.perf_counter()
        model_dir, sample = train(tmp, args.runs)
        tracking, model_uri = log_pyfunc(tmp, model_dir, sample)
        results["setup_s"] = round(time.perf_counter() - t0, 1)
        ours, theirs, work = bodies(model_dir, 16)
        files = {"bubblecast": write_bodies(ours, tmp), "mlflow": write_bodies(theirs, tmp)}
        runs = []
        for i in range(args.repeats):
            procs = servers(model_dir, model_uri, tracking, env, args.workers)
            time.sleep(3 if args.workers > 1 else 0)  # the other workers finish starting
            try:
                if i == 0:
                    results["feature_path"] = model_info(procs["bubblecast"][1]).get(
                        "feature_path")
                    results["outputs_agree"] = agree(procs["bubblecast"][1],
                                                     procs["mlflow"][1], ours[0], theirs[0],
                                                     work[0])
                runs.append(one_run(procs, files, rates, args.seconds))
                if i == 0 and args.generator_check:
                    proc, port, path = procs["bubblecast"]
                    results["generator_check"] = generator_check(
                        port, path, files["bubblecast"], ours, rate=args.goal_rate,
                        seconds=args.seconds, server_pid=proc.pid)
            finally:
                for proc, _, _ in procs.values():
                    stop(proc)
            print(f"run {i + 1}/{args.repeats} done, load {os.getloadavg()[0]:.2f}",
                  flush=True)
        results["fail_open"] = fail_open(free_port(), ours[0], 200)
        results["in_process"] = in_process(model_dir, ours, 500)
    summary = summarize(runs, rates)
    cap = [(a["achieved_rps"], b["achieved_rps"]) for slots in runs
           for a, b in zip([s for s in slots if s["rate"] == 0 and s["server"] == "bubblecast"],
                           [s for s in slots if s["rate"] == 0 and s["server"] == "mlflow"],
                           strict=True)]
    speedups = [round(a / max(b, 1e-9), 2) for a, b in cap]
    goal = summary[f"bubblecast@{args.goal_rate:g}"]["runs"] if args.goal_rate in rates else []
    results["summary"] = summary
    results["capacity_speedup_per_pair"] = speedups
    results["goals"] = {
        f"p99_le_10ms_at_{args.goal_rate:g}_in_every_run": bool(goal) and all(
            r["p99_ms"] is not None and r["p99_ms"] <= 10.0 and r["errors"] == 0
            and r["achieved_rps"] >= 0.95 * args.goal_rate for r in goal),
        "capacity_ge_3x_mlflow_every_pair": bool(speedups) and min(speedups) >= 3.0}
    results["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    results["runs"] = [[{k: v for k, v in s.items() if k != "latency_ms"} for s in slots]
                       for slots in runs]
    print(table(summary, speedups, results.get("generator_check")))
    print(f"outputs agree: {results['outputs_agree']}; goals: {results['goals']}; load "
          f"{results['machine']['loadavg_at_start'][0]} at start, "
          f"{results['machine']['loadavg_at_end'][0]} at end")
    atomic_write_text(args.out, json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
