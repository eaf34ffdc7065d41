"""Telemetry: the SPEC §1 events table, its validation, Parquet I/O and importers.

The names below are loaded on first use (module ``__getattr__``, PEP 562), so importing a
telemetry module that needs no pandas (:mod:`.schema`, :mod:`.fastwrite`, ...) does not load
pandas through this package."""

from __future__ import annotations

import importlib
from typing import Any

#: Public name -> the module it is loaded from on first access.
_EXPORTS: dict[str, str] = {
    "COMPUTE_OPS": "bubblecast.telemetry.schema",
    "OPS": "bubblecast.telemetry.schema",
    "RunMeta": "bubblecast.telemetry.schema",
    "Events": "bubblecast.telemetry.events",
    "EventsBuilder": "bubblecast.telemetry.events_builder",
    "from_frame": "bubblecast.telemetry.events_builder",
    "SchemaError": "bubblecast.telemetry.validate",
    "atomic_write": "bubblecast.telemetry.parquet_write",
    "atomic_write_text": "bubblecast.telemetry.parquet_write",
    "read_events": "bubblecast.telemetry.io",
    "write_events": "bubblecast.telemetry.io",
}  # fmt: skip

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'bubblecast.telemetry' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
