"""Produce real PyTorch profiler traces of a tiny pipeline-parallel model (test helper).

Run as ``python pp_profile_worker.py OUT_DIR [SCHEDULE ...]``: starts 2 CPU processes (gloo),
and for each schedule trains a 4-Linear-layer model split into pipeline stages with
``torch.distributed.pipelining`` under ``torch.profiler`` (with a schedule, so
``ProfilerStep#N`` annotations exist), writing ``OUT_DIR/SCHEDULE/rank{R}.json`` (the last rank
gzipped, to cover ``.json.gz``). Multi-stage schedules put 2 stages (chunks) on each rank.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from bubblecast.runtime.shutdown import exit_process

WORLD = 2
MICROBATCHES = 4
WAIT, WARMUP, ACTIVE = 1, 1, 3  # profiler schedule: steps 2..4 are recorded
HIDDEN = 16
TIMEOUT_S = 180
SCHEDULES = ("interleaved", "zb-interleaved", "zbv", "looped-bfs-1", "gpipe")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _build(schedule: str, rank: int):
    """The pipeline schedule, local stages and optimizer of this rank."""
    import torch
    from torch.distributed import pipelining as pp

    torch.manual_seed(0)
    layers = [torch.nn.Linear(HIDDEN, HIDDEN) for _ in range(4)]
    loss_fn = torch.nn.MSELoss()
    if schedule in ("looped-bfs-1", "gpipe"):  # one stage per rank, two layers each
        local = [(rank, torch.nn.Sequential(*layers[2 * rank : 2 * rank + 2]))]
        n_stages = WORLD
    else:
        n_stages = 2 * WORLD
        # V shape: rank r holds stages r and 2*WORLD-1-r; looped: stages r and r + WORLD
        ids = [rank, n_stages - 1 - rank] if schedule == "zbv" else [rank, rank + WORLD]
        local = [(i, layers[i]) for i in ids]
    stages = [pp.PipelineStage(mod, i, n_stages, torch.device("cpu")) for i, mod in local]
    if schedule == "gpipe":  # a single-stage schedule: emits no PP: labels in torch 2.13
        sched = pp.ScheduleGPipe(stages[0], n_microbatches=MICROBATCHES, loss_fn=loss_fn)
        return sched, stages, torch.optim.SGD(local[0][1].parameters(), lr=0.01)
    cls = {
        "interleaved": pp.ScheduleInterleaved1F1B,
        "zb-interleaved": pp.ScheduleInterleavedZeroBubble,
        "zbv": pp.ScheduleZBVZeroBubble,
        "looped-bfs-1": pp.ScheduleLoopedBFS,
    }[schedule]
    sched = cls(stages, n_microbatches=MICROBATCHES, loss_fn=loss_fn)
    params = [p for _, mod in local for p in mod.parameters()]
    return sched, stages, torch.optim.SGD(params, lr=0.01)


def _run_schedule(schedule: str, rank: int, out_dir: Path) -> None:
    import torch

    sched, stages, opt = _build(schedule, rank)
    first = any(s.is_first for s in stages)
    last = any(s.is_last for s in stages)
    x = torch.randn(MICROBATCHES * 2, HIDDEN)
    y = torch.randn(MICROBATCHES * 2, HIDDEN)
    target = out_dir / schedule
    target.mkdir(parents=True, exist_ok=True)
    suffix = ".json.gz" if rank == WORLD - 1 else ".json"

    def export(prof) -> None:
        prof.export_chrome_trace(str(target / f"rank{rank}{suffix}"))

    prof_sched = torch.profiler.schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], schedule=prof_sched, on_trace_ready=export
    ) as prof:
        for _ in range(WAIT + WARMUP + ACTIVE):
            opt.zero_grad()
            args = (x,) if first else ()
            kwargs = {"target": y} if last else {}
            sched.step(*args, **kwargs)
            opt.step()
            prof.step()


def _worker(rank: int, port: int, out_dir: str, schedules: list[str]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        for schedule in schedules:
            _run_schedule(schedule, rank, Path(out_dir))
            dist.barrier()
    finally:
        dist.destroy_process_group()


def main(argv: list[str]) -> int:
    """Launch one process per rank (without importing torch here, which would cost a third
    torch start-up); return the first non-zero exit code."""
    if len(argv) >= 4 and argv[0] == "--rank":  # a launched rank
        _worker(int(argv[1]), int(argv[2]), argv[3], argv[4:])
        return 0
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    out_dir, schedules = argv[0], list(argv[1:]) or list(SCHEDULES)
    unknown = [s for s in schedules if s not in SCHEDULES]
    if unknown:
        print(f"unknown schedules {unknown}; choose from {SCHEDULES}", file=sys.stderr)
        return 2
    env = dict(os.environ, OMP_NUM_THREADS="1")
    port = str(_free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--rank", str(r), port, out_dir, *schedules], env=env
        )
        for r in range(WORLD)
    ]
    try:
        codes = [p.wait(timeout=TIMEOUT_S) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return next((c for c in codes if c), 0)


if __name__ == "__main__":
    exit_process(main(sys.argv[1:]))  # no finalization: see runtime.shutdown
