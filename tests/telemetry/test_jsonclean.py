"""The one JSON cleaner of the CLI's --json output and the demo's files (telemetry.jsonclean)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from bubblecast.cli.common import emit_json
from bubblecast.telemetry.jsonclean import plain


def _sample() -> dict:
    return {1: np.float64(0.5), "nan": float("nan"), "inf": np.float32("inf"),
            "ints": (np.int64(3), 4), "nested": [{"x": -math.inf}, np.bool_(True)],
            "path": Path("a/b.json"), "s": "text", "none": None}


def test_plain_gives_strict_json_values():
    out = plain(_sample())
    assert out == {"1": 0.5, "nan": None, "inf": None, "ints": [3, 4],
                   "nested": [{"x": None}, True], "path": "a/b.json", "s": "text",
                   "none": None}
    assert type(out["ints"][0]) is int and type(out["nested"][1]) is bool
    json.dumps(out, allow_nan=False)  # strict: would raise on NaN or a numpy type


def test_cli_writes_the_plain_values(capsys):
    emit_json(_sample())
    assert json.loads(capsys.readouterr().out) == plain(_sample())
