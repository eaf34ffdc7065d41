"""Fleet scale: N simulated runs -> features, in process vs ``--cluster``; LightGBM via Dask.

Measures, on one fleet written by ``simulate --runs N --out DIR/``:

- ``dataset`` in process (one features file) vs on a ``LocalCluster`` of ``--workers`` worker
  processes (features partitioned by run): wall time of the command, peak RSS of the command's
  process and of each worker (``ru_maxrss``), and that the fingerprints agree;
- ``train --model lgbm`` in process vs ``--cluster`` on the same partitioned features: held-out
  skill per horizon and the largest difference (the issue's bar: 0.02).

The cluster is started here (its start-up is reported apart, and a speed-up with it added is
reported too) and the commands join it with ``--cluster tcp://...``, so worker memory and CPU
can be read. ``--repeat N`` alternates the two N times on the same fleet (means reported, every
round kept). The load average (1 minute) is recorded before and after. Writes a table and
``--out`` (JSON). Sizes are options: ``--runs 500`` and ``--runs 2000`` (about 26M events with
the defaults; more with ``--steps``) are the issue's fleets.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = [str(Path(sys.executable).parent / "bubblecast")]
LAST_CPU_S = 0.0


def run(args: list[str]) -> tuple[dict, float, float]:
    """Run a bubblecast command; its JSON, wall seconds and its process's peak RSS (MiB).
    The command's CPU seconds are left in ``LAST_CPU_S``."""
    global LAST_CPU_S
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen([*BIN, *args], stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        LAST_CPU_S = usage.ru_utime + usage.ru_stime
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode:
            raise SystemExit(f"bubblecast {' '.join(args)} failed:\n{err.read()[-2000:]}")
        return json.loads(out.read().strip().splitlines()[-1]), wall, usage.ru_maxrss / 1024


def worker_usage(client: object) -> list[tuple[float, float]]:
    """Each worker's (peak RSS MiB, CPU seconds so far)."""
    def usage() -> tuple[float, float]:
        import resource

        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_maxrss / 1024, r.ru_utime + r.ru_stime

    return sorted(client.run(usage).values())  # type: ignore[attr-defined]


def _dataset_rounds(tmp: Path, a: argparse.Namespace, result: dict) -> None:
    """``--repeat`` rounds of dataset in process, then on the cluster (joined over tcp)."""
    from distributed import Client

    from bubblecast.execution import local_cluster

    t0 = time.perf_counter()
    with local_cluster(a.workers) as cl, Client(cl) as client:  # as `--cluster local:N`
        result["cluster_start_s"] = round(time.perf_counter() - t0, 1)
        rounds = []
        for _ in range(a.repeat):
            local, wall, rss = run(["dataset", str(tmp / "fleet"), "--out",
                                    str(tmp / "feat.parquet"), "--json"])
            one = {"in_process": {"wall_s": round(wall, 2), "peak_mib": round(rss),
                                  "cpu_s": round(LAST_CPU_S, 2)}}
            before = worker_usage(client)
            remote, wall, rss = run(["dataset", str(tmp / "fleet"), "--out",
                                     str(tmp / "feat"), "--json", "--cluster",
                                     cl.scheduler_address])
            driver_cpu = LAST_CPU_S
            after = worker_usage(client)
            workers_cpu = sum(c for _, c in after) - sum(c for _, c in before)
            one["cluster"] = {"wall_s": round(wall, 2), "driver_peak_mib": round(rss),
                              "worker_peak_mib": [round(m) for m, _ in after],
                              "driver_cpu_s": round(driver_cpu, 2),
                              "workers_cpu_s": round(workers_cpu, 2),
                              "cpu_s": round(driver_cpu + workers_cpu, 2)}
            one["speedup"] = round(one["in_process"]["wall_s"] / wall, 2)
            one["same_fingerprint"] = local["fingerprint"] == remote["fingerprint"]
            one["load_average"] = round(os.getloadavg()[0], 1)
            rounds.append(one)
            result["feature_rows"] = remote["rows"]
        result["rounds"] = rounds
        mean = lambda xs: round(sum(xs) / len(xs), 2)  # noqa: E731
        ip = [r["in_process"] for r in rounds]
        cs = [r["cluster"] for r in rounds]
        result["in_process"] = {"wall_s": mean([r["wall_s"] for r in ip]),
                                "cpu_s": mean([r["cpu_s"] for r in ip]),
                                "peak_mib": max(r["peak_mib"] for r in ip)}
        result["cluster"] = {"wall_s": mean([r["wall_s"] for r in cs]),
                             "cpu_s": mean([r["cpu_s"] for r in cs]),
                             "driver_cpu_s": mean([r["driver_cpu_s"] for r in cs]),
                             "driver_peak_mib": max(r["driver_peak_mib"] for r in cs),
                             "worker_peak_mib": [max(m) for m in zip(*[r["worker_peak_mib"]
                                                                       for r in cs],
                                                                     strict=True)]}
        result["speedup"] = round(result["in_process"]["wall_s"] / result["cluster"]["wall_s"],
                                  2)
        result["speedup_with_start"] = round(result["in_process"]["wall_s"] / (
            result["cluster"]["wall_s"] + result["cluster_start_s"]), 2)
        result["same_fingerprint"] = all(r["same_fingerprint"] for r in rounds)
        if not a.no_train:
            result["lgbm"] = train_both(tmp, cl.scheduler_address)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--stages", type=int, default=4)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1, help="Rounds of the two dataset runs.")
    ap.add_argument("--no-train", action="store_true", help="Skip the LightGBM comparison.")
    ap.add_argument("--tmp", default=None, help="Directory for the fleet (default: /tmp).")
    ap.add_argument("--out", default="benchmarks/results/bench_fleet.json")
    a = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench_fleet.", dir=a.tmp))
    result: dict = {"runs": a.runs, "steps": a.steps, "stages": a.stages,
                    "microbatches": a.microbatches, "workers": a.workers,
                    "cpus": os.cpu_count(), "load_average_before": round(os.getloadavg()[0], 1),
                    "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    try:
        sim, wall, _ = run(["simulate", "--schedule", "1f1b", "--stages", str(a.stages),
                            "--microbatches", str(a.microbatches), "--steps", str(a.steps),
                            "--runs", str(a.runs), "--scenario", "mixed",
                            "--out", f"{tmp / 'fleet'}/", "--json"])
        result.update(events=sim["events"], simulate_s=round(wall, 1))
        _dataset_rounds(tmp, a, result)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result["load_average_after"] = round(os.getloadavg()[0], 1)
    report(result, a.out)


def train_both(tmp: Path, address: str) -> dict:
    common = ["train", str(tmp / "feat"), "--model", "lgbm", "--no-track", "--json"]
    mine, wall_in, _ = run([*common, "--out", str(tmp / "m_in")])
    dask, wall_dask, _ = run([*common, "--out", str(tmp / "m_dask"), "--cluster", address])
    skill = {h: {"in_process": round(mine["metrics"][h]["skill"], 4),
                 "dask": round(dask["metrics"][h]["skill"], 4)} for h in mine["metrics"]}
    diff = max(abs(v["in_process"] - v["dask"]) for v in skill.values())
    return {"skill": skill, "max_abs_diff": round(diff, 4), "within_0.02": diff <= 0.02,
            "wall_s": {"in_process": round(wall_in, 1), "dask": round(wall_dask, 1)},
            "rows": {"in_process": mine["rows"], "dask": dask["rows"]}}


def report(result: dict, out: str) -> None:
    print(f"fleet: {result['runs']} runs, {result['events']:,} events, "
          f"{result.get('feature_rows', 0):,} feature rows, {result['cpus']} CPUs, "
          f"load average {result['load_average_before']} before, "
          f"{result['load_average_after']} after; means of {len(result['rounds'])} rounds")
    ip, cl = result["in_process"], result["cluster"]
    print(f"{'dataset':<14}{'wall s':>8}{'CPU s':>8}{'peak MiB per process':>40}")
    print(f"{'in process':<14}{ip['wall_s']:>8}{ip['cpu_s']:>8}{ip['peak_mib']:>40}")
    peaks = f"driver {cl['driver_peak_mib']}, workers {cl['worker_peak_mib']}"
    print(f"{'local:' + str(result['workers']):<14}{cl['wall_s']:>8}{cl['cpu_s']:>8}"
          f"{peaks:>40}")
    print(f"speed-up {result['speedup']}x (cluster start-up {result['cluster_start_s']} s "
          f"apart; {result['speedup_with_start']}x with it); same fingerprint: "
          f"{result['same_fingerprint']}")
    for i, r in enumerate(result["rounds"]):
        print(f"  round {i + 1}: in process {r['in_process']['wall_s']} s, cluster "
              f"{r['cluster']['wall_s']} s (driver CPU {r['cluster']['driver_cpu_s']} s), "
              f"speed-up {r['speedup']}x, load {r['load_average']}")
    if "lgbm" in result:
        for h, v in result["lgbm"]["skill"].items():
            print(f"lgbm {h}: skill in process {v['in_process']:.4f}, dask {v['dask']:.4f}")
        print(f"max |skill difference| {result['lgbm']['max_abs_diff']}")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
