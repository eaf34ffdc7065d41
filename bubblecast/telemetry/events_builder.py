"""Build an events table in memory, op by op or column by column, without touching Parquet."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from bubblecast.telemetry.events import Events
from bubblecast.telemetry.schema import REQUIRED, RunMeta
from bubblecast.telemetry.validate import validate_frame


class EventsBuilder:
    """Collect ops of one or more runs, then :meth:`build` a validated :class:`Events`.

    >>> b = EventsBuilder()
    >>> b.add_run("r0", RunMeta(schedule="1f1b", stages=2, microbatches=1))
    >>> b.add("r0", step=0, rank=0, stage=0, op="F", start_s=0.0, duration_s=1.0, microbatch=0)
    >>> len(b.build())
    1
    """

    def __init__(self) -> None:
        self.runs: dict[str, RunMeta] = {}
        self._rows: dict[str, list[Any]] = {c: [] for c in REQUIRED}
        self._extra: dict[str, list[Any]] = {}
        self._n = 0

    def add_run(self, run_id: str, meta: RunMeta) -> EventsBuilder:
        self.runs[run_id] = meta
        return self

    def add(self, run_id: str, *, step: int, rank: int, stage: int, op: str, start_s: float,
            duration_s: float, microbatch: int = -1, chunk: int = 0, replica: int = 0,
            **optional: Any) -> EventsBuilder:
        """Append one op; optional columns (``layers``, ``tokens``, ``tokens_sq``,
        ``documents``, ...) as keywords."""
        row = {"run_id": run_id, "step": step, "rank": rank, "stage": stage, "replica": replica,
               "chunk": chunk, "microbatch": microbatch, "op": op, "start_s": start_s,
               "duration_s": duration_s}
        for col, value in row.items():
            self._rows[col].append(value)
        for col, value in optional.items():
            self._extra.setdefault(col, [None] * self._n).append(value)
        self._n += 1
        for values in self._extra.values():
            if len(values) < self._n:
                values.append(None)
        return self

    def build(self, source: str = "<memory>") -> Events:
        data: dict[str, Any] = dict(self._rows)
        data.update(self._extra)
        frame = pd.DataFrame(data)
        return from_frame(frame, self.runs, source)


def from_frame(frame: pd.DataFrame, runs: dict[str, RunMeta] | None = None,
               source: str = "<memory>") -> Events:
    """Validate a frame with SPEC columns (any integer widths) and wrap it as :class:`Events`."""
    runs = dict(runs or {})
    frame = frame.copy()
    for col, dtype in (("layers", "Int32"), ("tokens", "Int64"), ("documents", "Int32")):
        if col in frame.columns and frame[col].isna().any():
            frame[col] = frame[col].astype(dtype)
    for col in ("start_s", "duration_s"):
        if col in frame.columns and pd.api.types.is_integer_dtype(frame[col].dtype):
            frame[col] = frame[col].astype(np.float64)
    return Events(validate_frame(frame, runs, source), runs)
