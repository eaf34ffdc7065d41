"""Worker of a controlled run: ``python -m torch.distributed.run ... control_worker.py JOB_DIR``.

Like :mod:`bubblecast.runtime.worker` (scripted actions, telemetry merged into ``out`` by rank
0, ``summary.json``, ``error-rank{r}.txt`` on failure) plus a :class:`Controller` after every
step. ``job.json`` carries ``control`` (a :class:`ControllerConfig`) and optionally
``ab_block``: control on for blocks of that many steps, off for the next (overhead
measurement in one run). Rank 0's summary adds the decisions, each step's end time and every
rank's control seconds.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # run as a script: keep runtime/ off the path (module names clash)
    _here = str(Path(__file__).resolve().parent)
    sys.path[:] = [p for p in sys.path if str(Path(p or ".").resolve()) != _here]


def run_job(job_dir: Path, job: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist

    from bubblecast.runtime.config import TrainConfig
    from bubblecast.runtime.control_config import ControllerConfig
    from bubblecast.runtime.controller import Controller
    from bubblecast.runtime.launch import PROGRESS_PREFIX
    from bubblecast.runtime.trainer import Trainer, init_distributed
    from bubblecast.runtime.worker import _profiler

    config = TrainConfig.from_json(job["config"])
    control = ControllerConfig.from_json(job["control"])
    if job.get("out") and config.events_dir is None:
        config = replace(config, events_dir=str(job_dir / "parts"))
    init_distributed(config.backend)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    trainer = Trainer(config, resume=job.get("resume"))
    controller = Controller(trainer, control)
    scripted: dict[int, list[dict[str, Any]]] = {}
    for item in job.get("actions", []):
        scripted.setdefault(int(item["step"]), []).append(item["action"])
    block = int(job.get("ab_block") or 0)
    show = bool(job.get("progress")) and trainer.rank == 0
    start, end = trainer.step, trainer.step + config.steps
    prof = _profiler(config, trainer.rank) if config.profile_dir else nullcontext()
    ends: list[float] = []
    t0 = time.perf_counter()
    with prof:
        while trainer.step < end:
            step = trainer.step
            for action in scripted.get(step, []):
                trainer.apply(action)
            if block:
                controller.enabled = (step - start) // block % 2 == 0
            loss = trainer.train_step()
            controller.after_step()
            ends.append(time.perf_counter() - t0)
            if config.profile_dir and hasattr(prof, "step"):
                prof.step()
            if show:
                shown = "-" if loss is None else f"{loss:.6g}"
                print(f"{PROGRESS_PREFIX} {trainer.step - start} {config.steps} {shown}",
                      flush=True)
    wall = time.perf_counter() - t0
    controller.finish()
    stats = controller.gather_stats()
    controller.close()
    losses = trainer.gather_losses()
    rows = trainer.close(out=job.get("out"))
    if trainer.rank == 0:
        summary = {"rows": rows, "wall_s": wall, "steps": config.steps, "first_step": start,
                   "step_time_s": wall / config.steps, "losses": losses,
                   "actions": trainer.actions, "partition": list(trainer.plan.partition),
                   "schedule": trainer.plan.schedule, "microbatches": trainer.plan.microbatches,
                   "decisions": controller.decisions, "step_end_s": ends,
                   "control": stats, "forecaster": controller.note, "ab_block": block}
        (job_dir / "summary.json").write_text(json.dumps(summary, default=float))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: control_worker.py JOB_DIR", file=sys.stderr)
        return 2
    job_dir = Path(args[0])
    rank = int(os.environ.get("RANK", "0"))
    try:
        run_job(job_dir, json.loads((job_dir / "job.json").read_text()))
    except BaseException as exc:  # report, then fail this rank (torchrun stops the others)
        line = " ".join(f"{type(exc).__name__}: {exc}".split())
        (job_dir / f"error-rank{rank}.txt").write_text(f"{line}\n{traceback.format_exc()}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
