"""Load events from any supported format, detecting it by content when asked (``auto``).

Formats (SPEC §3): ``bubblecast`` and ``megatron-ops`` (Parquet), ``kineto`` and
``megatron-timeline`` (Chrome-trace JSON, optionally gzipped), ``megatron-log`` and
``deepspeed-log`` (training-log text, granularity ``step``). Every importer of an external
format clamps clock jitter (negative durations down to -1 ms) to 0 and counts it in the run
metadata (:mod:`~bubblecast.telemetry.importers.fixes`); ``bubblecast`` events stay strict.
"""

from __future__ import annotations

import re
from pathlib import Path

from bubblecast.errors import BubblecastError
from bubblecast.telemetry.events import Events

FORMATS: tuple[str, ...] = (
    "auto", "bubblecast", "megatron-ops", "kineto", "megatron-timeline", "megatron-log",
    "deepspeed-log",
)  # fmt: skip
_TRIED = "tried " + ", ".join(FORMATS[1:])
#: What to give a command that needs per-op order instead of a step-granularity log.
PER_OP_INPUTS = ("a per-op trace: bubblecast events, a megatron-ops Parquet, a Megatron "
                 "timeline (megatron-timeline) or PyTorch profiler traces with PP: labels "
                 "(kineto)")


def _detect_trace(p: Path) -> str:
    from bubblecast.telemetry.importers import megatron_timeline

    return "megatron-timeline" if megatron_timeline.looks_like(p) else "kineto"


def _detect_dir(p: Path) -> str:
    parquet = sorted(f for f in p.rglob("*.parquet") if f.is_file()  # hidden: temporaries
                     and not any(x.startswith(".") for x in f.relative_to(p).parts))
    if parquet:
        fmt = detect_format(parquet[0])
        if fmt != "bubblecast":
            raise BubblecastError(f"{p}: a directory of {fmt} files; pass one file at a time")
        return fmt
    traces = sorted([*p.glob("*.json"), *p.glob("*.json.gz")])
    if traces:
        from bubblecast.telemetry.importers import megatron_timeline

        if megatron_timeline.looks_like(traces[0]):
            raise BubblecastError(f"{p}: a directory of megatron-timeline files; "
                                  "pass one file at a time")
        return "kineto"
    raise BubblecastError(f"{p}: cannot detect the format ({_TRIED})")


def looks_like_json(head: bytes) -> bool:
    """True when ``head`` (a file's first decompressed bytes) starts a JSON object or array.

    A text log whose lines start with a bracket (``[2024-05-01 10:00:00,123][INFO]...``,
    ``[Rank 0] time (ms) | ...``, ``[default0]:...``) is no JSON array: an array that can hold
    a trace opens with an object, another array or its end."""
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    return text[:1] == b"{" or re.match(rb"\[\s*(?:[{\[\]]|$)", text) is not None


def detect_format(path: str | Path) -> str:
    """Name the format of ``path`` from its content; raise naming the formats tried.

    Parquet by its magic bytes and columns; JSON (a Chrome trace) only when the first bytes
    are JSON (:func:`looks_like_json`), so a text log is read as a log whatever its name; a
    ``.json``/``.gz`` file that is neither is left to the trace reader's error."""
    p = Path(path)
    if not p.exists():
        raise BubblecastError(f"{p}: no such file or directory")
    if p.is_dir():
        return _detect_dir(p)
    from bubblecast.telemetry.importers.kineto_io import read_prefix

    head = read_prefix(p, 4096)
    if head.startswith(b"PAR1"):
        import pyarrow.parquet as pq

        from bubblecast.telemetry.importers import megatron

        try:
            names = pq.read_schema(p).names
        except Exception:
            raise BubblecastError(f"{p}: cannot detect the format: unreadable Parquet "
                                  f"({_TRIED})") from None
        if {"op", "duration_s", "start_s"} <= set(names):
            return "bubblecast"
        if megatron.looks_like(names):
            return "megatron-ops"
        raise BubblecastError(f"{p}: cannot detect the format: columns {names[:8]} match none "
                              f"({_TRIED})")
    # the readers of the other formats load only when the file is one of them
    if looks_like_json(head):
        return _detect_trace(p)
    from bubblecast.telemetry.importers import logs

    fmt = logs.detect_log(p)
    if fmt is None and p.suffix in (".gz", ".json"):
        return _detect_trace(p)  # refused by the trace reader, naming why
    if fmt is None:
        raise BubblecastError(f"{p}: cannot detect the format: not Parquet, trace JSON or a "
                              f"training log with timer lines ({_TRIED})")
    return fmt


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
    if fmt == "megatron-timeline":
        from bubblecast.telemetry.importers.megatron_timeline import read_megatron_timeline

        return read_megatron_timeline(path)
    if fmt in ("megatron-log", "deepspeed-log"):
        from bubblecast.telemetry.importers.logs import read_log

        return read_log(path, fmt)
    from bubblecast.telemetry.importers.kineto import read_kineto

    return read_kineto(path)


def granularity(events: Events) -> str:
    """``step`` when any run came from a coarse log (one value per step, rank and timer)."""
    grains = {str(m.extra.get("granularity", "op")) for m in events.runs.values()}
    return "step" if "step" in grains else "op"


def timing_of(events: Events) -> str:
    """``host`` or ``device``: the clock of the compute durations, from the run metadata.

    Importers and the recorder write ``timing``; files without it (older bubblecast events,
    simulated runs) count as ``host``. Runs that disagree give ``mixed``.
    """
    clocks = {str(m.extra.get("timing", "host")) for m in events.runs.values()} or {"host"}
    return clocks.pop() if len(clocks) == 1 else "mixed"


def require_per_op(events: Events, command: str, source: str | Path) -> None:
    """Refuse step-granularity input for ``command`` in one line naming what would do."""
    if granularity(events) == "step":
        raise BubblecastError(f"{source}: {command} needs per-op order, and this training log "
                              f"gives one value per step and timer; give it {PER_OP_INPUTS}")


__all__ = ["FORMATS", "PER_OP_INPUTS", "detect_format", "granularity", "load_events",
           "looks_like_json", "require_per_op", "timing_of"]
