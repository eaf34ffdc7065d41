"""``bubblecast serve --workers 2``: two processes share the port, each answers forecasts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.helpers import free_port
from tests.serve.conftest import ROOT
from tests.serve.test_serve_cli import ewma_dir  # noqa: F401 - the fixture


def _children(pid: int) -> set[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True,
                         text=True).stdout
    return {int(x) for x in out.split()}


def test_two_workers_serve_and_stop(ewma_dir):  # noqa: F811 - the fixture
    port = free_port()
    cmd = [sys.executable, "-c", "from bubblecast.cli import main; main()", "serve", "--model",
           str(ewma_dir), "--port", str(port), "--watch-interval", "0", "--workers", "2"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    req = {"pipeline": {"stages": 2, "microbatches": 4}, "horizons": [1],
           "ranks": [{"rank": s, "stage": s, "compute_s": [1.0 + s] * 64} for s in range(2)]}
    try:
        ok = 0
        for _ in range(1200):
            if proc.poll() is not None:
                pytest.fail(proc.stderr.read().decode())
            try:  # a new connection each time, so both workers get asked
                with httpx.Client(trust_env=False, timeout=5) as http:
                    r = http.post(f"http://127.0.0.1:{port}/v1/forecast", json=req)
                ok = ok + 1 if r.status_code == 200 else 0
            except httpx.HTTPError:
                ok = 0
            if ok >= 20:
                break
            time.sleep(0.05)
        assert ok >= 20
        assert r.json()["model"]["name"] == "ewma"
        workers = [c for c in _children(proc.pid)
                   if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]
        assert len(workers) == 2
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=30) is not None
        proc.stderr.close()
