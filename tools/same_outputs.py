"""Before/after equality of every SPEC command's outputs on the repository's ``data/`` files.

Runs the commands below twice: once with the code of a BEFORE git ref (checked out with
``git worktree add`` into a temporary folder and run with PYTHONPATH and cwd there, so the old
code runs) and once with the current working tree; then compares the JSON on stdout, the exit
codes, the first stderr line of refused inputs, the JSON files written, the Parquet files written
(rows sorted, pandas equality, plus the ``bubblecast`` key-value metadata) and the model
directories' text files. It prints one row per command: same, same+added (JSON keys only the
new code writes, which the SPEC allows) or DIFFERENT, with the first key that differs. Exit 0
when nothing is DIFFERENT (with --strict: nor added), 1 otherwise. No network, nothing outside
the repository.

    .venv/bin/python tools/same_outputs.py                 # e6fc373 (before issue 12) vs tree
    .venv/bin/python tools/same_outputs.py --before HEAD~3 --only inspect -v

``serve`` is compared through its replies: the server is started on a free loopback port with
``models/default`` and asked ``/v1/model`` (less ``loaded_at``), ``/v1/forecast`` and
``/v1/recommend`` for one fixed window. Left out: ``collect`` and ``run`` (real timings: two runs
never give the same numbers), ``demo`` (minutes; it chains the commands compared here), and the
``--plot`` PNGs.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib import error as urlerror
from urllib import request as urlrequest

from output_diff import first_difference  # tools/output_diff.py, next to this script

REPO = Path(__file__).resolve().parents[1]
DEFAULT_BEFORE = "e6fc373"
CLI = "import sys; from bubblecast.cli import main; sys.exit(main(sys.argv[1:]))"
SIM = [f"data/sim/{s}.parquet" for s in
       ("throttle", "failslow", "periodic", "seqlen", "mixed", "jitter")]
LIVE = ["data/live/cpu-slowdown.parquet", "data/live/cpu-predictive.parquet"]


@dataclass(frozen=True)
class Case:
    """One command: its arguments (``{out}`` is the side's output folder) and what it writes."""

    name: str
    args: tuple[str, ...]
    outputs: tuple[str, ...] = ()  # files or model directories under {out}
    json_stdout: bool = True


#: simulate cases: name -> options (every schedule; every scenario; replicas, chunks, runs).
SIMULATIONS = {
    "gpipe-none": "--schedule gpipe --steps 3",
    "1f1b-jitter": "--schedule 1f1b --steps 20 --scenario jitter --seed 1 --replicas 2 --comm 0.1",
    "interleaved-throttle": "--schedule interleaved --chunks 2 --steps 20 --scenario throttle "
                            "--seed 2 --f 2 --b 3 --w 1",
    "zb-h1-failslow": "--schedule zb-h1 --steps 30 --scenario failslow --seed 3",
    "zb-h2-periodic": "--schedule zb-h2 --steps 30 --scenario periodic --seed 4",
    "1f1b-seqlen": "--schedule 1f1b --steps 30 --scenario seqlen --seed 5 --model uniform:16",
    "1f1b-imbalance": "--schedule 1f1b --steps 20 --scenario imbalance --seed 6 "
                      "--partition 3,5,4,4 --model uniform:16",
    "1f1b-mixed-runs": "--schedule 1f1b --steps 40 --scenario mixed --seed 7 --runs 2 "
                       "--run-id mx --model uniform:16",
}


def cases() -> list[Case]:
    """Every compared command, in dependency order (later cases read earlier outputs)."""
    sims = [Case(f"simulate {name}", ("simulate", "--stages", "4", "--microbatches", "8",
                                      *opts.split(), "--out", f"{{out}}/{name}.parquet",
                                      "--json"), (f"{{out}}/{name}.parquet",))
            for name, opts in SIMULATIONS.items()]
    files = [(p, ("--run", Path(p).stem + "-0")) for p in SIM] + [(p, ()) for p in LIVE]
    files += [("{out}/interleaved-throttle.parquet", ()), ("{out}/zb-h2-periodic.parquet", ())]
    looks = []
    for path, run in files:
        label = Path(path).stem
        looks.append(Case(f"inspect {label}", ("inspect", path, *run, "--json")))
        looks.append(Case(f"whatif {label}", ("whatif", path, *run, "--json")))
    perfetto = "{out}/throttle.perfetto.json"
    looks += [
        Case("inspect --perfetto throttle", ("inspect", SIM[0], "--run", "throttle-0", "--json",
                                             "--steps", "0,1", "--perfetto", perfetto),
             (perfetto,)),
        Case("whatif --launch-delays cpu-slowdown", ("whatif", LIVE[0], "--launch-delays",
                                                     "--json")),
    ]
    feats = "{out}/features.parquet"
    learn = [
        Case("dataset sim/*", ("dataset", *SIM, "--out", feats, "--json"), (feats,)),
        Case("train lgbm", ("train", feats, "--model", "lgbm", "--out", "{out}/m-lgbm",
                            "--no-track", "--max-rows", "3000", "--json"), ("{out}/m-lgbm",)),
        Case("train ewma", ("train", feats, "--model", "ewma", "--out", "{out}/m-ewma",
                            "--no-track", "--json"), ("{out}/m-ewma",)),
        Case("evaluate lgbm+default", ("evaluate", feats, "--model", "{out}/m-lgbm", "--model",
                                       "models/default", "--no-track", "--json")),
        Case("policy-eval mixed+failslow", ("policy-eval", SIM[4], SIM[1], "--model",
                                            "models/default", "--json")),
        Case("policy-eval cpu-slowdown", ("policy-eval", LIVE[0], "--json")),
        Case("policy-eval throttle --migration", ("policy-eval", SIM[0], "--run", "throttle-1",
                                                  "--migration",
                                                  "data/live/cpu-predictive.actions.json",
                                                  "--policies", "static,reactive", "--json")),
    ]
    serve = [Case("serve /v1/model,forecast,recommend",
                  ("serve", "--model", "models/default", "--watch-interval", "0"))]
    errors = [
        Case("simulate bad schedule (exit 2)", ("simulate", "--schedule", "nope", "--stages",
                                                "2", "--microbatches", "2", "--out",
                                                "{out}/x.parquet"), json_stdout=False),
        Case("inspect missing file (exit 2)", ("inspect", "data/none.parquet", "--json"),
             json_stdout=False),
    ]
    return sims + looks + learn + serve + errors


@dataclass
class Result:
    """What one command gave on one side: exit code, stdout/stderr and the files it wrote."""

    rc: int
    stdout: Any
    stderr_line: str
    files: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


def _normalize(text: str, side: Path, out: Path) -> str:
    """Paths differ between the sides by construction: replace them by placeholders."""
    return text.replace(str(out), "<OUT>").replace(str(side), "<ROOT>")


def _read_output(path: Path, side: Path, out: Path) -> Any:
    """A written file as a comparable value: JSON, a Parquet table + metadata, or a folder."""
    if path.is_dir():
        return {p.name: _read_output(p, side, out) for p in sorted(path.iterdir())}
    if not path.exists():
        return "<missing>"
    if path.suffix == ".parquet":
        import pandas as pd
        import pyarrow.parquet as pq

        meta = (pq.read_schema(path).metadata or {}).get(b"bubblecast", b"null")
        return {"metadata": json.loads(_normalize(meta.decode(), side, out)),
                "table": pd.read_parquet(path)}
    text = _normalize(path.read_text(errors="replace"), side, out)
    if path.suffix == ".json":
        return json.loads(text)
    return text.splitlines()


def run_case(case: Case, side: Path, out: Path, python: str) -> Result:
    """Run ``case`` with the package under ``side`` (PYTHONPATH and cwd), outputs in ``out``."""
    args = [a.replace("{out}", str(out)) for a in case.args]
    env = {**os.environ, "PYTHONPATH": str(side), "PYTHONHASHSEED": "0",
           "MLFLOW_TRACKING_URI": f"sqlite:///{out}/mlflow.db", "NO_COLOR": "1",
           "COLUMNS": "100"}
    t0 = time.monotonic()
    if args[0] == "serve":
        return _serve_probe(args, side, out, python, env)
    proc = subprocess.run([python, "-c", CLI, *args], cwd=side, env=env, capture_output=True,
                          text=True, timeout=300)
    seconds = time.monotonic() - t0
    stdout: Any = _normalize(proc.stdout, side, out)
    if case.json_stdout and proc.returncode == 0:
        try:
            stdout = json.loads(stdout)
        except json.JSONDecodeError:
            stdout = {"<not JSON>": stdout[:200]}
    lines = _normalize(proc.stderr, side, out).strip().splitlines()
    err = lines[-1] if proc.returncode and lines else ""
    files = {o: _read_output(Path(o.replace("{out}", str(out))), side, out)
             for o in case.outputs}
    return Result(proc.returncode, stdout, err, files, seconds)


def _serve_window() -> dict[str, Any]:
    """A fixed recommend request: 4 stages, 80 steps, stage 2 slowing down from step 50."""
    ranks = [{"rank": r, "stage": r,
              "compute_s": [0.010 * (1.0 + (0.05 * max(0, t - 50) if r == 2 else 0.0))
                            + 0.0002 * ((t * (r + 3)) % 7) for t in range(80)]}
             for r in range(4)]
    return {"run_id": "probe", "pipeline": {"schedule": "1f1b", "stages": 4, "microbatches": 8},
            "horizons": [1, 5, 10], "ranks": ranks, "partition": [4, 4, 4, 4],
            "layer_costs": [1.0] * 16, "policy": {"hold": 0}}


def _serve_probe(args: list[str], side: Path, out: Path, python: str,
                 env: dict[str, str]) -> Result:
    """Start ``bubblecast serve``, ask it three questions, stop it; the replies are stdout."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    proc = subprocess.Popen([python, "-c", CLI, *args, "--port", str(port)], cwd=side, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    opener = urlrequest.build_opener(urlrequest.ProxyHandler({}))
    base = f"http://127.0.0.1:{port}"

    def call(path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urlrequest.Request(base + path, data=data,
                                 headers={"Content-Type": "application/json"})
        try:
            with opener.open(req, timeout=30) as reply:
                return json.loads(_normalize(reply.read().decode(), side, out))
        except urlerror.HTTPError as exc:  # an answer: its status and body are compared
            return {"<status>": exc.code, "body": exc.read().decode(errors="replace")[:500]}
        except OSError as exc:
            return {"<error>": str(exc)}

    try:
        while "<status>" in (ready := call("/readyz")) or "<error>" in ready:
            if time.monotonic() - t0 > 60 or proc.poll() is not None:
                break
            time.sleep(0.2)
        replies: dict[str, Any] = {"/v1/model": call("/v1/model")}
        if isinstance(replies["/v1/model"], dict):
            replies["/v1/model"].pop("loaded_at", None)
        window = _serve_window()
        forecast = {k: v for k, v in window.items()
                    if k not in ("partition", "layer_costs", "policy")}
        replies["/v1/forecast"] = call("/v1/forecast", forecast)
        replies["/v1/recommend"] = call("/v1/recommend", window)
    finally:
        proc.terminate()
        try:
            _, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    rc = 0 if all(isinstance(r, dict) and "<error>" not in r for r in replies.values()) else 1
    lines = _normalize(err or "", side, out).strip().splitlines()
    return Result(rc, replies, lines[-1] if rc and lines else "", {}, time.monotonic() - t0)


def compare(before: Result, after: Result, added: list[str]) -> str | None:
    """The first difference between two sides of one command, or None when they agree; JSON
    keys only the after side has go to ``added``."""
    if before.rc != after.rc:
        return f"exit code: {before.rc} != {after.rc} ({after.stderr_line or before.stderr_line})"
    for name, a, b in (("stdout", before.stdout, after.stdout),
                       ("stderr", before.stderr_line, after.stderr_line)):
        diff = first_difference(a, b, "", added)
        if diff:
            return f"{name} {diff}"
    for path in before.files:
        diff = first_difference(before.files[path], after.files[path],
                                path.replace("{out}/", ""), added)
        if diff:
            return diff
    return None


def run_side(side: Path, out: Path, todo: list[Case], python: str,
             log: Callable[[str], None]) -> dict[str, Result]:
    """All cases on one side, in order (later cases read earlier outputs)."""
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for case in todo:
        r = results[case.name] = run_case(case, side, out, python)
        log(f"  {side.name:>8}: {case.name} rc={r.rc} {r.seconds:.1f}s")
    return results


def checkout(ref: str, into: Path) -> Path:
    """A detached worktree of ``ref`` (the old code) at ``into``."""
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet", str(into),
                    ref], check=True)
    return into


def table(rows: list[tuple[str, str, str]]) -> str:
    """A plain fixed-width table: command | result | first differing key."""
    head = ("command", "result", "first differing key")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(2)]
    lines = [f"{head[0]:<{widths[0]}}  {head[1]:<{widths[1]}}  {head[2]}",
             f"{'-' * widths[0]}  {'-' * widths[1]}  {'-' * 19}"]
    lines += [f"{c:<{widths[0]}}  {r:<{widths[1]}}  {k}" for c, r, k in rows]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", default=DEFAULT_BEFORE,
                   help=f"git ref of the old code (default {DEFAULT_BEFORE}, before issue 12)")
    p.add_argument("--after", type=Path, default=REPO,
                   help="tree of the new code (default: this working tree)")
    p.add_argument("--only", default="", help="only commands whose name contains this")
    p.add_argument("--keep", type=Path, help="write outputs here and keep them")
    p.add_argument("--strict", action="store_true",
                   help="count JSON keys only the after side has as differences too")
    p.add_argument("-v", "--verbose", action="store_true", help="log each command as it runs")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run both sides in parallel, print the table; 0 when every command agrees."""
    args = parse_args(argv)
    todo = [c for c in cases() if args.only in c.name]
    if args.only:  # keep the producers the selected commands read
        todo = [c for c in cases() if c in todo or (c.outputs and c.args[0] != "inspect")]
    log = (lambda m: print(m, file=sys.stderr, flush=True)) if args.verbose else (lambda m: None)
    python = sys.executable
    with tempfile.TemporaryDirectory(prefix="same_outputs-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        old = checkout(args.before, Path(tmp) / "before")
        t0 = time.monotonic()
        try:
            with ThreadPoolExecutor(2) as pool:
                fb = pool.submit(run_side, old, work / "out-before", todo, python, log)
                fa = pool.submit(run_side, args.after.resolve(), work / "out-after", todo,
                                 python, log)
                before, after = fb.result(), fa.result()
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(old)],
                           check=False)
    rows = []
    for case in todo:
        added: list[str] = []
        diff = compare(before[case.name], after[case.name], added)
        if diff is None and added:
            rows.append((case.name, "same+added", "added keys: " + ", ".join(added)))
        else:
            rows.append((case.name, "same" if diff is None else "DIFFERENT", diff or ""))
    print(table(rows))
    bad = ("DIFFERENT", "same+added") if args.strict else ("DIFFERENT",)
    n_diff = sum(r[1] in bad for r in rows)
    n_added = sum(r[1] == "same+added" for r in rows)
    print(f"\n{len(rows) - n_diff} same ({n_added} of them with added keys), {n_diff} different; "
          f"before={args.before}, after={args.after}; {time.monotonic() - t0:.0f}s")
    return 1 if n_diff else 0


if __name__ == "__main__":
    sys.exit(main())
