"""Fixtures: a TestClient over a fake model, and a real uvicorn server in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

with warnings.catch_warnings():  # starlette's TestClient nags about httpx2; httpx is what we have
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from tests.helpers import free_port
from tests.serve.fakes import ScaledLast, write_model_dir

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def fake_server(model_dir: Path, *, token: str | None = None, watch: float | None = None,
                ready_timeout: float = 60.0) -> Iterator[tuple[int, subprocess.Popen]]:
    """Start ``tests.serve.serve_fake`` on a free loopback port; kill it on exit."""
    port = free_port()
    cmd = [sys.executable, "-m", "tests.serve.serve_fake", "--dir", str(model_dir),
           "--port", str(port)]
    if token:
        cmd += ["--token", token]
    if watch:
        cmd += ["--watch", str(watch)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + ready_timeout
        with httpx.Client(trust_env=False) as http:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"server exited: {proc.stderr.read().decode()[-2000:]}")
                try:
                    if http.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("server did not become ready")
                time.sleep(0.1)
        yield port, proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        if proc.stderr is not None:
            proc.stderr.close()


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    return write_model_dir(tmp_path / "model", scale=1.0)


@pytest.fixture
def predictor():
    from bubblecast.forecast.served import ModelInfo
    from bubblecast.serve.predictor import Predictor

    return Predictor(ScaledLast(), ModelInfo(name="fake", version="1", source="memory"))


@pytest.fixture
def client(predictor):
    from bubblecast.serve.app import create_app

    with TestClient(create_app(predictor)) as c:
        yield c


@contextmanager
def app_server(app, ready_timeout: float = 30.0) -> Iterator[int]:
    """Serve ``app`` with uvicorn on a free loopback port in a thread of this process."""
    import threading

    import uvicorn

    config = uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning",
                            access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="test-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + ready_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield config.port
    finally:
        server.should_exit = True
        thread.join(timeout=10)
