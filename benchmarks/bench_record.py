"""Overhead of ``bubblecast.record`` on a user's own pipeline loop: a direct A/B.

Two ranks under torchrun (gloo, CPU, one thread each) train one pipeline (a plain torch
``Schedule1F1B`` over an MLP, each rank half the layers, SGD). Blocks of ``--block`` steps
alternate between recorded and bare (the order swapped every round, barriers around each
block): a recorded block attaches the one ``bubblecast.record`` recording to the schedule, runs,
ends its step and detaches (all inside the timed block), so both arms run the very same
schedule, weights and buffers. The recording keeps its defaults (a part every 50 steps, at
most one per 5 s, written by the background thread; optimizer timed); as parts are written
only in recorded blocks, they land there twice as densely as in a run recorded throughout.

The overhead is the median over rounds of the per-round ratio recorded/bare - 1, in wall time
and in process CPU time (writer thread included, summed over ranks), with a 95% bootstrap
interval of that median; also the ratio of the totals, which charges the rounds that write a
part in full. ``--control`` runs the same with nothing attached (A/A): the method's own noise.

    python benchmarks/bench_record.py [--rounds 40] [--block 10] [--control]

Prints a table and writes benchmarks/results/record.json (record-control.json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "record.json"


def _pipeline(rank: int, world: int, hidden: int, layers: int, microbatches: int):
    import torch
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.Linear(hidden, hidden), torch.nn.GELU())
              for _ in range(layers)]
    per = layers // world
    mine = torch.nn.Sequential(*blocks[rank * per:(rank + 1) * per])
    stage = PipelineStage(mine, rank, world, torch.device("cpu"))
    schedule = Schedule1F1B(stage, microbatches, loss_fn=torch.nn.functional.mse_loss)
    return schedule, torch.optim.SGD(mine.parameters(), lr=1e-3)


def worker(job_dir: Path) -> None:
    import torch
    import torch.distributed as dist

    import bubblecast

    job = json.loads((job_dir / "bench.json").read_text())
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    hidden = job["hidden"]
    schedule, opt = _pipeline(rank, world, hidden, 8, 4)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, hidden, generator=g), torch.randn(64, hidden, generator=g)

    def step() -> None:
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=y)
        opt.step()
        opt.zero_grad()

    rec = bubblecast.record(schedule, out=job_dir / "telemetry", run_id="bench",
                            optimizer=opt, flush_every=job["flush_every"],
                            min_part_s=job["min_part_s"])
    for _ in range(5):  # warm-up: P2P set-up and shape inference (recorded)
        step()
    rec.end_step()
    rec.detach()
    wall: dict[str, list[float]] = {"with": [], "without": []}
    cpu: dict[str, list[float]] = {"with": [], "without": []}
    for r in range(job["rounds"]):
        order = ("with", "without") if r % 2 == 0 else ("without", "with")
        for name in order:
            dist.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            if name == "with" and not job["control"]:
                rec.attach(schedule)
            for _ in range(job["block"]):
                step()
            if name == "with" and not job["control"]:
                rec.end_step()
                rec.detach()
            c1 = time.process_time()  # this process's CPU, the writer thread included
            dist.barrier()
            wall[name].append((time.perf_counter() - t0) / job["block"])
            cpu[name].append((c1 - c0) / job["block"])
    rec.close()
    gathered: list = [None] * world
    dist.all_gather_object(gathered, cpu)
    if rank == 0:
        where = Path(str(rec.events_dir))
        (job_dir / "result.json").write_text(json.dumps(
            {"wall": wall, "cpu": gathered, "rows": len(bubblecast.read_events(where)),
             "steps_recorded": rec.step, "parts": len(list(where.glob("rank0000-*.parquet")))}))
    dist.destroy_process_group()


def median_ci(values: list[float], n: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% percentile-bootstrap interval of the median of ``values``."""
    import random

    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(n))
    return meds[int(0.025 * n)], meds[int(0.975 * n) - 1]


def main() -> None:
    from _results import run_header, write_json

    from bubblecast.runtime.launch import failure_message, launch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--block", type=int, default=10)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--flush-every", type=int, default=50)
    ap.add_argument("--min-part-s", type=float, default=5.0)
    ap.add_argument("--control", action="store_true",
                    help="A/A control: B is not recorded either (the method's own bias)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        job_dir = Path(tmp)
        (job_dir / "bench.json").write_text(json.dumps(
            {"rounds": args.rounds, "block": args.block, "hidden": args.hidden,
             "flush_every": args.flush_every, "min_part_s": args.min_part_s,
             "control": args.control}))
        code = launch(job_dir, 2, script=__file__, timeout=900)
        if code != 0:
            sys.exit(f"benchmark failed: {failure_message(job_dir)}")
        res = json.loads((job_dir / "result.json").read_text())
    on, off = res["wall"]["with"], res["wall"]["without"]
    paired = [a / b - 1.0 for a, b in zip(on, off, strict=True)]
    cpu_on = [sum(c["with"][i] for c in res["cpu"]) for i in range(len(on))]
    cpu_off = [sum(c["without"][i] for c in res["cpu"]) for i in range(len(on))]
    paired_cpu = [a / b - 1.0 for a, b in zip(cpu_on, cpu_off, strict=True)]
    summary = {
        "step_s_without": statistics.median(off), "step_s_with": statistics.median(on),
        "overhead_pct_ab": 100 * statistics.median(paired),
        "overhead_pct_ab_ci95": [100 * v for v in median_ci(paired)],
        "overhead_pct_ab_rounds": [100 * p for p in paired],
        "cpu_s_per_step_without": statistics.median(cpu_off),
        "cpu_s_per_step_with": statistics.median(cpu_on),
        "overhead_pct_cpu": 100 * statistics.median(paired_cpu),
        "overhead_pct_cpu_ci95": [100 * v for v in median_ci(paired_cpu)],
        "overhead_pct_cpu_rounds": [100 * p for p in paired_cpu],
        "overhead_pct_total": 100 * (sum(on) / sum(off) - 1.0),
        "overhead_pct_cpu_total": 100 * (sum(cpu_on) / sum(cpu_off) - 1.0),
        "rows": res["rows"], "steps_recorded": res["steps_recorded"],
        "parts_rank0": res["parts"],
    }
    print(f"{'round':>5} {'with (ms)':>10} {'without (ms)':>13} {'wall %':>8} "
          f"{'CPU with':>9} {'CPU w/o':>8} {'CPU %':>7}")
    for i, (a, b, p) in enumerate(zip(on, off, paired, strict=True)):
        print(f"{i:>5} {1e3 * a:>10.2f} {1e3 * b:>13.2f} {100 * p:>8.2f} "
              f"{1e3 * cpu_on[i]:>9.2f} {1e3 * cpu_off[i]:>8.2f} {100 * paired_cpu[i]:>7.2f}")
    lo, hi = summary["overhead_pct_ab_ci95"]
    clo, chi = summary["overhead_pct_cpu_ci95"]
    print(f"bubblecast.record A/B overhead, median of {len(on)} paired rounds: wall "
          f"{summary['overhead_pct_ab']:+.2f}% (95% CI {lo:+.2f}..{hi:+.2f}), CPU (both ranks) "
          f"{summary['overhead_pct_cpu']:+.2f}% ({clo:+.2f}..{chi:+.2f}); totals: wall "
          f"{summary['overhead_pct_total']:+.2f}%, CPU {summary['overhead_pct_cpu_total']:+.2f}%;"
          f" {res['rows']} rows, {res['parts']} parts per rank")
    path = RESULTS.with_name("record-control.json") if args.control else RESULTS
    write_json(path, {**run_header("record", backend="gloo", ranks=2,
                                      model=f"Schedule1F1B, 8 x (Linear {args.hidden} + GELU), "
                                            "4 microbatches of 16",
                                      flush_every=args.flush_every,
                                      min_part_s=args.min_part_s, block=args.block,
                                      control=args.control),
                         "summary": summary})


if __name__ == "__main__":
    if "RANK" in os.environ and "LOCAL_RANK" in os.environ:
        worker(Path(sys.argv[1]))
    else:
        main()
