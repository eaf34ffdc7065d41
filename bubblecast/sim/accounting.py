"""Bubble accounting (SPEC §2): windows, busy and idle time per rank, stage and step."""

from __future__ import annotations

from typing import Any

import pandas as pd

from bubblecast.errors import BubblecastError
from bubblecast.telemetry.events import Events


def inspect_summary(events: Events, run_id: str | None = None) -> dict[str, Any]:
    """The ``inspect --json`` object for one run (the only run, or ``run_id``)."""
    ids = events.run_ids
    if run_id is None:
        if len(ids) != 1:
            raise BubblecastError(f"the file holds {len(ids)} runs; choose one with --run")
        run_id = ids[0]
    elif run_id not in ids:
        raise BubblecastError(f"--run: no run '{run_id}' (runs: {', '.join(ids[:10])})")
    ev = events.run(run_id)
    meta = ev.runs[run_id]
    comp = ev.compute()
    busy = comp.groupby("stage", observed=True)["duration_s"].sum()
    per_stage = [{"stage": int(s), "busy_s": float(busy.get(s, 0.0))} for s in range(meta.stages)]
    return {
        "run_id": run_id,
        "steps": int(pd.unique(ev.frame["step"]).size),
        "stages": meta.stages,
        "replicas": meta.replicas,
        "per_stage": per_stage,
    }
