"""A CLI that starts fast: each analysis command, run in a fresh interpreter, imports only what
it uses (issue 26 item 2). The modules are listed from ``sys.modules`` after the command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TRACE = REPO / "data" / "megatron-ops" / "trace-ST.parquet"
#: Heavy packages no analysis command needs (pydantic: typer's adapters, which the CLI's
#: plain parameter conversion replaces; scipy comes with scikit-learn).
FORBIDDEN = ("mlflow", "torch", "lightgbm", "sklearn", "scipy", "matplotlib", "fastapi",
             "starlette", "uvicorn", "dask", "distributed", "pydantic")

_RUN = """
import json, sys
from bubblecast.cli import main
code = main(sys.argv[1:])
sys.stdout.flush()
print("\\n" + json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


def modules_of(*argv: str) -> set[str]:
    """Top-level packages imported by ``bubblecast ARGV`` in a new interpreter (exit 0)."""
    done = subprocess.run([sys.executable, "-c", _RUN, *argv], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["code"] == 0, done.stderr[-2000:]
    return {name.split(".")[0] for name in result["modules"]}


@pytest.mark.parametrize("argv", [
    ["inspect", str(TRACE), "--json"],
    ["inspect", str(TRACE)],
    ["whatif", str(TRACE), "--json"],
    ["simulate", "--schedule", "1f1b", "--stages", "4", "--microbatches", "4", "--steps", "3",
     "--json", "--out", "{tmp}/sim.parquet"],
], ids=["inspect-json", "inspect", "whatif", "simulate"])
def test_analysis_commands_import_no_heavy_package(argv, tmp_path):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    found = modules_of(*argv) & set(FORBIDDEN)
    assert not found, f"bubblecast {argv[0]} imported {sorted(found)}"


@pytest.mark.parametrize("argv", [["--help"], ["simulate", "--help"], ["whatif", "--help"]])
def test_help_imports_no_pandas(argv):
    """No frame, no pandas: the help answers from typer alone."""
    found = modules_of(*argv) & {"pandas", "pyarrow", *FORBIDDEN}
    assert not found, f"bubblecast {' '.join(argv)} imported {sorted(found)}"


@pytest.mark.parametrize("out", ["sim.parquet", "fleet/"])
def test_simulate_imports_no_pandas(out, tmp_path):
    """simulate writes its events from numpy arrays (a file, or a fleet a run at a time):
    no frame, no pandas (~0.15 s of its start-up)."""
    found = modules_of("simulate", "--schedule", "zb-h1", "--stages", "4", "--microbatches",
                       "8", "--steps", "5", "--runs", "2", "--scenario", "jitter", "--json",
                       "--out", f"{tmp_path}/{out}")
    assert "pandas" not in found
    assert "pyarrow" in found  # the Parquet writer


def test_inspect_with_plot_loads_matplotlib_only_then(tmp_path):
    """The one analysis option that needs a heavy package loads it (and nothing else heavy)."""
    found = modules_of("inspect", str(TRACE), "--json", "--plot", str(tmp_path / "p.png"))
    assert "matplotlib" in found
    assert not found & (set(FORBIDDEN) - {"matplotlib"})


def test_one_command_registered_first_keeps_the_help_order(capsys):
    """A command run registers only its own module; a later full help lists every command in
    the usual order."""
    from bubblecast.cli import COMMAND_OF, main

    assert main(["whatif", "--help"]) == 0
    capsys.readouterr()
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    listed = [line.split()[0] for line in out.split("Commands:")[1].splitlines() if line.strip()]
    assert listed == list(COMMAND_OF)


@pytest.mark.parametrize(("option", "value", "message"), [
    ("--stages", "x", "Input should be a valid integer"),
    ("--comm", "fast", "Input should be a valid number"),
])
def test_plain_parameter_conversion_keeps_typer_messages(option, value, message, tmp_path,
                                                         capsys):
    from bubblecast.cli import main

    argv = ["simulate", "--schedule", "1f1b", "--microbatches", "2", "--out",
            str(tmp_path / "s.parquet")]
    if option != "--stages":
        argv += ["--stages", "2"]
    assert main([*argv, option, value]) == 2
    err = capsys.readouterr().err
    assert f"Invalid value for '{option}': {message}" in err
    assert not (tmp_path / "s.parquet").exists()


def test_console_entry_quick_exit_keeps_output_and_codes(tmp_path):
    """The console entry ends inspect/whatif/simulate without the interpreter's teardown:
    the JSON is whole, files are written, and errors keep exit 2."""
    exe = Path(sys.executable).parent / "bubblecast"
    if not exe.exists():
        pytest.skip("no console script in this environment")
    done = subprocess.run([str(exe), "whatif", str(TRACE), "--json"], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and json.loads(done.stdout)["replayed_step_s"] > 0
    out = tmp_path / "s.parquet"
    done = subprocess.run([str(exe), "simulate", "--schedule", "1f1b", "--stages", "2",
                           "--microbatches", "2", "--steps", "3", "--out", str(out), "--json"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and json.loads(done.stdout)["events"] == 24
    from bubblecast.telemetry.io import read_events

    assert len(read_events(out)) == 24
    done = subprocess.run([str(exe), "inspect", str(tmp_path / "missing.parquet")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "no such file" in done.stderr
