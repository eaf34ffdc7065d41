"""Reading Chrome-trace JSON files (optionally gzipped): whole, or their first bytes for detection.

Shared by the Kineto and Megatron-timeline importers. Errors name the file and the reason in one
line.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from pathlib import Path
from typing import Any

from bubblecast.errors import BubblecastError

_RANK_IN_NAME = re.compile(r"rank[_\-.]?(\d+)", re.IGNORECASE)


def is_gzip(path: Path) -> bool:
    """True when ``path`` starts with the gzip magic bytes."""
    with path.open("rb") as fh:
        return fh.read(2) == b"\x1f\x8b"


def read_prefix(path: Path, size: int) -> bytes:
    """Up to ``size`` bytes of the (decompressed) content of ``path``; ``b''`` if unreadable."""
    try:
        if is_gzip(path):
            with gzip.open(path, "rb") as fh:
                return fh.read(size)
        with path.open("rb") as fh:
            return fh.read(size)
    except (OSError, EOFError, zlib.error):
        return b""


def trace_files(path: Path) -> list[Path]:
    """The trace files behind ``path``: the file itself, or ``*.json[.gz]`` in a directory."""
    if not path.exists():
        raise BubblecastError(f"{path}: no such file or directory")
    if path.is_file():
        return [path]
    found = [f for pattern in ("*.json", "*.json.gz") for f in path.glob(pattern)]
    files = sorted(f for f in found if f.is_file() and not f.name.startswith("."))
    if not files:
        raise BubblecastError(f"{path}: directory holds no .json or .json.gz trace files")
    return files


def load_trace(path: Path) -> dict[str, Any]:
    """The trace as a dict with a ``traceEvents`` list (the bare-array flavour is wrapped)."""
    try:
        opener = gzip.open if is_gzip(path) else open
        with opener(path, "rt", encoding="utf-8") as fh:
            trace = json.load(fh)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, EOFError, zlib.error) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise BubblecastError(f"{path}: not a readable Chrome trace JSON ({reason})") from None
    if isinstance(trace, list):  # the bare-array flavour of the Chrome trace format
        trace = {"traceEvents": trace}
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise BubblecastError(f"{path}: not a Chrome trace (no 'traceEvents' list)")
    return trace


def rank_of(trace: dict[str, Any], path: Path) -> tuple[int, bool]:
    """(rank, from_distributed_info): ``distributedInfo.rank``, else one number in the name."""
    info = trace.get("distributedInfo")
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        return int(info["rank"]), True
    name = path.name.split(".json")[0]
    numbers = re.findall(r"\d+", name)
    match = _RANK_IN_NAME.search(name)
    if match is None and len(numbers) != 1:  # a pid or timestamp is no rank: refuse to guess
        raise BubblecastError(f"{path}: no 'distributedInfo.rank' and no rank number in the name")
    return int(match.group(1) if match else numbers[0]), False


__all__ = ["is_gzip", "load_trace", "rank_of", "read_prefix", "trace_files"]
