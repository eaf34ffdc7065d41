"""Load events from any supported format, detecting it by content when asked (``auto``)."""

from __future__ import annotations

from pathlib import Path

from bubblecast.errors import BubblecastError
from bubblecast.telemetry.events import Events

FORMATS: tuple[str, ...] = ("auto", "bubblecast", "megatron-ops", "kineto")


def detect_format(path: str | Path) -> str:
    """Name the format of ``path`` from its content; raise naming the formats tried."""
    p = Path(path)
    tried = "tried bubblecast, megatron-ops, kineto"
    if not p.exists():
        raise BubblecastError(f"{p}: no such file or directory")
    if p.is_dir():
        parquet = sorted(f for f in p.rglob("*.parquet") if f.is_file())
        if parquet:
            fmt = detect_format(parquet[0])
            if fmt != "bubblecast":
                raise BubblecastError(f"{p}: a directory of {fmt} files; pass one file at a time")
            return fmt
        if any(p.glob("*.json")) or any(p.glob("*.json.gz")):
            return "kineto"
        raise BubblecastError(f"{p}: cannot detect the format ({tried})")
    if p.suffix in (".gz", ".json"):
        return "kineto"
    try:
        import pyarrow.parquet as pq

        names = pq.read_schema(p).names
    except Exception:
        raise BubblecastError(f"{p}: cannot detect the format: not Parquet or trace JSON "
                              f"({tried})") from None
    from bubblecast.telemetry.importers import megatron

    if {"op", "duration_s", "start_s"} <= set(names):
        return "bubblecast"
    if megatron.looks_like(names):
        return "megatron-ops"
    raise BubblecastError(f"{p}: cannot detect the format: columns {names[:8]} match none "
                          f"({tried})")


def load_events(path: str | Path, format: str = "auto") -> Events:
    """Read ``path`` in ``format`` (``auto`` detects it) as validated events."""
    if format not in FORMATS:
        raise BubblecastError(f"unknown format '{format}' (choose from {', '.join(FORMATS)})")
    fmt = detect_format(path) if format == "auto" else format
    if fmt == "bubblecast":
        from bubblecast.telemetry.io import read_events

        return read_events(path)
    if fmt == "megatron-ops":
        from bubblecast.telemetry.importers.megatron import read_megatron

        return read_megatron(path)
    from bubblecast.telemetry.importers.kineto import read_kineto

    return read_kineto(path)
