"""Telemetry: the SPEC §1 events table, its validation, Parquet I/O and importers."""

from bubblecast.telemetry.events import Events
from bubblecast.telemetry.events_builder import EventsBuilder, from_frame
from bubblecast.telemetry.io import atomic_write, atomic_write_text, read_events, write_events
from bubblecast.telemetry.schema import COMPUTE_OPS, OPS, RunMeta
from bubblecast.telemetry.validate import SchemaError

__all__ = [
    "COMPUTE_OPS", "OPS", "Events", "EventsBuilder", "RunMeta", "SchemaError", "atomic_write",
    "atomic_write_text", "from_frame", "read_events", "write_events",
]  # fmt: skip
