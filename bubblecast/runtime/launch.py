"""Launching a training job under torchrun on this machine, from the CLI or from tests.

A job is a directory holding ``job.json`` (the :class:`TrainConfig` plus output settings);
``python -m torch.distributed.run --standalone --nproc-per-node P -m bubblecast.runtime.train_worker
JOB_DIR`` runs it. Workers write telemetry parts, a per-rank error file when they fail, and
rank 0 writes ``summary.json``. Rank 0 prints progress lines on stdout, which :func:`launch`
turns into a rich progress bar on stderr; everything torchrun prints goes to ``torchrun.log``.

On several nodes (:class:`Nodes`, ``nnodes > 1``) the same command runs on every node and
starts ``torchrun --nnodes N --nproc-per-node P --rdzv-backend c10d --rdzv-endpoint
HOST:PORT --rdzv-id ID`` instead of ``--standalone``; the job folder is shared (see
:mod:`bubblecast.runtime.jobdir`). No torch import here.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bubblecast.errors import BubblecastError
from bubblecast.runtime.train_config import TrainConfig

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


WORKER = "bubblecast.runtime.train_worker"
#: Seconds a node without rank 0 waits for rank 0's summary after its own ranks finished.
SUMMARY_WAIT_S = 60.0


@dataclass(frozen=True)
class Nodes:
    """Where a job's ranks run: ``nnodes`` nodes (1: this machine, ``torchrun --standalone``),
    meeting at the c10d rendezvous ``endpoint`` (``HOST:PORT``, needed when nnodes > 1)
    under ``rdzv_id`` (default: the run id)."""

    nnodes: int = 1
    endpoint: str | None = None
    rdzv_id: str | None = None

    def __post_init__(self) -> None:
        if self.nnodes < 1:
            raise BubblecastError(f"--nnodes: must be >= 1, got {self.nnodes}")
        if self.nnodes > 1:
            host, _, port = (self.endpoint or "").rpartition(":")
            if not host or not port.isdigit():
                raise BubblecastError(f"--rdzv-endpoint: expected HOST:PORT with --nnodes "
                                      f"{self.nnodes}, got {self.endpoint!r}")

    @property
    def multi(self) -> bool:
        return self.nnodes > 1

    def nproc(self, ranks: int) -> int:
        """Processes per node for ``ranks`` ranks (stages x replicas); BubblecastError unless
        they divide."""
        if ranks % self.nnodes:
            raise BubblecastError(f"--nnodes: {ranks} ranks do not split over {self.nnodes} "
                                  f"nodes (one process per stage of each replica)")
        return ranks // self.nnodes

    def torchrun_args(self, nproc: int, run_id: str) -> list[str]:
        """torchrun's placement arguments."""
        if not self.multi:
            return ["--standalone", "--nproc-per-node", str(nproc)]
        return ["--nnodes", str(self.nnodes), "--nproc-per-node", str(nproc),
                "--rdzv-backend", "c10d", "--rdzv-endpoint", str(self.endpoint),
                "--rdzv-id", self.rdzv_id or run_id]


#: The nodes of jobs run in this context (:func:`on_nodes`); one node by default.
_NODES: ContextVar[Nodes | None] = ContextVar("bubblecast_nodes", default=None)


@contextmanager
def on_nodes(nodes: Nodes) -> Iterator[None]:
    """Run the jobs launched in the block (:func:`run_out_job`) on ``nodes``: lets a caller
    that launches through another function (``run``'s controller) choose them."""
    token = _NODES.set(nodes)
    try:
        yield
    finally:
        _NODES.reset(token)


#: Most ranks a job starts per CPU core of a node (tiny CPU models oversubscribe well up to
#: about this; beyond it the ranks only thrash, and gloo's timeouts fire).
RANKS_PER_CORE = 4


def check_machine(config: TrainConfig, nodes: Nodes | None = None,
                  cores: int | None = None) -> int:
    """The processes per node of ``config`` (``replicas x stages`` ranks over the nodes), or
    BubblecastError naming the numbers when this machine cannot start them: more than
    :data:`RANKS_PER_CORE` per CPU core (``cores``: default ``os.cpu_count()``)."""
    nodes = nodes or Nodes()
    per_node = nodes.nproc(config.ranks)
    cores = cores or os.cpu_count() or 1
    if per_node > RANKS_PER_CORE * cores:
        what = f"--replicas {config.replicas} x --stages {config.stages} = {config.ranks} ranks"
        where = "" if not nodes.multi else f" ({per_node} per node over {nodes.nnodes} nodes)"
        raise BubblecastError(f"{what}{where}: this machine has {cores} CPU cores, it starts "
                              f"at most {RANKS_PER_CORE * cores} ranks ({RANKS_PER_CORE} per "
                              "core); use fewer replicas or stages")
    return per_node


def torchrun_command(job_dir: str | Path, nproc: int, script: str | None = None,
                     extra: list[str] | None = None, module: str = WORKER,
                     nodes: Nodes | None = None, run_id: str = "bubblecast") -> list[str]:
    """The torchrun command line running ``python -m module JOB_DIR`` on each of this node's
    ``nproc`` ranks (or a ``script`` path with ``extra`` arguments: benchmarks)."""
    target = [script] if script else ["-m", module]
    return [sys.executable, "-m", "torch.distributed.run",
            *(nodes or Nodes()).torchrun_args(nproc, run_id), *target, str(job_dir),
            *(extra or [])]


def worker_env() -> dict[str, str]:
    """Environment for workers: one intra-op thread per rank unless the caller chose."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("PYTHONWARNINGS", "ignore")
    return env


def die_with_parent() -> Callable[[], None] | None:
    """Linux: a function that makes the calling process get SIGKILL when its parent dies
    (``prctl(PR_SET_PDEATHSIG)``), so that a killed command leaves no orphan torchrun or
    rank training on; None elsewhere. libc is loaded here, before any fork."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes
        import signal

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def arm() -> None:
        prctl(1, int(signal.SIGKILL))  # 1: PR_SET_PDEATHSIG

    return arm


def launch(job_dir: str | Path, nproc: int, *, script: str | None = None,
           module: str = WORKER, extra: list[str] | None = None, timeout: float | None = None,
           on_progress: Callable[[int, int, float | None], None] | None = None,
           nodes: Nodes | None = None, run_id: str = "bubblecast") -> int:
    """Run the job (``nproc`` ranks on this node); return torchrun's exit code (124 after
    ``timeout`` seconds, when torchrun and its workers are stopped). Output goes to
    ``job_dir/torchrun.log``."""
    root = Path(job_dir)
    cmd = torchrun_command(root, nproc, script, extra, module, nodes, run_id)
    env = worker_env()
    if timeout is not None:  # collectives give up too, rather than wait for a dead peer
        env.setdefault("BUBBLECAST_DIST_TIMEOUT_S", str(max(10.0, timeout / 2)))
    with open(root / "torchrun.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env,
                                bufsize=1, preexec_fn=die_with_parent())
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


def run_out_job(out: str | Path, config: TrainConfig, *,
                actions: list[dict[str, Any]] | None = None, checkpoints: Any = None,
                module: str = WORKER, extra: dict[str, Any] | None = None,
                on_progress: Callable[[int, int, float | None], None] | None = None,
                timeout: float | None = None, nodes: Nodes | None = None) -> dict[str, Any]:
    """Run a job writing the events file ``out`` in its ``OUT.partial`` folder
    (:class:`~bubblecast.runtime.jobdir.JobDir`); rank 0's summary.

    ``nodes``: default those of :func:`on_nodes` (this machine alone). On several nodes each
    node's command runs its share of the ranks and returns rank 0's summary; ``out`` must be
    the same path on a filesystem every node sees.

    ``checkpoints``: a :class:`~bubblecast.runtime.checkpoint.CheckpointOptions` (save every
    N steps, or resume from the latest checkpoint up to ``config.steps``); ``extra``: more
    job keys for ``module``. BubblecastError before launch for a bad request;
    :class:`~bubblecast.runtime.jobdir.TrainingFailed` (one line naming the rank, the signal
    and the folder keeping the telemetry so far) when training fails or is interrupted.
    """
    from dataclasses import asdict

    from bubblecast.runtime.jobdir import JobDir

    nodes = nodes or _NODES.get() or Nodes()
    nproc = check_machine(config, nodes)
    if nodes.multi and checkpoints is not None:
        raise BubblecastError("--checkpoint-dir: checkpoints are not supported with --nnodes > 1")
    resume, start, at = (checkpoints.resolve(asdict(config.model), config.steps)
                         if checkpoints is not None else (None, 0, {}))
    out = Path(out)
    node = f"{socket.gethostname()}-{os.getpid()}" if nodes.multi else None
    jobs, ok = JobDir(out, resuming=resume is not None, node=node).open(), False
    try:
        origin = jobs.origin() if resume is not None and jobs.carry(start, config.run_id) else None
        path = write_job(jobs.root, config, out=str(out.resolve()), actions=actions,
                         progress=True, checkpoint_at=at, resume=resume)
        job = json.loads(path.read_text())
        job.update(parts=os.path.relpath(jobs.parts, jobs.root),
                   until=config.steps if resume else None,
                   origin_wall=origin, **(extra or {}))
        path.write_text(json.dumps(job, indent=1))
        with _sigterm_interrupts():
            code = launch(jobs.root, nproc, module=module, on_progress=on_progress,
                          timeout=timeout, nodes=nodes, run_id=config.run_id)
        # rank 0 writes it after every rank's last collective (multi-node: maybe elsewhere)
        done = jobs.summary(SUMMARY_WAIT_S if nodes.multi and code == 0 else 0.0)
        if code != 0 and not (done is not None and out.exists()):
            raise jobs.failed("training " + (f"timed out after {timeout:g} s" if code == 124
                                             and timeout else
                                             f"failed: {failure_message(jobs.root, code)}"))
        if code != 0:
            print(f"bubblecast: warning: {failure_message(jobs.root, code)} after training "
                  f"finished and {out} was written (ignored)", file=sys.stderr)
        if done is None:
            raise jobs.failed(f"rank 0's summary did not appear in {jobs.shared} within "
                              f"{SUMMARY_WAIT_S:g} s of this node's ranks finishing")
        summary = json.loads(done.read_text())
        ok = True
    except KeyboardInterrupt as exc:
        by = str(exc.args[0]) if exc.args else ""
        raise jobs.failed(f"interrupted by {by}" if by else "interrupted",
                          143 if by == "SIGTERM" else 130) from None
    finally:
        jobs.close(ok)  # keeps the telemetry unless it is merged into out
    return summary


@contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """In the main thread, SIGTERM raises ``KeyboardInterrupt("SIGTERM")`` until the block
    ends: torchrun is stopped and the telemetry kept and named, as after Ctrl-C."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def signal_name(code: int) -> str:
    """``-9`` -> ``SIGKILL``: the signal behind a negative exit code."""
    import signal

    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


_FAILURE = re.compile(r"^\s*rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)", re.MULTILINE)


def rank_exits(log_text: str) -> list[tuple[int, int]]:
    """(rank, exit code) of each failed rank in torchrun's error summary, root cause first."""
    found = [(int(r), int(c)) for r, c in _FAILURE.findall(log_text)]
    root = log_text.rfind("Root Cause")
    if root >= 0:
        first = [(int(r), int(c)) for r, c in _FAILURE.findall(log_text[root:])][:1]
        found = first + [f for f in found if f not in first]
    return found


def failure_message(job_dir: str | Path, code: int | None = None) -> str:
    """One line saying why a job failed, naming the rank and the signal.

    In order: torchrun itself killed by a signal (``code`` < 0, launch's exit code); a rank
    killed by a signal (torchrun's summary: a negative exit code); the first rank's error (the
    earliest ``error-rank*.txt``: the others are usually its consequence); a rank's exit code;
    torchrun's last line."""
    root = Path(job_dir)
    if code is not None and code < 0:
        return f"torchrun was killed by {signal_name(code)}"
    log = root / "torchrun.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    exits = rank_exits(text)
    for rank, rc in exits:
        if rc < 0:
            return f"rank {rank} was killed by {signal_name(rc)}"
    errors = sorted(root.glob("error-rank*.txt"), key=lambda p: (p.stat().st_mtime_ns, p.name))
    for err in errors:
        first = err.read_text().strip().splitlines()
        if first:
            return f"rank {err.stem.removeprefix('error-rank')}: {first[0]}"
    if exits:
        return f"rank {exits[0][0]} exited with code {exits[0][1]}"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip().strip("=-")]
    return lines[-1] if lines else "torchrun failed without output"
