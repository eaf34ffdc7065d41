"""Telemetry recorder overhead: step time with and without the recorder, in one run.

Two ranks under torchrun (gloo, CPU, one thread each) train the same small GPT twice over:
one trainer records everything (F/B/W/OPTIMIZER rows, Parquet parts written by the
background thread every ``flush_every`` steps, per-layer cost samples every 10 steps), the
other records nothing. Blocks of steps alternate between the two (order swapped each round,
barriers around each block), so machine drift hits both alike; the overhead is the median
over rounds of the paired ratio with/without - 1, in wall time and in CPU time (each rank's
process CPU, writer thread included, summed over ranks; less sensitive to other load).

On a shared 2-core machine the A/B difference is below the noise, so the script also gives
an analytic bound: the measured cost of one wrapped op (an empty stage method wrapped by the
recorder, minus the bare call) times the ops per step, plus the writer's time per part
spread over the steps it covers (as if the writer thread blocked training throughout), plus
the extra time of a per-layer cost-sampling step spread over 10 steps, over the step time.

    python benchmarks/bench_recorder.py [--rounds 6] [--block 15] [--hidden 128]

Prints a table and writes benchmarks/results/recorder.json.
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

RESULTS = Path(__file__).resolve().parent / "results" / "recorder.json"


def _per_op_cost(n: int = 200_000) -> float:
    """Seconds the recorder adds to one stage-method call (wrapped minus bare)."""
    from bubblecast.runtime.recorder import Recorder
    from bubblecast.telemetry.schema import RunMeta

    class Stage:
        def forward_one_chunk(self, mb, *a, **k):
            return mb

        backward_one_chunk = backward_weight_one_chunk = forward_one_chunk

    bare = Stage()
    wrapped = Stage()
    rec = Recorder(run_id="r", rank=0, stage=0, origin_wall=0.0, meta_fn=RunMeta)
    rec.attach([wrapped], {0: {}})
    rec.begin_step(0, 1)
    best = {}
    for name, stage in (("bare", bare), ("wrapped", wrapped)):
        times = []
        for _ in range(5):
            rec.discard()
            t0 = time.perf_counter()
            for i in range(n):
                stage.forward_one_chunk(i)
            times.append((time.perf_counter() - t0) / n)
        best[name] = min(times)
    return best["wrapped"] - best["bare"]


def _sampling_cost(layers: int = 4, microbatches: int = 4, n: int = 300) -> float:
    """Extra seconds of one per-layer cost-sampling step (hooks on, then off) on a stage of
    ``layers`` small layers running ``microbatches`` forwards; best of 5 repeats."""
    import torch

    from bubblecast.runtime.recorder import Recorder
    from bubblecast.telemetry.schema import RunMeta

    mods = {i: torch.nn.Linear(8, 8) for i in range(layers)}
    seq = torch.nn.Sequential(*mods.values())
    x = torch.zeros(1, 8)

    class Stage:
        def forward_one_chunk(self, mb, *a, **k):
            return seq(x)

        backward_one_chunk = backward_weight_one_chunk = forward_one_chunk

    cost = {}
    for every in (0, 1):
        stage = Stage()
        rec = Recorder(run_id="r", rank=0, stage=0, origin_wall=0.0, meta_fn=RunMeta,
                       layer_cost_every=every, flush_every=10**9)
        rec.attach([stage], {0: mods})
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for step in range(n):
                rec.begin_step(step, 1)
                for mb in range(microbatches):
                    stage.forward_one_chunk(mb)
                rec.end_step()
                rec.discard()
            best = min(best, (time.perf_counter() - t0) / n)
        cost[every] = best
    return cost[1] - cost[0]


def worker(job_dir: Path) -> None:
    import torch
    import torch.distributed as dist

    from bubblecast.runtime.config import ModelSpec, TrainConfig
    from bubblecast.runtime.trainer import Trainer, init_distributed

    job = json.loads((job_dir / "bench.json").read_text())
    init_distributed("gloo")
    torch.set_num_threads(1)
    spec = ModelSpec(kind="gpt", layers=8, hidden=job["hidden"], seq_len=64, vocab=256, heads=4)
    common = {"model": spec, "stages": 2, "microbatches": 4, "schedule": "1f1b",
              "batch_size": 16, "optimizer": "adam", "flush_every": job["flush_every"],
              "layer_cost_every": 10, "steps": 1}
    on = Trainer(TrainConfig(**common, events_dir=str(job_dir / "parts"), run_id="on"))
    off = Trainer(TrainConfig(**common, run_id="off"), record=False)
    for t in (on, off):  # warm-up: first steps run the P2P warm-up and shape inference
        for _ in range(3):
            t.train_step()
    blocks: dict[str, list[float]] = {"on": [], "off": []}
    cpu: dict[str, list[float]] = {"on": [], "off": []}
    for r in range(job["rounds"]):
        order = (("on", on), ("off", off)) if r % 2 == 0 else (("off", off), ("on", on))
        for name, t in order:
            dist.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(job["block"]):
                t.train_step()
            c1 = time.process_time()  # this process's CPU, the writer thread included
            dist.barrier()
            blocks[name].append((time.perf_counter() - t0) / job["block"])
            cpu[name].append((c1 - c0) / job["block"])
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, cpu)
    rows_on = on.close(out=str(job_dir / "events.parquet"))
    off.close()
    if dist.get_rank() == 0:
        write = _part_write_seconds(job_dir / "events.parquet", job["flush_every"])
        (job_dir / "result.json").write_text(json.dumps(
            {"blocks": blocks, "cpu": gathered, "rows": rows_on, "per_op_s": _per_op_cost(),
             "part_write_s": write, "ops_per_step": 2 * 4 + 1,
             "sampling_s": _sampling_cost()}))
    dist.destroy_process_group()


def _part_write_seconds(events: Path, steps: int) -> float:
    """Time to validate and write one part of ``steps`` steps of one rank (median of 3)."""
    from bubblecast.telemetry import from_frame, read_events, write_events

    ev = read_events(events)
    part = ev.frame.loc[(ev.frame["rank"] == 0) & (ev.frame["step"] < steps)]
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(3):
            t0 = time.perf_counter()
            write_events(from_frame(part.reset_index(drop=True), dict(ev.runs)),
                         Path(tmp) / "p.parquet", validate=False)  # as the recorder does
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    from _results import run_header, write_json

    from bubblecast.runtime.launch import failure_message, launch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--block", type=int, default=15)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--flush-every", type=int, default=50)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        job_dir = Path(tmp)
        (job_dir / "bench.json").write_text(json.dumps(
            {"rounds": args.rounds, "block": args.block, "hidden": args.hidden,
             "flush_every": args.flush_every}))
        code = launch(job_dir, 2, script=__file__, timeout=900)
        if code != 0:
            sys.exit(f"benchmark failed: {failure_message(job_dir)}")
        res = json.loads((job_dir / "result.json").read_text())
    on, off = res["blocks"]["on"], res["blocks"]["off"]
    paired = [a / b - 1.0 for a, b in zip(on, off, strict=True)]
    cpu_on = [sum(c["on"][i] for c in res["cpu"]) for i in range(len(on))]
    cpu_off = [sum(c["off"][i] for c in res["cpu"]) for i in range(len(on))]
    paired_cpu = [a / b - 1.0 for a, b in zip(cpu_on, cpu_off, strict=True)]
    step = statistics.median(off)
    op_share = res["per_op_s"] * res["ops_per_step"] / step
    writer_share = res["part_write_s"] / (args.flush_every * step)
    sampling_share = res["sampling_s"] / (10 * step)  # one sampled step in 10
    summary = {
        "step_s_without": step, "step_s_with": statistics.median(on),
        "overhead_pct_ab": 100 * statistics.median(paired),
        "overhead_pct_ab_rounds": [100 * p for p in paired],
        "cpu_s_per_step_without": statistics.median(cpu_off),
        "cpu_s_per_step_with": statistics.median(cpu_on),
        "overhead_pct_cpu": 100 * statistics.median(paired_cpu),
        "overhead_pct_cpu_rounds": [100 * p for p in paired_cpu],
        "per_op_us": 1e6 * res["per_op_s"], "ops_per_step_per_rank": res["ops_per_step"],
        "part_write_s": res["part_write_s"],
        "sampling_step_us": 1e6 * res["sampling_s"],
        "overhead_pct_bound": 100 * (op_share + writer_share + sampling_share),
        "rows": res["rows"],
    }
    print(f"{'round':>5} {'with (ms)':>10} {'without (ms)':>13} {'wall %':>8} "
          f"{'CPU with':>9} {'CPU w/o':>8} {'CPU %':>7}")
    for i, (a, b, p) in enumerate(zip(on, off, paired, strict=True)):
        print(f"{i:>5} {1e3 * a:>10.2f} {1e3 * b:>13.2f} {100 * p:>8.2f} "
              f"{1e3 * cpu_on[i]:>9.2f} {1e3 * cpu_off[i]:>8.2f} {100 * paired_cpu[i]:>7.2f}")
    print(f"A/B overhead, median of paired rounds: wall {summary['overhead_pct_ab']:+.2f}%, "
          f"CPU (both ranks) {summary['overhead_pct_cpu']:+.2f}%")
    print(f"bound: {summary['per_op_us']:.2f} us/op x {res['ops_per_step']} ops + "
          f"{1e3 * res['part_write_s']:.1f} ms per {args.flush_every}-step part + "
          f"{summary['sampling_step_us']:.0f} us per cost-sampled step (1 in 10), over "
          f"{1e3 * step:.1f} ms steps = {summary['overhead_pct_bound']:.3f}% of step time")
    write_json(RESULTS, {**run_header("recorder", backend="gloo", ranks=2,
                                      model=f"gpt L=8 hidden={args.hidden} seq=64"),
                         "summary": summary})


if __name__ == "__main__":
    if "RANK" in os.environ and "LOCAL_RANK" in os.environ:
        worker(Path(sys.argv[1]))
    else:
        main()
