"""bubblecast installed from a wheel works outside the repository (tools/check_wheel.py).

The fast tests check the sample lookup (``bubblecast.app.demo.sample_path``) and that the
wheel carries the files it finds; the slow one runs the whole check: build, install into a
fresh venv, ``bubblecast demo --quick`` from an empty folder, every stage a success and the
real-trace stage on the wheel's own copy of the trace.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import zipfile
from pathlib import Path

import pytest

from bubblecast.app.demo import TRACE, default_megatron, sample_path

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "check_wheel.py"


def _tool():
    spec = importlib.util.spec_from_file_location("check_wheel", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_wheel"] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_sample_path_finds_the_package_copy_from_an_empty_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    trace = sample_path(TRACE)
    assert trace is not None and trace.is_file()
    assert _digest(trace) == _digest(ROOT / "data" / "megatron-ops" / "trace-ST.parquet")
    assert default_megatron() == str(trace)
    model = sample_path("models/default")
    assert model is not None and (model / "model.json").is_file()
    assert sample_path("data/no-such-file.parquet") is None


def test_sample_path_prefers_the_working_directory(tmp_path, monkeypatch):
    mine = tmp_path / TRACE
    mine.parent.mkdir(parents=True)
    mine.write_bytes(b"not a trace")
    monkeypatch.chdir(tmp_path)
    assert sample_path(TRACE) == mine.resolve()
    assert default_megatron() == str(mine.resolve())


def test_wheel_carries_the_trace_and_the_default_model(tmp_path):
    wheel = _tool().build_wheel(tmp_path, "build")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        bundled = {n.split("bubblecast/_bundled/", 1)[1] for n in names if "/_bundled/" in n}
        trace = archive.read("bubblecast/_bundled/data/megatron-ops/trace-ST.parquet")
    expected = {f"data/megatron-ops/{p.name}" for p in (ROOT / "data" / "megatron-ops").iterdir()}
    expected |= {f"models/default/{p.name}" for p in (ROOT / "models" / "default").iterdir()}
    assert bundled == expected
    assert hashlib.sha256(trace).hexdigest() == _digest(ROOT / TRACE)
    assert "bubblecast/forecast/pyfunc_model.py" in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


@pytest.mark.slow
def test_quick_demo_runs_from_an_installed_wheel(tmp_path):
    tool = _tool()
    result = tool.check_wheel(tmp_path)
    print(result.table())
    assert result.ok, result.table()
    stages = [s.name for s in result.steps if s.name.startswith("demo: ")]
    assert stages == [f"demo: {name}" for name in ("simulate", "dataset", "train",
                                                   "forecast_eval", "policy_eval", "megatron",
                                                   "live")]
    assert result.demo is not None and result.demo["stages"]["live"]["closed_loop"] is True
