"""Helpers shared by the command modules: JSON output and option parsing."""

from __future__ import annotations

import json
from typing import Any

import typer

from bubblecast.errors import BubblecastError

#: The input formats of ``--format`` (``bubblecast.telemetry.importers.FORMATS``, repeated
#: here so that building the CLI does not import pandas; a test keeps the two equal).
FORMAT_CHOICES: tuple[str, ...] = (
    "auto", "bubblecast", "megatron-ops", "kineto", "megatron-timeline", "megatron-log",
    "deepspeed-log",
)  # fmt: skip


def format_option() -> typer.models.OptionInfo:
    """The ``--format`` option every command that reads telemetry takes."""
    return typer.Option("auto", "--format",
                        help=f"Input format: {', '.join(FORMAT_CHOICES[:-1])} or "
                             f"{FORMAT_CHOICES[-1]}.")


def emit_json(obj: dict[str, Any]) -> None:
    """Print one JSON object on stdout (NaN and inf become null; numpy scalars and paths
    plain values: :func:`bubblecast.telemetry.jsonclean.plain`)."""
    from bubblecast.telemetry.jsonclean import plain  # not at start-up: loads pandas

    print(json.dumps(plain(obj), sort_keys=False))


def parse_int_list(text: str | None, option: str) -> list[int] | None:
    """Parse ``3,5,4`` for ``option``; raise a one-line error on bad input."""
    if text is None or text == "":
        return None
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise BubblecastError(
            f"{option}: expected comma-separated integers, got '{text}'"
        ) from None
