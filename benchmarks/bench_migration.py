"""Live layer migration cost: seconds per MB moved, for the policy's migration cost model.

Two ranks under torchrun (gloo, CPU, one thread each). For MLPs of growing width (8 layers,
Adam, so each moved layer carries parameters plus exp_avg, exp_avg_sq and step), the trainer
repartitions back and forth at step boundaries; each action's record gives the seconds (from
the first send to the committed vote, stage and schedule rebuilt) and the bytes sent. A
least-squares line ``seconds = fixed + per_mb x MB`` over all migrations gives the cost
model; the first step after a migration is also timed against a steady step (it re-runs the
pipeline's P2P warm-up and shape inference).

    python benchmarks/bench_migration.py [--widths 256,512,1024] [--repeats 2]

Prints a table and writes benchmarks/results/migration.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from bubblecast.runtime.shutdown import exit_process

CYCLE = [(2, 6), (6, 2), (4, 4), (1, 7), (7, 1), (4, 4)]
RESULTS = Path(__file__).resolve().parent / "results" / "migration.json"


def worker(job_dir: Path) -> None:
    """Runs on each rank under torchrun."""
    import torch

    from bubblecast.policy.actions import Repartition
    from bubblecast.runtime.train_config import ModelSpec, TrainConfig
    from bubblecast.runtime.trainer import Trainer, init_distributed

    job = json.loads((job_dir / "bench.json").read_text())
    init_distributed("gloo")
    torch.set_num_threads(1)
    rows = []
    for width in job["widths"]:
        cfg = TrainConfig(model=ModelSpec(kind="mlp", layers=8, hidden=width), stages=2,
                          microbatches=2, schedule="1f1b", batch_size=8, optimizer="adam",
                          layer_cost_every=0)
        t = Trainer(cfg, record=False)
        for _ in range(3):
            t.train_step()
        for _ in range(job["repeats"]):
            for part in CYCLE:
                rec = t.apply(Repartition(part))
                t0 = time.perf_counter()
                t.train_step()
                first = time.perf_counter() - t0
                t0 = time.perf_counter()
                t.train_step()
                steady = time.perf_counter() - t0
                if rec["layers_moved"]:
                    rows.append({"width": width, "layers_moved": rec["layers_moved"],
                                 "bytes": rec["bytes"], "seconds": rec["seconds"],
                                 "ok": rec["ok"], "first_step_s": first, "steady_step_s": steady})
    if torch.distributed.get_rank() == 0:
        (job_dir / "rows.json").write_text(json.dumps(rows))
    torch.distributed.destroy_process_group()


def main() -> None:
    import numpy as np
    from _results import run_header, write_json

    from bubblecast.runtime.launch import failure_message, launch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", default="256,512,1024")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        job_dir = Path(tmp)
        (job_dir / "bench.json").write_text(json.dumps(
            {"widths": [int(w) for w in args.widths.split(",")], "repeats": args.repeats}))
        code = launch(job_dir, 2, script=__file__, timeout=900)
        if code != 0:
            sys.exit(f"benchmark failed: {failure_message(job_dir)}")
        rows = json.loads((job_dir / "rows.json").read_text())
    mb = np.array([r["bytes"] / 1e6 for r in rows])
    sec = np.array([r["seconds"] for r in rows])
    per_mb, fixed = np.polyfit(mb, sec, 1)
    print(f"{'width':>6} {'layers':>6} {'MB':>8} {'seconds':>9} {'s/MB':>8} "
          f"{'1st step':>9} {'steady':>9}")
    for r in rows:
        print(f"{r['width']:>6} {r['layers_moved']:>6} {r['bytes'] / 1e6:>8.2f} "
              f"{r['seconds']:>9.4f} {r['seconds'] / (r['bytes'] / 1e6):>8.4f} "
              f"{r['first_step_s']:>9.4f} {r['steady_step_s']:>9.4f}")
    extra = [r["first_step_s"] - r["steady_step_s"] for r in rows]
    summary = {
        "seconds_per_mb": float(per_mb), "fixed_seconds": float(fixed),
        "mb_per_second": float(1.0 / per_mb) if per_mb > 0 else None,
        "median_seconds_per_mb": float(np.median(sec / mb)),
        "median_first_step_extra_s": float(np.median(extra)),
        "all_ok": all(r["ok"] for r in rows), "migrations": len(rows),
    }
    print(f"fit: seconds = {fixed:.4f} + {per_mb:.5f} x MB "
          f"({summary['mb_per_second']:.0f} MB/s); median {summary['median_seconds_per_mb']:.5f}"
          f" s/MB; first step after a migration +{summary['median_first_step_extra_s']:.4f} s")
    write_json(RESULTS, {**run_header("migration", backend="gloo", ranks=2),
                         "summary": summary, "rows": rows})


if __name__ == "__main__":
    if "RANK" in os.environ and "LOCAL_RANK" in os.environ:
        worker(Path(sys.argv[1]))
        exit_process(0)  # no finalization: see bubblecast.runtime.shutdown
    else:
        main()
