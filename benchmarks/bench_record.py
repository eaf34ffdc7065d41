"""Overhead of ``bubblecast.record`` on a user's own pipeline loop: a direct A/B.

Two ranks under torchrun (gloo, CPU, one thread each) train one pipeline: a plain torch
``Schedule1F1B`` over 8 x (Linear(H, H) + GELU) (H=512 by default: 2.1M parameters), each rank
half the layers, 4 micro-batches of 16, SGD, the same batch (fixed seeds) every step. The arms
take turns on that one pipeline, one block of ``--block`` steps each per round (order AB, BA,
BA, AB, ...; barriers around each block; the first ``--warmup`` rounds dropped):

- ``bare``: nothing attached;
- ``record``: the user's default, as in the README example: ``bubblecast.record(schedule,
  out=..., optimizer=opt)`` (run_id None; flush_every=50, min_part_s=5: a part at most every
  5 s; host timing; no per-layer cost sampling). Its one recording is attached at the start
  of each of its blocks and detached at the end, after waiting for the parts handed to the
  writer thread, so that all of its cost, the writer's CPU included, lands in its own blocks;
- ``frequent`` (``--frequent``): the built-in trainer's settings, record(...,
  flush_every=50, min_part_s=0, layer_cost_every=10, metrics_every=10, clock_every=100): a
  part every 50 steps, per-layer costs and device metrics every 10, clock offsets every 100;
- ``control`` (``--control``): a second bare arm (A/A: the method's own noise).

Blocks are short (10 steps, ~0.35 s), so that load from other processes, which comes and
goes over seconds on a shared machine, hits both arms of a round alike. The overhead of an
arm is the median over rounds of its per-round ratio to ``bare`` (- 1), in wall time per step
and in process CPU per step (both ranks summed, writer thread included), with a
distribution-free 95% interval of that median (order statistics): the cost of a typical
round, the per-op and per-step work. A part (at most one per 5 s) lands in about one
``record`` block in 15, so the median leaves it out; the ratio of the totals, with a
bootstrap interval over rounds, charges it in full (parts land about twice as densely as
in a run recorded throughout, since the 5 s run on while the arm is detached).

    python benchmarks/bench_record.py [--rounds 300] [--block 10] [--frequent] [--control]

Prints a table and writes benchmarks/results/record.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path
from typing import Any

from _ab import is_worker, paired_summary, run_job, timed_rounds

from bubblecast.runtime.shutdown import exit_process

RESULTS = Path(__file__).resolve().parent / "results" / "record.json"
LAYERS, MICROBATCHES, BATCH = 8, 4, 64
#: record() arguments of each recorded arm, beyond the schedule, out and optimizer.
SETTINGS: dict[str, dict[str, Any]] = {
    "record": {},
    "frequent": {"flush_every": 50, "min_part_s": 0.0, "layer_cost_every": 10,
                 "metrics_every": 10, "clock_every": 100},
}


def _pipeline(rank: int, world: int, hidden: int) -> tuple[Any, Any, int]:
    import torch
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.Linear(hidden, hidden), torch.nn.GELU())
              for _ in range(LAYERS)]
    per = LAYERS // world
    mine = torch.nn.Sequential(*blocks[rank * per:(rank + 1) * per])
    stage = PipelineStage(mine, rank, world, torch.device("cpu"))
    schedule = Schedule1F1B(stage, MICROBATCHES, loss_fn=torch.nn.functional.mse_loss)
    params = sum(p.numel() for b in blocks for p in b.parameters())
    return schedule, torch.optim.SGD(mine.parameters(), lr=1e-3), params


def worker(job_dir: Path) -> None:
    import torch
    import torch.distributed as dist

    import bubblecast

    job = json.loads((job_dir / "bench.json").read_text())
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    schedule, opt, params = _pipeline(rank, world, job["hidden"])
    g = torch.Generator().manual_seed(0)
    x = torch.randn(BATCH, job["hidden"], generator=g)
    y = torch.randn(BATCH, job["hidden"], generator=g)

    def step() -> None:
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=y)
        opt.step()
        opt.zero_grad()

    for _ in range(5):  # P2P set-up and shape inference
        step()
    recordings = {}
    for name in job["recorded"]:  # one at a time: a recording attaches when made
        recordings[name] = bubblecast.record(schedule, out=job_dir / name, optimizer=opt,
                                             **SETTINGS[name])
        recordings[name].detach()

    def arm(name: str) -> tuple[Any, Any]:
        if name not in recordings:
            return (lambda: None), (lambda: None)
        rec = recordings[name]

        def leave() -> None:
            rec.end_step()
            rec.recorder.wait_written()  # the writer's CPU is this block's
            rec.detach()
        return (lambda: rec.attach(schedule)), leave

    arms = {name: arm(name) for name in job["arms"]}
    timed_rounds(arms, step, job["warmup"], job["block"], dist.barrier)  # dropped
    times = timed_rounds(arms, step, job["rounds"], job["block"], dist.barrier)
    stats = {}
    for name, rec in recordings.items():
        rec.close()
        where = Path(str(rec.events_dir))
        stats[name] = {"steps": rec.step, "rows": len(bubblecast.read_events(where)),
                       "parts": len(list(where.glob(f"rank{rank:04d}-*.parquet"))),
                       "part_cpu_s": rec.recorder.part_cpu_s}
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, {"times": times, "stats": stats})
    if rank == 0:
        (job_dir / "result.json").write_text(json.dumps({"ranks": gathered, "params": params}))
    dist.destroy_process_group()


def summarize(res: dict[str, Any], arms: list[str]) -> dict[str, Any]:
    """Per arm: step times, wall and CPU overhead against ``bare``, writer figures."""
    ranks = res["ranks"]
    wall = {a: ranks[0]["times"][a]["wall"] for a in arms}  # barriers: equal on every rank
    cpu = {a: [sum(r["times"][a]["cpu"][i] for r in ranks) for i in range(len(wall[a]))]
           for a in arms}
    out: dict[str, Any] = {"params": res["params"],
                           "step_ms_bare": 1e3 * statistics.median(wall["bare"]),
                           "cpu_ms_per_step_bare": 1e3 * statistics.median(cpu["bare"]),
                           "faults_per_step_bare": [statistics.median(r["times"]["bare"]
                                                                      ["faults"])
                                                    for r in ranks],
                           "arms": {}}
    for a in arms:
        if a == "bare":
            continue
        row: dict[str, Any] = {"step_ms": 1e3 * statistics.median(wall[a]),
                               "faults_per_step": [statistics.median(r["times"][a]["faults"])
                                                   for r in ranks],
                               "wall": paired_summary(wall[a], wall["bare"]),
                               "cpu": paired_summary(cpu[a], cpu["bare"])}
        if a in SETTINGS:
            stats = [r["stats"][a] for r in ranks]
            part_cpu = [s for st in stats for s in st["part_cpu_s"]]
            row.update(settings=SETTINGS[a], steps_recorded=stats[0]["steps"],
                       rows=stats[0]["rows"], parts_per_rank=[st["parts"] for st in stats],
                       part_cpu_ms_median=1e3 * statistics.median(part_cpu) if part_cpu
                       else None)
        out["arms"][a] = row
    return out


def report(summary: dict[str, Any], rounds: int, block: int) -> None:
    """Print the per-arm table."""
    print(f"model: {summary['params'] / 1e6:.1f}M parameters; bare step "
          f"{summary['step_ms_bare']:.1f} ms wall, {summary['cpu_ms_per_step_bare']:.1f} ms CPU"
          f" (both ranks); {rounds} rounds x {block} steps per arm")
    print(f"{'arm':>9} {'median wall % (95% CI)':>24} {'median CPU % (95% CI)':>24} "
          f"{'total wall % (95% CI)':>24} {'total CPU % (95% CI)':>24} {'parts':>5} "
          f"{'ms/part':>7}")
    for name, row in summary["arms"].items():
        cells = []
        for key, stat, ci in (("wall", "median_pct", "ci95_pct"), ("cpu", "median_pct",
                              "ci95_pct"), ("wall", "total_pct", "total_ci95_pct"),
                              ("cpu", "total_pct", "total_ci95_pct")):
            s = row[key]
            lo, hi = s[ci]
            cells.append(f"{s[stat]:+6.2f} ({lo:+.2f}..{hi:+.2f})".rjust(24))
        parts = row.get("parts_per_rank", ["-"])[0]
        per = row.get("part_cpu_ms_median")
        print(f"{name:>9} {' '.join(cells)} {parts!s:>5} "
              f"{'-' if per is None else f'{per:.1f}':>7}")


def main() -> None:
    from _results import run_header, write_json

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=300, help="rounds counted (default 300)")
    ap.add_argument("--warmup", type=int, default=10, help="rounds run first and dropped")
    ap.add_argument("--block", type=int, default=10, help="steps per arm per round")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--frequent", action="store_true",
                    help="add the trainer's settings (a part every 50 steps, cost sampling)")
    ap.add_argument("--control", action="store_true", help="add a second bare arm (A/A)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    recorded = ["record"] + (["frequent"] if args.frequent else [])
    arms = ["bare", *recorded] + (["control"] if args.control else [])
    load_before = list(os.getloadavg())
    res = run_job(__file__, {"rounds": args.rounds, "warmup": args.warmup, "block": args.block,
                             "hidden": args.hidden, "arms": arms, "recorded": recorded},
                  timeout=1800)
    summary = summarize(res, arms)
    report(summary, args.rounds, args.block)
    write_json(args.out, {**run_header(
        "record", backend="gloo", ranks=2, load_average=[load_before, list(os.getloadavg())],
        model=f"Schedule1F1B, {LAYERS} x (Linear {args.hidden} + GELU), {MICROBATCHES} "
              f"microbatches of {BATCH // MICROBATCHES}, SGD",
        rounds=args.rounds, warmup_rounds=args.warmup, block=args.block, arms=arms),
        "summary": summary})


if __name__ == "__main__":
    if is_worker():
        import sys

        worker(Path(sys.argv[1]))
        exit_process(0)  # no finalization: see bubblecast.runtime.shutdown
    else:
        main()
