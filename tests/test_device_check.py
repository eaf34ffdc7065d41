"""The GPU check stays ready: its CPU dry run passes, without the packages a bare GPU image lacks.

``benchmarks/device_check.py`` runs on a lent GPU machine under that machine's own Python,
with this repository on ``PYTHONPATH`` and LightGBM carried as a wheel; its image had no
MLflow, FastAPI, uvicorn, DuckDB, polars or Dask (read 2026-11-17). The dry run (``--cpu``)
takes the same code path at toy sizes with those packages made unimportable, so a change that
breaks the check, or makes it need one of them, fails here rather than on the GPU machine's
few minutes. Slow (about 70 s): ``make test-all`` and ``make bench`` run it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ABSENT_ON_GPU_IMAGE = ("mlflow", "fastapi", "uvicorn", "duckdb", "polars", "dask",
                       "distributed")
RUNNER = f"""
import runpy, sys
for name in {ABSENT_ON_GPU_IMAGE!r}:
    sys.modules[name] = None  # import raises ImportError, as where it is not installed
sys.argv = ["benchmarks/device_check.py", "--cpu", "--packed-steps", "26"]
runpy.run_path("benchmarks/device_check.py", run_name="__main__")
"""


@pytest.mark.slow
def test_device_check_dry_run_passes_without_the_packages_the_gpu_image_lacks() -> None:
    done = subprocess.run([sys.executable, "-c", RUNNER], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    for section in ("(0) NVML", "(i) 4 x matmul", "(ii) 8 x (Linear", "(iii) packed GPT"):
        assert section in out, out[-3000:]
    assert "cost model (" in out and "floor under any model's p90" in out
    assert "covariate features on" in out and "none" not in out.split("covariate features")[1]
