"""Launching a training job under torchrun on this machine, from the CLI or from tests.

A job is a directory holding ``job.json`` (the :class:`TrainConfig` plus output settings);
``python -m torch.distributed.run --standalone --nproc-per-node P -m bubblecast.runtime.worker
JOB_DIR`` runs it. Workers write telemetry parts, a per-rank error file when they fail, and
rank 0 writes ``summary.json``. Rank 0 prints progress lines on stdout, which :func:`launch`
turns into a rich progress bar on stderr; everything torchrun prints goes to ``torchrun.log``.
No torch import here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bubblecast.runtime.config import TrainConfig

PROGRESS_PREFIX = "@@bubblecast-progress"


def write_job(job_dir: str | Path, config: TrainConfig, *, out: str | None = None,
              actions: list[dict[str, Any]] | None = None, progress: bool = False,
              checkpoint_at: dict[int, str] | None = None, resume: str | None = None) -> Path:
    """Write ``job.json``: the config, the events file to merge into, scripted actions
    (``[{"step": s, "action": {...}}]``, applied before step s), checkpoints to save."""
    root = Path(job_dir)
    root.mkdir(parents=True, exist_ok=True)
    job = {"config": config.to_json(), "out": out, "actions": actions or [],
           "progress": progress, "resume": resume,
           "checkpoint_at": {str(k): v for k, v in (checkpoint_at or {}).items()}}
    path = root / "job.json"
    path.write_text(json.dumps(job, indent=1))
    return path


WORKER = "bubblecast.runtime.worker"


def torchrun_command(job_dir: str | Path, nproc: int, script: str | None = None,
                     extra: list[str] | None = None, module: str = WORKER) -> list[str]:
    """The torchrun command line running ``python -m module JOB_DIR`` on each rank (or a
    ``script`` path with ``extra`` arguments: benchmarks)."""
    target = [script] if script else ["-m", module]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", str(nproc), *target, str(job_dir), *(extra or [])]


def worker_env() -> dict[str, str]:
    """Environment for workers: one intra-op thread per rank unless the caller chose."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("PYTHONWARNINGS", "ignore")
    return env


def launch(job_dir: str | Path, nproc: int, *, script: str | None = None,
           module: str = WORKER, extra: list[str] | None = None, timeout: float | None = None,
           on_progress: Callable[[int, int, float | None], None] | None = None) -> int:
    """Run the job; return torchrun's exit code (124 after ``timeout`` seconds, when torchrun
    and its workers are stopped). Output goes to ``job_dir/torchrun.log``."""
    root = Path(job_dir)
    cmd = torchrun_command(root, nproc, script, extra, module)
    env = worker_env()
    if timeout is not None:  # collectives give up too, rather than wait for a dead peer
        env.setdefault("BUBBLECAST_DIST_TIMEOUT_S", str(max(10.0, timeout / 2)))
    with open(root / "torchrun.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env,
                                bufsize=1)
        timer = threading.Timer(timeout, _stop, (proc,)) if timeout else None
        if timer is not None:
            timer.start()
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                if line.startswith(PROGRESS_PREFIX):
                    if on_progress is not None:
                        _, step, total, loss = line.split()
                        on_progress(int(step), int(total), None if loss == "-" else float(loss))
                else:
                    log.write(line)
            code = proc.wait()
        except BaseException:
            _stop(proc)
            raise
        finally:
            if timer is not None:
                timer.cancel()
    if timer is not None and getattr(proc, "_bubblecast_timed_out", False):
        return 124
    return code


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM torchrun (it stops its workers), then SIGKILL if it lingers."""
    if proc.poll() is not None:
        return
    proc._bubblecast_timed_out = True  # type: ignore[attr-defined]
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


def failure_message(job_dir: str | Path) -> str:
    """One line saying why a job failed: the first rank's error, else torchrun's last line."""
    root = Path(job_dir)
    for err in sorted(root.glob("error-rank*.txt")):
        first = err.read_text().strip().splitlines()
        if first:
            return f"{err.stem.removeprefix('error-')}: {first[0]}"
    log = root / "torchrun.log"
    lines = [ln for ln in log.read_text().splitlines() if ln.strip()] if log.exists() else []
    return lines[-1].strip() if lines else "torchrun failed without output"
