"""Strict JSON values: the one cleaner behind the CLI's ``--json`` output and the demo's files.

Standard library only. The CLI imports it inside :func:`bubblecast.cli.common.emit_json`
(importing :mod:`bubblecast.telemetry` loads pandas, which ``bubblecast --help`` must not).
"""

from __future__ import annotations

import math
from pathlib import PurePath
from typing import Any


def plain(obj: Any) -> Any:
    """``obj`` as strict JSON values: dict keys as strings, tuples as lists, numpy scalars
    unwrapped (``.item()``), paths as strings, NaN and inf as None; anything else as is."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    if isinstance(obj, PurePath):
        return str(obj)
    return plain(obj.item()) if hasattr(obj, "item") else obj
