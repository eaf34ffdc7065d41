"""Hypothesis strategies for valid events tables."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import strategies as st

from bubblecast.telemetry.schema import RunMeta


@st.composite
def valid_events(draw: st.DrawFn) -> tuple[pd.DataFrame, dict[str, RunMeta]]:
    """A small valid events frame (F and B per microbatch per rank, plus comm ops)."""
    stages = draw(st.integers(1, 4))
    replicas = draw(st.integers(1, 2))
    microbatches = draw(st.integers(1, 4))
    steps = draw(st.integers(1, 3))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    rows = []
    for step in range(steps):
        for replica in range(replicas):
            for stage in range(stages):
                rank = replica * stages + stage
                t = 0.0
                for mb in range(microbatches):
                    for op in ("F", "B"):
                        dur = float(rng.uniform(0.001, 0.01))
                        rows.append(("r0", step, rank, stage, replica, 0, mb, op, t, dur))
                        t += dur
                    rows.append(("r0", step, rank, stage, replica, 0, mb, "SEND_F", t, 0.0001))
                rows.append(("r0", step, rank, stage, replica, 0, -1, "OPTIMIZER", t, 0.002))
    frame = pd.DataFrame(rows, columns=["run_id", "step", "rank", "stage", "replica", "chunk",
                                        "microbatch", "op", "start_s", "duration_s"])
    meta = RunMeta(schedule="1f1b", stages=stages, microbatches=microbatches,
                   replicas=replicas, source="test")
    return frame, {"r0": meta}
