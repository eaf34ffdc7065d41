"""Command-line basics: help, version, SPEC §3 error contract, lazy heavy imports."""

from __future__ import annotations

import json
import subprocess
import sys

from bubblecast import __version__
from bubblecast.cli import main


def test_help_does_not_import_heavy_libraries():
    code = ("import sys; from bubblecast.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "heavy = [m for m in ('torch', 'mlflow', 'lightgbm', 'sklearn', 'pandas',"
            " 'matplotlib') if m in sys.modules]\nprint('HEAVY', heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "HEAVY []" in out.stdout


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"bubblecast {__version__}"


def test_usage_errors_exit_2_with_one_line(capsys):
    assert main(["inspect", "--no-such-option"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bubblecast: error:") and err.count("\n") == 1


def test_missing_file_exits_2_without_traceback(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "missing.parquet"), "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "Traceback" not in captured.err and captured.err.count("\n") == 1


def test_unknown_format_names_the_choices(megatron_trace, capsys):
    assert main(["inspect", str(megatron_trace), "--format", "csv"]) == 2
    assert "auto, bubblecast, megatron-ops, kineto" in capsys.readouterr().err


def test_inspect_json_on_the_real_trace(megatron_trace, capsys):
    assert main(["inspect", str(megatron_trace), "--format", "megatron-ops", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["stages"], out["replicas"], out["steps"]) == (4, 2, 32)
    busy = {row["stage"]: row["busy_s"] for row in out["per_stage"]}
    assert 1.5 < busy[3] / ((busy[0] + busy[1] + busy[2]) / 3) < 1.7


def test_format_option_lists_exactly_the_importers_formats():
    from bubblecast.cli.common import FORMAT_CHOICES
    from bubblecast.telemetry.importers import FORMATS

    assert FORMAT_CHOICES == FORMATS
