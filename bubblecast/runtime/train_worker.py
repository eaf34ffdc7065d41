"""Worker entry point: ``torchrun ... -m bubblecast.runtime.train_worker JOB_DIR``.

Runs the job in ``JOB_DIR/job.json`` (see :func:`bubblecast.runtime.launch.write_job`) on this
rank: scripted actions before their steps, checkpoints, telemetry merged into ``out`` by
rank 0, ``summary.json`` and ``origin.json`` (the clock of the events) from rank 0. Optional
job keys: ``parts`` (the folder of telemetry parts in ``JOB_DIR``), ``resume`` (a checkpoint
to start from), ``until`` (the step to stop at; default: ``config.steps`` more steps) and
``origin_wall`` (the clock of an earlier attempt). A failing rank writes
``error-rank{r}.txt`` (a one-line reason, then the traceback) and exits 1. A
:class:`StepHook` (the closed-loop controller of :mod:`bubblecast.runtime.control.control_worker`)
can run around every step and add to the summary.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from bubblecast.runtime.launch import PROGRESS_PREFIX, die_with_parent
from bubblecast.runtime.shutdown import exit_process
from bubblecast.runtime.train_config import TrainConfig

PROFILE_STEPS = 4


class StepHook(Protocol):
    """Work done by :func:`run_job` around each training step, and once after the last."""

    def before_step(self, step: int) -> None:
        """Before ``step`` (after its scripted actions and checkpoint)."""

    def after_step(self, t0: float) -> None:
        """After each step; ``t0`` is ``time.perf_counter()`` when the loop began."""

    def finish(self) -> dict[str, Any]:
        """After the loop, before the losses are gathered: entries to add to the summary."""


HookFactory = Callable[[Any, dict[str, Any]], StepHook]  # (trainer, job) -> hook


def checkpoint_calendar(steps: dict[int, Any]) -> dict[str, int]:
    """Run-metadata ``calendar`` entries for the checkpoints saved before ``steps``:
    ``checkpoint_every``/``checkpoint_first`` when they are evenly spaced (one checkpoint: its
    step, every a period longer than any run); empty when none or irregular (the dataset's
    known-future calendar features need a period)."""
    at = sorted(steps)
    if not at:
        return {}
    gaps = {b - a for a, b in zip(at, at[1:], strict=False)} if len(at) > 1 else {2**31 - 1}
    if len(gaps) != 1:
        return {}
    return {"checkpoint_every": int(gaps.pop()), "checkpoint_first": int(at[0])}


def run_job(job_dir: Path, job: dict[str, Any], make_hook: HookFactory | None = None) -> None:
    """Train this rank's part of the job; rank 0 writes ``summary.json``."""
    import torch
    import torch.distributed as dist

    from bubblecast.runtime.trainer import Trainer, init_distributed

    config = TrainConfig.from_json(job["config"])
    if job.get("out") and config.events_dir is None:
        config = replace(config, events_dir=str(job_dir / job.get("parts", "parts")))
    init_distributed(config.backend)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    trainer = Trainer(config, resume=job.get("resume"), origin_wall=job.get("origin_wall"))
    if trainer.is_lead:  # a resumed attempt puts its events on this clock too
        (job_dir / "origin.json").write_text(json.dumps({"origin_wall": trainer.origin_wall}))
    hook = make_hook(trainer, job) if make_hook is not None else None
    actions: dict[int, list[dict[str, Any]]] = {}
    for item in job.get("actions", []):
        actions.setdefault(int(item["step"]), []).append(item["action"])
    checkpoints = {int(k): v for k, v in job.get("checkpoint_at", {}).items()}
    trainer.calendar.update(checkpoint_calendar(checkpoints))
    show = bool(job.get("progress")) and trainer.is_lead
    start = trainer.step
    end = int(job["until"]) if job.get("until") is not None else start + config.steps
    prof = profiler(config, trainer.global_rank) if config.profile_dir else nullcontext()
    t0 = time.perf_counter()
    with prof:
        while trainer.step < end:
            step = trainer.step
            for action in actions.get(step, []):
                trainer.apply(action)
            if step in checkpoints:
                trainer.save_checkpoint(checkpoints[step])
            if hook is not None:
                hook.before_step(step)
            loss = trainer.train_step()
            if hook is not None:
                hook.after_step(t0)
            if config.profile_dir and hasattr(prof, "step"):
                prof.step()
            if show:
                shown = "-" if loss is None else f"{loss:.6g}"
                print(f"{PROGRESS_PREFIX} {trainer.step - start} {end - start} {shown}",
                      flush=True)
    wall = time.perf_counter() - t0
    extra = hook.finish() if hook is not None else {}
    if end in checkpoints:
        trainer.save_checkpoint(checkpoints[end])
    losses = trainer.gather_losses()
    rows = trainer.close(out=job.get("out"))
    if trainer.is_lead:
        ran = max(end - start, 1)
        summary = {"rows": rows, "wall_s": wall, "steps": ran, "first_step": start,
                   "step_time_s": wall / ran, "losses": losses,
                   "actions": trainer.actions, "partition": list(trainer.plan.partition),
                   "schedule": trainer.plan.schedule, "microbatches": trainer.plan.microbatches,
                   "replicas": config.replicas, **packed_summary(trainer), **extra}
        (job_dir / "summary.json").write_text(json.dumps(summary, default=float))
    dist.destroy_process_group()


def packed_summary(trainer: Any) -> dict[str, Any]:
    """The packed model's summary entries: each step's micro-batches per replica and the
    documents trained (empty for the other models)."""
    packed = trainer.packed
    if packed is None:
        return {}
    counts = {str(k): v for k, v in sorted(packed.counts.items())}
    docs = sum(len(packed.loader.lengths(k)) for k in packed.counts)
    planner = packed.planner
    return {"counts": counts, "documents_trained": docs, "planner": trainer.config.planner,
            "decisions": list(planner.decisions) if planner is not None else [],
            "tokens_trained": sum(int(packed.loader.lengths(k).sum()) for k in packed.counts)}


def profiler(config: TrainConfig, rank: int) -> Any:
    """torch.profiler over a few steps after the first; Kineto trace per rank."""
    import torch

    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    steps = max(1, min(PROFILE_STEPS, config.steps - 1))
    out = Path(str(config.profile_dir))
    out.mkdir(parents=True, exist_ok=True)
    return torch.profiler.profile(
        activities=activities,
        schedule=torch.profiler.schedule(wait=1 if config.steps > 1 else 0, warmup=0,
                                         active=steps, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(str(out / f"rank{rank}.json")))


def main(argv: list[str] | None = None, *, make_hook: HookFactory | None = None,
         usage: str = "python -m bubblecast.runtime.train_worker JOB_DIR") -> int:
    """Run ``JOB_DIR`` (the one argument); on failure write ``error-rank{r}.txt``, return 1."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(f"usage: {usage}", file=sys.stderr)
        return 2
    job_dir = Path(args[0])
    rank = int(os.environ.get("RANK", "0"))
    arm = die_with_parent()  # torchrun killed (with the command): stop, rather than train on
    if arm is not None:
        arm()
        if os.getppid() == 1:  # it died before we armed
            return 1
    try:
        run_job(job_dir, json.loads((job_dir / "job.json").read_text()), make_hook)
    except BaseException as exc:  # report, then fail this rank (torchrun stops the others)
        line = " ".join(f"{type(exc).__name__}: {exc}".split())
        (job_dir / f"error-rank{rank}.txt").write_text(f"{line}\n{traceback.format_exc()}")
        return 1
    return 0


if __name__ == "__main__":
    exit_process(main())  # no finalization: see runtime.shutdown
