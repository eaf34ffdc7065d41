"""Clock artefacts of real traces that importers normalise, counted (SPEC §1).

Every importer of an external format (megatron-ops, megatron-timeline, kineto, megatron-log,
deepspeed-log) passes the durations it reads through one :class:`InputFixes`: a negative
duration down to :data:`JITTER_S` (1 ms) is clock jitter and becomes 0; a more negative one is
refused in one line naming the file, the place in it (row, trace event or log line) and the
value. The count lands in the run metadata as ``extra["input_fixes"]``
(``{"negative_durations_clamped": N}``, read by ``inspect --json``) and, when N > 0, in one
line on stderr. The ``bubblecast`` events format never goes through here: it stays strict.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from bubblecast.errors import BubblecastError

#: The most negative duration (seconds) taken as clock jitter and clamped to 0.
JITTER_S = 1e-3
#: The run-metadata key and the ``inspect --json`` key of the fixes an importer applied.
FIXES_KEY = "input_fixes"
#: The count of negative durations clamped to 0, inside ``input_fixes``.
CLAMPED_KEY = "negative_durations_clamped"


@dataclass
class InputFixes:
    """The fixes applied while importing ``source``: count and the most negative value clamped.

    One per imported run; :meth:`clamp` every duration column read, then :meth:`record`.
    """

    source: str
    clamped: int = 0
    worst_s: float = 0.0

    def clamp(self, values: Any, where: Callable[[int], str] | None = None,
              unit_s: float = 1.0) -> np.ndarray:
        """``values`` (durations in units of ``unit_s`` seconds) with jitter set to 0.

        A value below -:data:`JITTER_S` is refused: ``where(i)`` names the place of the
        offending element ``i`` in the file (default ``column 'duration_s', row i``). NaN
        passes untouched (the schema check refuses it). The input is never modified.
        """
        out = np.asarray(values, dtype=np.float64)
        negative = out < 0
        if not negative.any():
            return out
        limit = JITTER_S / unit_s * (1.0 + 1e-9)  # -1000 us is -1 ms whatever the rounding
        too_low = out < -limit
        if too_low.any():
            i = int(np.flatnonzero(too_low)[0])
            place = where(i) if where is not None else f"column 'duration_s', row {i}"
            raise BubblecastError(
                f"{self.source}: {place}: negative duration {out[i] * unit_s:.6g} s (only "
                f"clock jitter down to -{JITTER_S * 1e3:g} ms is clamped to 0)")
        self.clamped += int(negative.sum())
        self.worst_s = min(self.worst_s, float(out[negative].min()) * unit_s)
        return np.where(negative, 0.0, out)

    def record(self, extra: dict[str, Any]) -> None:
        """Put the count in a run's metadata (``extra``); say it on stderr when nonzero."""
        extra[FIXES_KEY] = {CLAMPED_KEY: self.clamped}
        if self.clamped:
            print(f"bubblecast: note: {self.source}: {self.clamped} negative duration"
                  f"{'s' if self.clamped > 1 else ''} (clock jitter, down to "
                  f"{self.worst_s:.3g} s) clamped to 0", file=sys.stderr)


def input_fixes(extra: dict[str, Any]) -> dict[str, int]:
    """The fixes recorded in a run's metadata (``{}`` for input that needed and got none,
    such as ``bubblecast`` events)."""
    fixes = extra.get(FIXES_KEY)
    return {str(k): int(v) for k, v in fixes.items()} if isinstance(fixes, dict) else {}


__all__ = ["CLAMPED_KEY", "FIXES_KEY", "JITTER_S", "InputFixes", "input_fixes"]
