"""``bubblecast serve``: one-line errors for bad options, and a real server end to end."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest

from bubblecast.cli import main
from bubblecast.serve.client import Client
from tests.serve.conftest import ROOT, free_port


def _one_line_error(capsys, code: int) -> str:
    captured = capsys.readouterr()
    assert code == 2, captured
    assert captured.err.startswith("bubblecast: error:") and captured.err.count("\n") == 1
    assert "Traceback" not in captured.err
    return captured.err


def test_missing_model_directory(tmp_path, capsys):
    err = _one_line_error(capsys, main(["serve", "--model", str(tmp_path / "none")]))
    assert "not a model directory" in err


def test_corrupt_model_directory(tmp_path, capsys):
    (tmp_path / "model.json").write_text("{")
    err = _one_line_error(capsys, main(["serve", "--model", str(tmp_path)]))
    assert str(tmp_path) in err


def test_missing_token_file(tmp_path, capsys):
    err = _one_line_error(capsys, main(["serve", "--model", str(tmp_path), "--token-file",
                                        str(tmp_path / "token")]))
    assert "--token-file" in err


@pytest.fixture(scope="module")
def ewma_dir(tmp_path_factory):
    from bubblecast.forecast.baselines import EWMA
    from bubblecast.forecast.modeldir import save_model
    from tests.serve.test_adapters import features_of, run_window

    frame = features_of([run_window(seed, steps=90) for seed in range(3)])
    return save_model(EWMA().fit(frame), tmp_path_factory.mktemp("m") / "ewma",
                      metrics={"h1": {"mae": 0.5}})


def test_busy_port_exits_2_before_printing_anything(ewma_dir, capsys):
    """Before: 'serving ...' was printed, then uvicorn failed to bind and the command exited
    3. Now the port is bound first: one error line, exit 2."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        err = _one_line_error(capsys, main(["serve", "--model", str(ewma_dir),
                                            "--port", str(port)]))
    assert f"--port {port}: cannot listen on 127.0.0.1:{port}" in err
    assert "serving" not in err


def test_unknown_host_exits_2(ewma_dir, capsys):
    err = _one_line_error(capsys, main(["serve", "--model", str(ewma_dir), "--host",
                                        "no-such-host.invalid", "--port", "0"]))
    assert "--host no-such-host.invalid: unknown address" in err


def test_serve_command_end_to_end(ewma_dir, tmp_path):
    token = tmp_path / "token"
    token.write_text("sekrit\n")
    port = free_port()
    cmd = [sys.executable, "-c", "from bubblecast.cli import main; main()", "serve", "--model",
           str(ewma_dir), "--port", str(port), "--token-file", str(token)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url, trust_env=False, timeout=2) as http:
            for _ in range(600):
                if proc.poll() is not None:
                    pytest.fail(proc.stderr.read().decode())
                try:
                    if http.get("/readyz").status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.1)
            info = http.get("/v1/model", headers={"Authorization": "Bearer sekrit"}).json()
            assert info["name"] == "ewma" and info["metrics"] == {"h1": {"mae": 0.5}}
            assert info["min_window"] == 60 and info["horizons"] == [1, 5, 10]
            assert info["feature_path"] == "numpy"
            assert http.get("/v1/model").status_code == 401
        steps = 64
        req = {"pipeline": {"stages": 2, "microbatches": 4}, "horizons": [1, 10],
               "ranks": [{"rank": s, "stage": s, "compute_s": [1.0 + s] * steps}
                         for s in range(2)]}
        with Client(url, timeout=5.0, token_file=token) as c:
            out = c.forecast(req)
        assert out is not None and out.model.name == "ewma"
        p50 = np.array([r.p50 for r in out.ranks])
        np.testing.assert_allclose(p50, [[1.0, 1.0], [2.0, 2.0]], rtol=1e-3)  # flat history
    finally:
        proc.kill()
        proc.wait(timeout=10)
        proc.stderr.close()
