"""Worker processes beside the training process: spawned, at low CPU priority, stopped politely.

The live planner (:mod:`bubblecast.runtime.plan_worker`) and rank 0's decider
(:mod:`bubblecast.runtime.control.decision_process`) each run their work in one child process
that talks to the training process over a pipe, as a data loader's worker process does:

- :func:`start_child` spawns it (the ``spawn`` start method: nothing of the training process's
  threads or process groups is inherited) as a daemon, ``target(conn, *args)`` on its end of
  the pipe;
- :func:`lower_priority` is the child's first call: the lowest CPU priority, so that where
  cores are scarce it works in the pipeline's idle time rather than taking a core from a
  training rank (best effort: it works either way);
- :func:`exit_reason` says why a child that is gone can work no more;
- :func:`stop_child` asks it to exit (``None`` down the pipe), then terminates it.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from collections.abc import Callable
from typing import Any

__all__ = ["WORKER_NICE", "exit_reason", "lower_priority", "start_child", "stop_child"]

#: A worker process's CPU priority (``os.nice`` increment; 19 is the lowest).
WORKER_NICE = 19


def start_child(target: Callable[..., None], args: tuple[Any, ...], name: str
                ) -> tuple[Any, Any]:
    """Spawn ``target(their_conn, *args)`` as a daemon process; ``(our_conn, process)``."""
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    proc = ctx.Process(target=target, args=(theirs, *args), name=name, daemon=True)
    proc.start()
    theirs.close()
    return ours, proc


def lower_priority(nice: int) -> None:
    """In the child: raise its nice value by ``nice`` (0: leave it), ignoring refusals."""
    if nice:
        with contextlib.suppress(OSError):
            os.nice(nice)


def exit_reason(proc: Any, what: str) -> str | None:
    """Why the ``what`` child can work no more (``"the planner process exited (exit code
    -9)"``), None while it runs."""
    code = proc.exitcode
    return None if code is None else f"the {what} process exited (exit code {code})"


def stop_child(conn: Any, proc: Any, timeout_s: float = 5.0) -> None:
    """Ask the child to exit, wait ``timeout_s``, terminate it if it has not; close the pipe."""
    with contextlib.suppress(OSError):
        conn.send(None)
    proc.join(timeout=timeout_s)
    if proc.is_alive():
        proc.terminate()
        proc.join(timeout=timeout_s)
    conn.close()
