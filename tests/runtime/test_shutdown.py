"""``exit_process``: the way bubblecast's torchrun workers end (no interpreter finalization,
which races gloo's collective threads; see :mod:`bubblecast.runtime.shutdown`)."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(("code", "status", "err"), [("0", 0, ""), ("3", 3, ""),
                                                      ("None", 0, ""), ("'bad job'", 1, "bad job")])
def test_exit_process_flushes_and_ends_with_the_code(code: str, status: int, err: str) -> None:
    script = ("import atexit, sys\n"
              "from bubblecast.runtime.shutdown import exit_process\n"
              "atexit.register(lambda: print('finalized'))\n"
              "sys.stdout.write('buffered')\n"
              f"exit_process({code})\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == status
    assert done.stdout == "buffered"  # flushed, and no atexit handler ran (no finalization)
    assert done.stderr.strip() == err
