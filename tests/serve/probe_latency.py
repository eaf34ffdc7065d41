"""Probe latency during a heavy recommend (README "Reliability"; not a test: no timing is
asserted anywhere in the suite). ``python -m tests.serve.probe_latency [--rounds 10]``.

Starts ``tests.serve.serve_fake`` in another process, sends the 13 KiB recommend of issue 16
(8 stages, 1,024 layers, 1,024 microbatches) and, 80 ms into each, one ``GET /healthz``;
prints the medians and maxima of both.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from tests.helpers import free_port
from tests.serve.conftest import ROOT
from tests.serve.fakes import recommend_request, write_model_dir


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = write_model_dir(Path(tmp) / "m")
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "tests.serve.serve_fake", "--dir", str(d),
                                 "--port", str(port)], cwd=ROOT,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(600):
                try:
                    if httpx.get(f"{url}/readyz").status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.1)
            req = recommend_request(stages=8, layers_per_stage=128, steps=100, microbatches=1024)
            body = json.dumps(req).encode()
            hdr = {"content-type": "application/json"}
            httpx.post(f"{url}/v1/recommend", content=body, headers=hdr, timeout=60)
            rec: list[float] = []
            probe: list[float] = []

            def post() -> None:
                t = time.perf_counter()
                httpx.post(f"{url}/v1/recommend", content=body, headers=hdr, timeout=60)
                rec.append(time.perf_counter() - t)

            for _ in range(args.rounds):
                worker = threading.Thread(target=post)
                worker.start()
                time.sleep(0.08)
                t = time.perf_counter()
                httpx.get(f"{url}/healthz", timeout=60)
                probe.append(time.perf_counter() - t)
                worker.join()
        finally:
            proc.kill()
            proc.wait()
    rec.sort()
    probe.sort()
    mid = len(rec) // 2
    print(f"{len(body)} B recommend: median {1000 * rec[mid]:.0f} ms (max {1000 * rec[-1]:.0f}); "
          f"/healthz 80 ms into it: median {1000 * probe[mid]:.0f} ms "
          f"(max {1000 * probe[-1]:.0f})")


if __name__ == "__main__":
    main()
