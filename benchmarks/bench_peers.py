"""bubblecast beside its peers on the same work, alternating, medians (issue 26).

- **Features**: the 56 features bubblecast shares with Nixtla mlforecast (lags 1..32; rolling
  mean, std, min, max, q10, q50, q90 over 5, 20 and 60 steps; EWM at 0.5, 0.2, 0.05) on the
  step series of ~10.24M simulated events (1F1B, 8 stages x 4 replicas x 32 microbatches,
  500 steps a run; 160k series rows): ``bubblecast.dataset.features.history_frame`` against
  ``MLForecast.preprocess`` (``num_threads`` 2 and 1), and bubblecast's whole
  ``build_features`` (every feature and target). Each side runs in its own warm process (the
  peers' in ``.venv-peers``, made from ``benchmarks/peers-requirements.txt`` if missing) and
  times the call alone; the driver asks them in turn, the order rotating every round. The
  values are checked: bubblecast's row at step t against mlforecast's at t + 1 (its lags
  start at 1), max relative difference per feature.
- **What-if**: ``bubblecast whatif data/megatron-ops/trace-ST.parquet --json`` end to end
  against ``python -c "import pandas, pyarrow.parquet"`` (new interpreters, alternating).
- **simulate**: ``bubblecast simulate`` end to end (1F1B, 8 stages, 16 microbatches, 5,000
  steps; and ``--big``: 32 microbatches, 20,000 steps), compute events per second, against
  ``python -c "import numpy, pyarrow.parquet, typer"`` (what it imports: its floor).

The commands run as an installed package runs: bubblecast's bytecode is compiled first
(``python -m compileall``; an environment with ``PYTHONDONTWRITEBYTECODE`` set would otherwise
compile every module from source in every interpreter, ~0.02 s that the libraries, installed
with their bytecode, never pay).

    python benchmarks/bench_peers.py [--rounds 7] [--threads 2] [--big] [--only commands]

Prints a table and writes benchmarks/results/peers.json (with the peers' versions and the
load average); ``--only features|commands`` runs one part and writes JSON only to an
``--out`` given.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results" / "peers.json"
PEERS_VENV = REPO / ".venv-peers"
WINDOWS, QUANTILES, ALPHAS, LAGS = (5, 20, 60), (0.1, 0.5, 0.9), (0.5, 0.2, 0.05), 32
TRACE = REPO / "data" / "megatron-ops" / "trace-ST.parquet"


# -- workers: one warm process per side, timing the call alone -------------------------------
def _mlforecast_worker(data: Path, threads: int) -> Any:
    import pandas as pd
    from mlforecast import MLForecast
    from mlforecast.lag_transforms import (
        ExponentiallyWeightedMean,
        RollingMax,
        RollingMean,
        RollingMin,
        RollingQuantile,
        RollingStd,
    )

    frame = pd.read_parquet(data / "mlforecast.parquet")
    transforms: list[Any] = []
    for w in WINDOWS:
        transforms += [RollingMean(w), RollingStd(w), RollingMin(w), RollingMax(w)]
        transforms += [RollingQuantile(q, w) for q in QUANTILES]
    transforms += [ExponentiallyWeightedMean(a) for a in ALPHAS]

    def run() -> Any:
        fcst = MLForecast(models=[], freq=1, lags=list(range(1, LAGS + 1)),
                          lag_transforms={1: transforms}, num_threads=threads)
        return fcst.preprocess(frame, static_features=[])

    return run


def _bubblecast_worker(data: Path, threads: int, whole: bool) -> Any:
    import pandas as pd

    from bubblecast.dataset import DatasetConfig
    from bubblecast.dataset.features import build_features, history_frame

    series = pd.read_parquet(data / "series.parquet")
    config = DatasetConfig()
    if whole:
        return lambda: build_features(series, config, n_jobs=threads)
    return lambda: history_frame(series, config, n_jobs=threads)


def worker(kind: str, data: Path, threads: int) -> None:
    """Answer ``run`` (one timed call: seconds) and ``save PATH`` (the last output) on stdin."""
    run = (_mlforecast_worker(data, threads) if kind == "mlforecast"
           else _bubblecast_worker(data, threads, kind == "whole"))
    out = run()  # warm: first-call set-up is not the steady cost
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "run":
            t0 = time.perf_counter()
            out = run()
            print(json.dumps({"s": time.perf_counter() - t0}), flush=True)
        elif cmd[0] == "save":
            out.to_parquet(cmd[1])
            print(json.dumps({"saved": cmd[1]}), flush=True)
        else:
            break


class Worker:
    def __init__(self, python: str, kind: str, data: Path, threads: int) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen([python, __file__, "--worker", kind, "--data", str(data),
                                      "--threads", str(threads)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        self.ask(None)

    def ask(self, cmd: str | None) -> dict[str, Any]:
        assert self.proc.stdin and self.proc.stdout
        if cmd is not None:
            self.proc.stdin.write(cmd + "\n")
            self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            sys.exit(f"benchmark worker {self.proc.args} died")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.write("exit\n")
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


# -- the driver ---------------------------------------------------------------------------------
def peers_python() -> str:
    """The peers' interpreter: ``.venv-peers``, created from peers-requirements.txt if absent."""
    python = PEERS_VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(PEERS_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "-r",
                        str(HERE / "peers-requirements.txt"), "pyarrow"], check=True)
    return str(python)


def make_data(tmp: Path) -> dict[str, Any]:
    """Simulated events -> step series (bubblecast's input) and (unique_id, ds, y) frames."""
    import numpy as np

    sys.path.insert(0, str(HERE))
    from bench_dataset import simulated_events

    from bubblecast.dataset import step_series

    events = simulated_events(10_240_000, 32)
    series = step_series(events)
    series.to_parquet(tmp / "series.parquet")
    keys = series[["run_id", "replica", "stage"]]
    sid = keys.groupby(["run_id", "replica", "stage"], observed=True, sort=False).ngroup()
    frame = {"unique_id": sid.to_numpy(np.int64), "ds": series["step"].to_numpy(np.int64),
             "y": series["y"].to_numpy(np.float64)}
    import pandas as pd

    pd.DataFrame(frame).to_parquet(tmp / "mlforecast.parquet")
    return {"events": len(events), "series_rows": len(series), "series": int(sid.max()) + 1}


def value_check(tmp: Path, bc: Worker, mlf: Worker) -> dict[str, float]:
    """Max relative difference per feature, bubblecast at step t against mlforecast at t + 1."""
    import numpy as np
    import pandas as pd

    from bubblecast.dataset import DatasetConfig
    from bubblecast.dataset.features import history_names

    bc.ask(f"save {tmp / 'bc.parquet'}")
    mlf.ask(f"save {tmp / 'mlf.parquet'}")
    ours = pd.read_parquet(tmp / "bc.parquet")
    theirs = pd.read_parquet(tmp / "mlf.parquet")
    sid = ours.groupby(["run_id", "replica", "stage"], observed=True, sort=False).ngroup()
    ours = ours.assign(unique_id=sid.to_numpy(np.int64), ds=ours["step"].to_numpy() + 1)
    both = ours.merge(theirs, on=["unique_id", "ds"])
    names = history_names(DatasetConfig())
    peer_cols = [f"lag{k + 1}" for k in range(LAGS)]
    for w in WINDOWS:
        peer_cols += [f"rolling_{s}_lag1_window_size{w}" for s in ("mean", "std", "min", "max")]
        peer_cols += [f"rolling_quantile_lag1_p{q}_window_size{w}" for q in QUANTILES]
    peer_cols += [f"exponentially_weighted_mean_lag1_alpha{a}" for a in ALPHAS]
    out = {"rows_compared": len(both), "features": len(names)}
    worst = 0.0
    for ours_col, peer_col in zip(names, peer_cols, strict=True):
        a = both[ours_col].to_numpy(np.float64)
        b = both[peer_col].to_numpy(np.float64)
        worst = max(worst, float(np.nanmax(np.abs(a - b) / np.maximum(np.abs(b), 1e-12))))
    out["max_rel_diff"] = worst
    return out


def order(round_: int, arms: list[str]) -> list[str]:
    """Arms rotated every round, reversed every other one."""
    k = len(arms)
    turned = [arms[(i + round_) % k] for i in range(k)]
    return turned[::-1] if round_ % 2 else turned


def features(rounds: int, threads: int, tmp: Path) -> dict[str, Any]:
    data = make_data(tmp)
    peers = peers_python()
    arms = {f"bubblecast_56_t{threads}": (sys.executable, "bubblecast", threads),
            "bubblecast_56_t1": (sys.executable, "bubblecast", 1),
            f"mlforecast_56_t{threads}": (peers, "mlforecast", threads),
            "mlforecast_56_t1": (peers, "mlforecast", 1),
            f"bubblecast_all_t{threads}": (sys.executable, "whole", threads)}
    workers = {name: Worker(py, kind, tmp, n) for name, (py, kind, n) in arms.items()}
    times: dict[str, list[float]] = {name: [] for name in arms}
    try:
        for r in range(rounds):
            for name in order(r, list(arms)):
                times[name].append(workers[name].ask("run")["s"])
        check = value_check(tmp, workers[f"bubblecast_56_t{threads}"],
                            workers[f"mlforecast_56_t{threads}"])
    finally:
        for w in workers.values():
            w.close()
    med = {name: statistics.median(v) for name, v in times.items()}
    ours, theirs = med[f"bubblecast_56_t{threads}"], med[f"mlforecast_56_t{threads}"]
    versions = subprocess.run([peers, "-c", "import mlforecast, coreforecast, pandas, numpy; "
                               "print(mlforecast.__version__, coreforecast.__version__, "
                               "pandas.__version__, numpy.__version__)"],
                              capture_output=True, text=True, check=True).stdout.split()
    return {**data, "median_s": med, "rounds_s": times, "check": check,
            "speedup_vs_mlforecast": theirs / ours,
            "peer_versions": dict(zip(["mlforecast", "coreforecast", "pandas", "numpy"],
                                      versions, strict=True))}


def _wall(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, cwd=REPO)
    return time.perf_counter() - t0


def compile_bytecode() -> None:
    """bubblecast's bytecode, as an installed package has it (see the module doc)."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "bubblecast")],
                   check=True, stdout=subprocess.DEVNULL)


def commands(rounds: int, tmp: Path, big: bool) -> dict[str, Any]:
    """whatif against the bare imports, and simulate against its own, as new interpreters,
    alternating."""
    compile_bytecode()
    bc = str(Path(sys.executable).parent / "bubblecast")
    sims = {"simulate_5k": ["--microbatches", "16", "--steps", "5000"]}
    if big:
        sims["simulate_20k"] = ["--microbatches", "32", "--steps", "20000"]
    arms = {"whatif": [bc, "whatif", str(TRACE), "--json"],
            "imports": [sys.executable, "-c", "import pandas, pyarrow.parquet"],
            "imports_simulate": [sys.executable, "-c", "import numpy, pyarrow.parquet, typer"]}
    arms |= {name: [bc, "simulate", "--schedule", "1f1b", "--stages", "8", *extra, "--out",
                    str(tmp / f"{name}.parquet")] for name, extra in sims.items()}
    events = {name: 8 * 2 * int(extra[1]) * int(extra[3]) for name, extra in sims.items()}
    times: dict[str, list[float]] = {name: [] for name in arms}
    for r in range(rounds):
        for name in order(r, list(arms)):
            times[name].append(_wall(arms[name]))
    med = {name: statistics.median(v) for name, v in times.items()}
    ratios = [w / b for w, b in zip(times["whatif"], times["imports"], strict=True)]
    return {"median_s": med, "rounds_s": times,
            "whatif_over_imports": med["whatif"] / med["imports"],
            "whatif_over_imports_per_round_median": statistics.median(ratios),
            # the floor: no simulate can beat a bare import of the libraries it needs
            "simulate": {name: {"events": n, "events_per_s": n / med[name],
                                "imports_floor_events_per_s": n / med["imports_simulate"]}
                         for name, n in events.items()},
            "bytecode": "bubblecast compiled before timing (python -m compileall)",
            "commands": {name: " ".join(["bubblecast" if a == bc else a for a in argv])
                         for name, argv in arms.items()}}


def main() -> None:
    from _results import run_header, write_json

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--big", action="store_true", help="also simulate 10.24M events")
    parser.add_argument("--out", default=None, help=f"results JSON [{RESULTS}; with --only: "
                        "none unless given]")
    parser.add_argument("--only", choices=("features", "commands"),
                        help="run one part (printed; JSON only to an --out given)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, Path(args.data), args.threads)
        return
    load0 = os.getloadavg()[0]
    parts: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        if args.only in (None, "features"):
            parts["features"] = features(args.rounds, args.threads, Path(tmp))
        if args.only in (None, "commands"):
            parts["commands"] = commands(args.rounds, Path(tmp), args.big)
    doc = run_header("peers", load_before=load0, load_after=os.getloadavg()[0],
                     rounds=args.rounds, threads=args.threads, **parts)
    _print(doc)
    out = args.out or (None if args.only else str(RESULTS))
    if out is not None:
        write_json(out, doc)


def _print(doc: dict[str, Any]) -> None:
    print(f"load {doc['load_before']:.1f} -> {doc['load_after']:.1f}")
    if "features" in doc:
        _print_features(doc)
    if "commands" in doc:
        _print_commands(doc)


def _print_features(doc: dict[str, Any]) -> None:
    f = doc["features"]
    print(f"{f['events']:,} events -> {f['series_rows']:,} series rows ({f['series']} series); "
          "peers " + ", ".join(f"{k} {v}" for k, v in f["peer_versions"].items()))
    print(f"{'arm':<26}{'median s':>10}")
    for name, s in f["median_s"].items():
        print(f"{name:<26}{s:>10.3f}")
    print(f"bubblecast / mlforecast at {doc['threads']} threads: "
          f"{f['speedup_vs_mlforecast']:.2f}x faster; values: max relative difference "
          f"{f['check']['max_rel_diff']:.1e} over {f['check']['rows_compared']:,} rows")


def _print_commands(doc: dict[str, Any]) -> None:
    c = doc["commands"]
    for name, s in c["median_s"].items():
        print(f"{name:<26}{s:>10.3f}")
    print(f"whatif / imports: {c['whatif_over_imports']:.2f}x (per-round median "
          f"{c['whatif_over_imports_per_round_median']:.2f}x)")
    for name, s in c["simulate"].items():
        print(f"{name}: {s['events']:,} events, {s['events_per_s'] / 1e6:.2f} M events/s (the "
              f"bare imports alone would allow {s['imports_floor_events_per_s'] / 1e6:.2f} M/s)")


if __name__ == "__main__":
    main()
