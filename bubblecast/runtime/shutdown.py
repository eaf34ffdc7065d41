"""Ending a torch.distributed worker process without racing gloo's worker threads.

gloo runs collectives on its own threads (``pt_gloo_runloop``), and a thread drops its
reference to a finished collective *after* the waiting Python thread has moved on. When that
collective's tensors belong to Python objects (``all_gather_object`` and friends) and the
interpreter has begun finalizing by then, the thread cannot take the GIL to release them and
the process aborts (``terminate called without an active exception``, SIGABRT); a loaded
machine makes this more likely (2 of 13 two-rank test jobs beside two busy loops).
``destroy_process_group`` does not join those threads. Processes that bubblecast starts
under torchrun (its workers, its benchmark and test jobs) have written and closed everything
when they end, so they skip interpreter finalization with :func:`exit_process`.
No torch import here.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import NoReturn


def exit_process(code: int | str | None = 0) -> NoReturn:
    """Flush stdout and stderr, then end the process at once with ``code`` (as
    :func:`sys.exit` reads it: None is 0, a string is printed to stderr and means 1)."""
    if isinstance(code, str):
        print(code, file=sys.stderr)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed or broken: nothing to say
            stream.flush()
    os._exit(0 if code is None else int(code))
