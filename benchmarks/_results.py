"""The header every benchmark's JSON starts with, and its atomic write (one place for both)."""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

from bubblecast.telemetry.io import atomic_write_text


def run_header(name: str, argv: list[str] | None = None, script: str | None = None,
               **extra: Any) -> dict[str, Any]:
    """``benchmark``, ``machine``, ``cpus``, then ``extra``, then the ``command`` that ran
    (``script``, default ``bench_{name}.py``, with ``argv``, default the process's)."""
    args = sys.argv[1:] if argv is None else argv
    return {"benchmark": name, "machine": platform.platform(), "cpus": os.cpu_count(), **extra,
            "command": f"python benchmarks/{script or f'bench_{name}.py'} " + " ".join(args)}


def write_json(path: str | Path, doc: dict[str, Any]) -> None:
    """Write ``doc`` atomically (floats of numpy types included) and say where."""
    atomic_write_text(path, json.dumps(doc, indent=1, default=float))
    print(f"wrote {path}")
