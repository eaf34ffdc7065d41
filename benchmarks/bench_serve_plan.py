"""``POST /v1/plan`` under ``bubblecast serve``, measured as ``bench_serve.py`` measures forecasts.

Issue 24's service goal: p99 <= 20 ms at 100 requests/s for 1,024 documents, 8 replicas and 16
micro-batches. Needs ``wrk`` (``apt-get install -y wrk``; one-line exit when missing). The load
is bench_serve's: wrk open-loop at a fixed offered rate, one connection per thread (16 at a
rate, 8 closed-loop), latency from each request's due time (``bench_serve.lua``, loaded by
``bench_serve_plan.lua``, which also compares every answer's body with the answer its request
must get). Server start-up is bench_serve's too (``bubblecast serve ... --watch-interval 0
--workers N``, fresh for every run, ready on ``/readyz``); serve needs a forecasting model to
start, so the committed ``models/default`` is loaded, though planning does not use it.

Bodies: ``--bodies`` seeded steps of 1,024 documents drawn from the ``lognormal`` preset
(``DocumentSource("lognormal").sample``), token budget 4096, 8 replicas x 16 micro-batches, 4
stages, 1F1B, cost = ``WorkCost.attention(0.5, preset mean length, 4096)``'s coefficients; in
half of them (seeded) one replica's speed is 1.5, the others equal (``speeds`` null). Every
body's answer is fetched once and validated as a plan (every document exactly once, no
micro-batch over the budget, 8 x 16 micro-batches in all, one list per replica) and must equal
the in-process answer byte for byte; wrk then checks each answer under load against it.

Each of ``--repeats`` runs: warm-up (2 s closed loop, not recorded), two slots of ``--seconds``
at each offered rate (pooled per run, as bench_serve pools its two slots), one closed-loop
capacity slot; the load average beside every slot, the server's CPU per request and GC.
Beside it, in-process: ``bubblecast.plan_batch`` on the same bodies, and the route's own work
without HTTP (parse + plan + JSON), median and p99. Writes ``benchmarks/results/
serve_plan.json`` (``_results.run_header``/``write_json``). Usage:
``python benchmarks/bench_serve_plan.py [--repeats 3] [--rates 100] [--seconds 6] [--workers 2]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
LUA = Path(__file__).resolve().parent / "bench_serve_plan.lua"
PATH = "/v1/plan"
DOCUMENTS, TOKEN_BUDGET, REPLICAS, MICROBATCHES, STAGES = 1024, 4096, 8, 16, 4
SCHEDULE, ATTENTION_SHARE, SLOW = "1f1b", 0.5, 1.5


def plan_requests(n: int, seed: int = 0, *, documents: int = DOCUMENTS,
                  token_budget: int = TOKEN_BUDGET, replicas: int = REPLICAS,
                  microbatches: int = MICROBATCHES, stages: int = STAGES) -> list[dict]:
    """``n`` seeded ``POST /v1/plan`` bodies: ``documents`` lengths from the ``lognormal``
    preset each, the attention cost at the preset's mean length, and in exactly half of them
    (which ones and which replica seeded) one replica at speed 1.5, the rest ``speeds: null``."""
    from bubblecast.sim.documents import DocumentSource, WorkCost

    source = DocumentSource("lognormal", token_budget)
    cost = WorkCost.attention(ATTENTION_SHARE, source.mean_length(), token_budget).to_json()
    rng = np.random.default_rng(seed)
    slow = set(rng.permutation(n)[: n // 2].tolist())
    out = []
    for i in range(n):
        speeds = None
        if i in slow:
            speeds = [1.0] * replicas
            speeds[int(rng.integers(replicas))] = SLOW
        out.append({"lengths": source.sample(rng, documents).tolist(),
                    "token_budget": token_budget, "replicas": replicas,
                    "microbatches": microbatches, "stages": stages, "schedule": SCHEDULE,
                    "speeds": speeds, "cost": cost})
    return out


def check_plan(plan: Any, request: dict) -> list[str]:
    """What is wrong with ``plan`` (a ``POST /v1/plan`` answer, parsed) as a plan of
    ``request``: empty when every document is placed exactly once, no micro-batch holds more
    than the token budget, there are ``replicas x microbatches`` micro-batches in one list per
    replica, and ``counts`` and ``cost`` match them."""
    if not isinstance(plan, dict):
        return [f"not a JSON object: {type(plan).__name__}"]
    missing = [k for k in ("counts", "microbatches", "cost", "method", "fallback")
               if k not in plan]
    if missing:
        return [f"missing keys {missing}"]
    lengths, budget = request["lengths"], request["token_budget"]
    mbs, problems = plan["microbatches"], []
    if len(mbs) != request["replicas"]:
        problems.append(f"{len(mbs)} replicas, expected {request['replicas']}")
    if plan["counts"] != [len(r) for r in mbs]:
        problems.append(f"counts {plan['counts']} do not match the micro-batch lists")
    total = request["replicas"] * request["microbatches"]
    if sum(len(r) for r in mbs) != total:
        problems.append(f"{sum(len(r) for r in mbs)} micro-batches, expected {total}")
    if [len(c) for c in plan["cost"]] != [len(r) for r in mbs]:
        problems.append("cost does not have one value per micro-batch")
    placed = [i for r in mbs for mb in r for i in mb]
    if any(not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(lengths)
           for i in placed):
        return [*problems, "an index that is not a document of the request"]
    if sorted(placed) != list(range(len(lengths))):
        counts = np.bincount(np.asarray(placed, dtype=np.int64), minlength=len(lengths))
        problems.append(f"{int((counts == 0).sum())} documents missing, "
                        f"{int((counts > 1).sum())} placed more than once")
    over = [(r, j, t) for r, rep in enumerate(mbs) for j, mb in enumerate(rep)
            if (t := sum(lengths[i] for i in mb)) > budget]
    if over:
        r, j, t = over[0]
        problems.append(f"{len(over)} micro-batches over the budget {budget} "
                        f"(replica {r} #{j}: {t} tokens)")
    return problems


def slow_replica_counts(answers: list[dict], requests: list[dict]) -> dict:
    """Mean micro-batches of the slowed replica and of the others, over the requests with
    one, and of every replica over those without (the planner's GREYHOUND S2 effect)."""
    slow, others, equal = [], [], []
    for plan, req in zip(answers, requests, strict=True):
        if req["speeds"] is None:
            equal += plan["counts"]
            continue
        s = int(np.argmax(req["speeds"]))
        slow.append(plan["counts"][s])
        others += [c for r, c in enumerate(plan["counts"]) if r != s]
    mean = (lambda xs: round(float(np.mean(xs)), 3) if xs else None)  # noqa: E731
    return {"slow_replica": mean(slow), "other_replicas": mean(others),
            "equal_speeds": mean(equal)}


def pooled(slots: list[dict]) -> dict:
    """One run's figures at one level: pooled percentiles of its slots, mean achieved rate,
    errors (non-200, wrong plans, socket errors), the load average before each slot."""
    from wrkload import percentiles

    return {**percentiles([x for s in slots for x in s["latency_ms"]]),
            "achieved_rps": round(float(np.mean([s["achieved_rps"] for s in slots])), 1),
            "requests": sum(s["requests"] for s in slots),
            "errors": sum(s["non200"] + s["socket_errors"] for s in slots),
            "first_error": next((s["first_non200"] for s in slots if s["first_non200"]), None),
            "server_cpu_ms_per_req": round(float(np.mean(
                [s.get("server_cpu_ms_per_req", np.nan) for s in slots])), 3),
            "load": [s["load_before"] for s in slots]}


def summarize(runs: list[dict[str, list[dict]]]) -> dict:
    """Per level (``100``, ..., ``capacity``): each run's pooled figures, then the median and
    range over runs of p50, p99 and the achieved rate."""
    out = {}
    for level in runs[0]:
        per_run = [pooled(run[level]) for run in runs]
        agg = {k: {"median": float(np.median([r[k] for r in per_run])),
                   "min": min(r[k] for r in per_run), "max": max(r[k] for r in per_run)}
               for k in ("p50_ms", "p99_ms", "achieved_rps")}
        out[level] = {"runs": per_run, **agg}
    return out


def start_server(model: str, workers: int, env: dict[str, str]) -> tuple[Any, int]:
    """``bubblecast serve`` started fresh as bench_serve starts it; (process, port)."""
    from bench_serve import free_port, start

    port = free_port()
    proc = start([str(BIN / "bubblecast"), "serve", "--model", model, "--port", str(port),
                   "--watch-interval", "0", "--workers", str(workers)], env,
                  f"http://127.0.0.1:{port}/readyz")
    time.sleep(3 if workers > 1 else 0)  # the other workers finish starting (as bench_serve)
    return proc, port


def fetch_answers(port: int, bodies: list[bytes]) -> list[bytes]:
    """Each body's answer over HTTP (raises on a non-200)."""
    import httpx

    out = []
    with httpx.Client(trust_env=False, timeout=30) as http:
        for body in bodies:
            r = http.post(f"http://127.0.0.1:{port}{PATH}", content=body,
                          headers={"content-type": "application/json"})
            if r.status_code != 200:
                raise RuntimeError(f"POST {PATH}: HTTP {r.status_code}: {r.text[:300]}")
            out.append(r.content)
    return out


def one_run(proc: Any, port: int, body_file: Path, rates: list[float], seconds: float,
            capacity: bool) -> dict[str, list[dict]]:
    """One run's slots by level: two at each offered rate (16 connections), then one
    closed-loop (8 connections), each with the server's GC over the slot."""
    import wrkload
    from wrkload import gc_stats, run_wrk

    levels = [(f"{r:g}", r, 16) for r in rates for _ in range(2)]
    levels += [("capacity", 0.0, 8)] if capacity else []
    out: dict[str, list[dict]] = {}
    saved, wrkload.LUA = wrkload.LUA, LUA  # run_wrk's command with this script
    try:
        run_wrk(port, PATH, body_file, rate=0, seconds=2, connections=4)  # warm-up
        for name, rate, conns in levels:
            g0 = gc_stats(port)
            r = run_wrk(port, PATH, body_file, rate=rate, seconds=seconds,
                        connections=conns, server_pid=proc.pid)
            g1 = gc_stats(port)
            r["server_gc"] = {"collections": int(g1["collections"] - g0["collections"]),
                              "pause_ms": round((g1["pause_s"] - g0["pause_s"]) * 1e3, 3)}
            out.setdefault(name, []).append(r)
    finally:
        wrkload.LUA = saved
    return out


def route_answer(body: bytes) -> bytes:
    """What the route answers for ``body``, without HTTP: ``PlanRequest`` parse + the app's
    ``plan_json`` (the planner and its JSON)."""
    from bubblecast.serve.app import plan_json
    from bubblecast.serve.schemas import PlanRequest

    return plan_json(PlanRequest.model_validate_json(body))


def in_process(requests: list[dict], bodies: list[bytes], calls: int) -> dict:
    """``bubblecast.plan_batch`` on the parsed requests, and the route's work without HTTP
    (:func:`route_answer`), ``calls`` each after one warm-up pass over the bodies:
    wall-clock median, p99 and max, mean CPU."""
    from bubblecast import plan_batch

    def library(i: int) -> Any:
        q = requests[i]
        return plan_batch(q["lengths"], token_budget=q["token_budget"], replicas=q["replicas"],
                          microbatches=q["microbatches"], stages=q["stages"],
                          schedule=q["schedule"], cost=q["cost"], speeds=q["speeds"])

    def route(i: int) -> bytes:
        return route_answer(bodies[i])

    out: dict[str, Any] = {"calls": calls}
    for name, fn in (("plan_batch", library), ("parse_plan_json", route)):
        for i in range(len(bodies)):  # warm-up
            fn(i)
        wall, cpu = [], []
        for k in range(calls):
            t0, c0 = time.perf_counter(), time.process_time()
            fn(k % len(bodies))
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        out[name] = {"wall_p50_ms": round(float(np.median(wall) * 1e3), 3),
                     "wall_p99_ms": round(float(np.percentile(wall, 99) * 1e3), 3),
                     "wall_max_ms": round(float(np.max(wall) * 1e3), 3),
                     "cpu_mean_ms": round(float(np.mean(cpu) * 1e3), 3)}
    return out


def table(summary: dict, runs_inproc: dict) -> str:
    """Per level, each run's p50 / p99 / p99.9 / max, rate, errors and load, then the
    median (range) over runs; then the in-process rows."""
    lines = [f"{'level':<10} {'run':>4} {'p50 ms':>8} {'p99 ms':>8} {'p99.9 ms':>9} "
             f"{'max ms':>8} {'req/s':>7} {'errors':>6} {'cpu ms/req':>10}  load before slots"]
    for level, s in summary.items():
        for i, r in enumerate(s["runs"]):
            lines.append(f"{level:<10} {i + 1:>4} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} "
                         f"{r['p999_ms']:>9.2f} {r['max_ms']:>8.2f} {r['achieved_rps']:>7.1f} "
                         f"{r['errors']:>6} {r['server_cpu_ms_per_req']:>10.2f}  "
                         f"{', '.join(f'{x:.2f}' for x in r['load'])}")
        p50, p99 = s["p50_ms"], s["p99_ms"]
        lines.append(f"{level:<10} {'all':>4} {p50['median']:>8.2f} {p99['median']:>8.2f}  "
                     f"(median of runs; p50 {p50['min']:.2f}-{p50['max']:.2f}, "
                     f"p99 {p99['min']:.2f}-{p99['max']:.2f})")
    for name in ("plan_batch", "parse_plan_json"):
        p = runs_inproc[name]
        lines.append(f"in-process {name:<16} p50 {p['wall_p50_ms']:.2f} ms, p99 "
                     f"{p['wall_p99_ms']:.2f} ms, max {p['wall_max_ms']:.2f} ms, cpu mean "
                     f"{p['cpu_mean_ms']:.2f} ms ({runs_inproc['calls']} calls)")
    return "\n".join(lines)


def validate(answers: list[bytes], requests: list[dict], reference: list[bytes]) -> dict:
    """Every answer checked as a plan of its request and compared with the in-process one."""
    parsed = [json.loads(a) for a in answers]
    problems = {i: p for i, (a, q) in enumerate(zip(parsed, requests, strict=True))
                if (p := check_plan(a, q))}
    return {"bodies": len(answers), "valid": not problems,
            "problems": {str(i): p for i, p in problems.items()},
            "equal_to_in_process": [a == b for a, b in zip(answers, reference, strict=True)],
            "methods": sorted({a["method"] for a in parsed}),
            "fallbacks": sum(a["fallback"] is not None for a in parsed),
            "counts": slow_replica_counts(parsed, requests)}


def have(module: str) -> str | None:
    """``module`` when importable (uvicorn then uses it), else None."""
    import importlib.util

    return module if importlib.util.find_spec(module) is not None else None


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True,
                              timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return " ".join(f"{x:.2f}" for x in os.getloadavg())


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="runs, each with a fresh server")
    ap.add_argument("--rates", default="100", help="offered rates, req/s")
    ap.add_argument("--seconds", type=float, default=6.0, help="seconds per slot")
    ap.add_argument("--workers", type=int, default=2, help="server worker processes")
    ap.add_argument("--capacity", action=argparse.BooleanOptionalAction, default=True,
                    help="also one closed-loop slot (8 connections) per run")
    ap.add_argument("--bodies", type=int, default=32, help="distinct seeded request bodies")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--calls", type=int, default=500, help="in-process calls, each kind")
    ap.add_argument("--goal-rate", type=float, default=100.0)
    ap.add_argument("--goal-p99-ms", type=float, default=20.0)
    ap.add_argument("--model", default=str(ROOT / "models" / "default"),
                    help="forecasting model serve loads to start (planning does not use it)")
    ap.add_argument("--out", type=Path,
                    default=ROOT / "benchmarks" / "results" / "serve_plan.json")
    return ap.parse_args()


def main() -> None:
    from _results import run_header, write_json
    from bench_serve import stop
    from wrkload import require_wrk

    args = parse_args()
    rates = [float(x) for x in args.rates.split(",")]
    wrk = require_wrk()
    version = subprocess.run([wrk, "-v"], capture_output=True, text=True).stdout.split("\n")[0]
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(ROOT)}
    doc = run_header("serve_plan", uptime_at_start=_uptime(),
                     loadavg_at_start=[round(x, 2) for x in os.getloadavg()], setting={
                         "generator": f"{version.strip()} + benchmarks/bench_serve_plan.lua",
                         "uvicorn_http": have("httptools") or "h11",
                         "uvicorn_loop": have("uvloop") or "asyncio", "workers": args.workers,
                         "rates": rates, "seconds_per_slot": args.seconds,
                         "repeats": args.repeats, "documents": DOCUMENTS,
                         "token_budget": TOKEN_BUDGET, "replicas": REPLICAS,
                         "microbatches": MICROBATCHES, "stages": STAGES, "schedule": SCHEDULE})
    requests = plan_requests(args.bodies, args.seed)
    bodies = [json.dumps(q, separators=(",", ":")).encode() for q in requests]
    doc["request"] = {k: v for k, v in requests[0].items() if k not in ("lengths", "speeds")}
    doc["request"]["bodies"] = args.bodies
    doc["request"]["with_slow_replica"] = sum(q["speeds"] is not None for q in requests)
    doc["request"]["body_bytes_mean"] = round(float(np.mean([len(b) for b in bodies])))
    runs, checks = [], []
    with tempfile.TemporaryDirectory(prefix="bench-serve-plan-") as tmpdir:
        from wrkload import write_bodies

        body_file = write_bodies(bodies, Path(tmpdir))
        reference = [route_answer(b) for b in bodies]
        for i in range(args.repeats):
            proc, port = start_server(args.model, args.workers, env)
            try:
                answers = fetch_answers(port, bodies)
                checks.append(validate(answers, requests, reference))
                Path(f"{body_file}.expected").write_bytes(b"\n".join(answers) + b"\n")
                runs.append(one_run(proc, port, body_file, rates, args.seconds,
                                    args.capacity))
            finally:
                stop(proc)
            print(f"run {i + 1}/{args.repeats} done, load {os.getloadavg()[0]:.2f}", flush=True)
    inproc = in_process(requests, bodies, args.calls)
    finish(doc, args, runs, checks, inproc)
    write_json(args.out, doc)


def finish(doc: dict, args: argparse.Namespace, runs: list[dict], checks: list[dict],
           inproc: dict) -> None:
    """Summary, goal, headline scalars (for the results page), the slots and the table."""
    summary = summarize(runs)
    goal = summary.get(f"{args.goal_rate:g}", {}).get("runs", [])
    valid = all(c["valid"] and all(c["equal_to_in_process"]) for c in checks)
    errors = sum(r["errors"] for s in summary.values() for r in s["runs"])
    met = bool(goal) and valid and all(
        r["p99_ms"] is not None and r["p99_ms"] <= args.goal_p99_ms and r["errors"] == 0
        and r["achieved_rps"] >= 0.95 * args.goal_rate for r in goal)
    at = summary.get(f"{args.goal_rate:g}")
    doc.update({
        "rate_rps": args.goal_rate, "workers": args.workers, "runs_n": len(runs),
        "p50_ms_median_run": at and at["p50_ms"]["median"],
        "p99_ms_median_run": at and at["p99_ms"]["median"],
        "p99_ms_worst_run": at and at["p99_ms"]["max"],
        "achieved_rps": at and at["achieved_rps"]["median"],
        "capacity_rps": summary["capacity"]["achieved_rps"]["median"]
        if "capacity" in summary else None,
        "errors": errors, "every_response_a_valid_plan": valid and errors == 0,
        "in_process_plan_batch_p50_ms": inproc["plan_batch"]["wall_p50_ms"],
        "in_process_plan_batch_p99_ms": inproc["plan_batch"]["wall_p99_ms"],
        f"goal_p99_le_{args.goal_p99_ms:g}ms_at_{args.goal_rate:g}_every_run": met,
        "uptime_at_end": _uptime(),
        "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
        "args": {k: str(v) for k, v in vars(args).items()},
        "summary": summary, "in_process": inproc, "plan_checks": checks,
        "runs": [{level: [{k: v for k, v in s.items() if k != "latency_ms"} for s in slots]
                  for level, slots in run.items()} for run in runs]})
    print(table(summary, inproc))
    print(f"plans valid and equal to in-process in every run: {valid}; slow-replica counts: "
          f"{checks[0]['counts'] if checks else None}; errors: {errors}; goal met: {met}")
    print(f"load: {doc['uptime_at_start']} at start; {doc['uptime_at_end']} at end")


if __name__ == "__main__":
    main()
