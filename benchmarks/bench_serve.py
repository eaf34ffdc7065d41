"""``bubblecast serve`` against ``mlflow models serve`` on the same LightGBM model, on loopback.

One run trains a small LightGBM forecaster (synthetic runs: drift, periodic spikes, noise),
saves it as a bubblecast model directory and logs the same directory as an MLflow pyfunc
(models-from-code wrapper calling the forecaster's ``predict_signal``) in a temporary SQLite
store. Each server then runs alone, one uvicorn worker each, and is measured with the same
load generator (raw keep-alive HTTP/1.1 from another process):

- closed loop at concurrency 1, 8 and 32: p50/p99 latency and throughput. bubblecast answers
  ``POST /v1/forecast`` from a raw window (4 stages x 64 steps: features, 9 boosters, bubble
  fraction by the timing engine); MLflow answers ``POST /invocations`` with the *precomputed*
  feature rows of the same windows (so it does strictly less work per request);
- open loop at ``--rate`` requests/s on bubblecast (latency counted from each request's due
  time, so queueing shows);
- the fail-open client with the service killed and with a service that never answers;
- the in-process ``Predictor`` (no HTTP).

Prints a table and writes ``benchmarks/results/serve.json``. Traffic goes to 127.0.0.1 only;
every loop is bounded in requests and seconds. Usage:
``python benchmarks/bench_serve.py [--requests N] [--max-seconds S] [--rate R]``.
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

import numpy as np
from loadgen import load  # benchmarks/loadgen.py (this script's directory is on the path)

from bubblecast.telemetry.io import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
STAGES, STEPS, MB, HORIZONS = 4, 64, 8, [1, 5, 10]

PYFUNC = '''
import mlflow
import pandas as pd


class BubblecastForecaster(mlflow.pyfunc.PythonModel):
    """The bubblecast LightGBM forecaster as an MLflow pyfunc: feature rows in, quantiles out."""

    def load_context(self, context):
        from bubblecast.forecast.modeldir import load_model

        self.model = load_model(context.artifacts["model_dir"])
        self.horizons = [int(h) for h in self.model.horizons_]

    def predict(self, context, model_input, params=None):
        preds = self.model.predict_signal(model_input, self.horizons)
        out = {}
        for h, q in preds.items():
            for j, name in enumerate(("p10", "p50", "p90")):
                out[f"h{h}_{name}"] = q[:, j]
        return pd.DataFrame(out)


mlflow.models.set_model(BubblecastForecaster())
'''


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


def train(tmp: Path, runs: int) -> Path:
    """A fitted LightGBM forecaster saved as a model directory."""
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
    model = LGBMForecaster(n_estimators=200, seed=0).fit(build_features(series))
    return save_model(model, tmp / "lgbm", metrics={"note": "synthetic benchmark model"})


def log_pyfunc(tmp: Path, model_dir: Path) -> tuple[str, str]:
    """Log ``model_dir`` as an MLflow pyfunc in a SQLite store; (tracking URI, model URI)."""
    import mlflow

    tracking = f"sqlite:///{tmp / 'mlflow.db'}"
    mlflow.set_tracking_uri(tracking)
    code = tmp / "pyfunc_model.py"
    code.write_text(PYFUNC)
    with mlflow.start_run():
        info = mlflow.pyfunc.log_model(name="model", python_model=str(code),
                                       artifacts={"model_dir": str(model_dir)},
                                       pip_requirements=["mlflow", "lightgbm", "pandas"])
    return tracking, info.model_uri


def bodies(model_dir: Path, n: int) -> tuple[list[bytes], list[bytes], list[np.ndarray]]:
    """Forecast requests for bubblecast, the same windows' feature rows for MLflow, and the
    expected work per stage (to compare the two servers' answers)."""
    from bubblecast.dataset.window import Window
    from bubblecast.forecast.modeldir import load_model
    from bubblecast.forecast.served import FeatureModel

    model = load_model(model_dir)
    exact = FeatureModel(model, fast=False)  # the dataset's own build_features
    cols = list(model.features_) + [f"x{h}_{g[2:]}" for h in HORIZONS
                                    for g in model.horizon_features_] + ["level"]
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


def measure(port: int, path: str, reqs: list[bytes], concurrency: int, total: int,
            max_seconds: float, rate: float | None = None) -> dict:
    """Warm up, then one bounded load run; latency percentiles in ms and throughput."""
    def make(i: int) -> tuple[str, str, bytes]:
        return "POST", path, reqs[i % len(reqs)]

    load("127.0.0.1", port, make, total=min(200, total), concurrency=concurrency,
         time_limit_s=30)
    r = load("127.0.0.1", port, make, total=total, concurrency=concurrency,
             time_limit_s=max_seconds, rate=rate)
    return {"concurrency": concurrency, "requests": r.completed, "errors": len(r.errors),
            "first_error": r.errors[0] if r.errors else None,
            "p50_ms": round(r.percentile_ms(50), 3), "p99_ms": round(r.percentile_ms(99), 3),
            "max_ms": round(float(r.latency_s.max() * 1e3), 3) if r.completed else None,
            "throughput_rps": round(r.throughput, 1), "seconds": round(r.elapsed_s, 2),
            **({"target_rps": rate} if rate else {})}


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
        other = np.array([row[f"h{h}_p50"] for row in rows]) * work
        if not np.allclose(mine, other, rtol=1e-5):
            return False
    return True


def table(results: dict) -> str:
    lines = [f"{'server':<12} {'conc':>4} {'req':>6} {'err':>4} {'p50 ms':>8} {'p99 ms':>8} "
             f"{'req/s':>8}"]
    for name in ("bubblecast", "mlflow"):
        for row in results[name]:
            lines.append(f"{name:<12} {row['concurrency']:>4} {row['requests']:>6} "
                         f"{row['errors']:>4} {row['p50_ms']:>8.2f} {row['p99_ms']:>8.2f} "
                         f"{row['throughput_rps']:>8.1f}")
    r = results["open_loop"]
    lines.append(f"bubblecast open loop at {r['target_rps']} req/s: p50 {r['p50_ms']:.2f} ms, "
                 f"p99 {r['p99_ms']:.2f} ms, achieved {r['throughput_rps']:.1f} req/s, "
                 f"{r['errors']} errors")
    for c, x in results["speedup"].items():
        lines.append(f"throughput bubblecast / mlflow at concurrency {c}: {x:.2f}x")
    for name, f in results["fail_open"].items():
        lines.append(f"client, service {name}: {f['returned_none']}/{f['calls']} None, "
                     f"p50 {f['p50_ms']:.1f} ms, p99 {f['p99_ms']:.1f} ms, max "
                     f"{f['max_ms']:.1f} ms (timeout 50 ms)")
    p = results["in_process"]
    lines.append(f"in-process Predictor: p50 {p['wall_p50_ms']:.2f} ms, p99 "
                 f"{p['wall_p99_ms']:.2f} ms, CPU {p['cpu_mean_ms']:.2f} ms per forecast")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000, help="requests per measured level")
    ap.add_argument("--max-seconds", type=float, default=20.0, help="time cap per level")
    ap.add_argument("--rate", type=float, default=500.0, help="open-loop rate (req/s)")
    ap.add_argument("--rate-seconds", type=float, default=10.0)
    ap.add_argument("--runs", type=int, default=8, help="synthetic training runs")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "serve.json")
    args = ap.parse_args()
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(ROOT)}
    env.pop("MLFLOW_TRACKING_URI", None)
    results: dict = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                 "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
                                 "uvicorn_http": _have("httptools") or "h11",
                                 "uvicorn_loop": _have("uvloop") or "asyncio"},
                     "stages": STAGES, "window_steps": STEPS, "horizons": HORIZONS}
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmpdir:
        tmp = Path(tmpdir)
        t0 = time.perf_counter()
        model_dir = train(tmp, args.runs)
        tracking, model_uri = log_pyfunc(tmp, model_dir)
        results["setup_s"] = round(time.perf_counter() - t0, 1)
        ours, theirs, work = bodies(model_dir, 16)
        p_ours, p_mlflow = free_port(), free_port()
        cmd = [str(BIN / "bubblecast"), "serve", "--model", str(model_dir), "--port",
               str(p_ours), "--watch-interval", "0"]
        server = start(cmd, env, f"http://127.0.0.1:{p_ours}/readyz")
        try:
            results["feature_path"] = model_info(p_ours).get("feature_path")
            results["bubblecast"] = [measure(p_ours, "/v1/forecast", ours, c, args.requests,
                                             args.max_seconds) for c in (1, 8, 32)]
            total = int(args.rate * args.rate_seconds)
            results["open_loop"] = measure(p_ours, "/v1/forecast", ours, 32, total,
                                           args.rate_seconds + 10, rate=args.rate)
            mlflow_cmd = [str(BIN / "mlflow"), "models", "serve", "-m", model_uri,
                          "--env-manager", "local", "-h", "127.0.0.1", "-p", str(p_mlflow),
                          "-w", "1"]
            mlflow_env = {**env, "MLFLOW_TRACKING_URI": tracking}
            mserver = start(mlflow_cmd, mlflow_env, f"http://127.0.0.1:{p_mlflow}/ping")
            try:
                results["outputs_agree"] = agree(p_ours, p_mlflow, ours[0], theirs[0], work[0])
                stop(server)  # measure MLflow alone on the machine
                results["mlflow"] = [measure(p_mlflow, "/invocations", theirs, c,
                                             args.requests, args.max_seconds)
                                     for c in (1, 8, 32)]
            finally:
                stop(mserver)
        finally:
            stop(server)
        results["fail_open"] = fail_open(p_ours, ours[0], 200)
        results["in_process"] = in_process(model_dir, ours, 500)
    results["speedup"] = {str(a["concurrency"]): round(a["throughput_rps"]
                                                       / max(b["throughput_rps"], 1e-9), 2)
                          for a, b in zip(results["bubblecast"], results["mlflow"],
                                          strict=True)}
    ol = results["open_loop"]
    results["goals"] = {
        "p99_le_10ms_at_rate": bool(ol["p99_ms"] <= 10.0
                                    and ol["throughput_rps"] >= 0.95 * args.rate),
        "throughput_ge_3x_mlflow": bool(min(results["speedup"].values()) >= 3.0),
    }
    results["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    print(table(results))
    print(f"outputs agree: {results['outputs_agree']}; feature path: "
          f"{results['feature_path']}; goals: {results['goals']}")
    atomic_write_text(args.out, json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
