"""Kineto import, second half: pipeline layout from the stage indices, schedule guess, frame.

The label's stage index is the global (virtual) stage. Ranks holding the same set of stage
indices are replicas of one pipeline position; positions are numbered by their smallest stage
index and a rank's chunk is the position of the stage index in its sorted set. This is
``stage_index = chunk * ranks + rank`` for looped (interleaved) schedules and
``{rank, 2 * ranks - 1 - rank}`` for V-shape ones (ZBV, DualPipeV).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from bubblecast.errors import BubblecastError
from bubblecast.telemetry.schema import RunMeta

KIND_TO_OP: dict[str, str] = {
    "F": "F", "B": "B", "I": "B", "W": "W", "SEND_F": "SEND_F", "RECV_F": "RECV_F",
    "SEND_B": "SEND_B", "RECV_B": "RECV_B", "OPT": "OPTIMIZER",
}  # fmt: skip


def layout(ops: pd.DataFrame, source: str) -> tuple[dict[int, tuple[int, int]], dict, str]:
    """(rank -> (stage, replica), (rank, stage_index) -> chunk, layout name)."""
    held = ops.loc[ops["stage_index"] >= 0].groupby("rank")["stage_index"].unique()
    missing = sorted(set(ops["rank"].unique()) - set(held.index))
    if missing:
        raise BubblecastError(f"{source}: rank {missing[0]} has no 'PP:' label with a stage index")
    groups: dict[tuple[int, ...], list[int]] = {}
    for rank, indices in held.items():
        groups.setdefault(tuple(sorted(int(i) for i in indices)), []).append(int(rank))
    sets = sorted(groups, key=lambda s: s[0])
    flat = sorted(i for s in sets for i in s)
    if flat != list(range(len(flat))) or len({len(s) for s in sets}) != 1:
        desc = "; ".join(f"ranks {groups[s]}: {list(s)}" for s in sets)
        raise BubblecastError(f"{source}: ranks hold inconsistent pipeline stage indices ({desc})")
    n_pos, n_chunks = len(sets), len(sets[0])
    placement: dict[int, tuple[int, int]] = {}
    chunk_of: dict[tuple[int, int], int] = {}
    for stage, indices in enumerate(sets):
        for replica, rank in enumerate(sorted(groups[indices])):
            placement[rank] = (stage, replica)
            chunk_of.update({(rank, idx): c for c, idx in enumerate(indices)})
    if n_chunks == 1:
        layout = "single"
    elif all(s[c] == s[0] + c * n_pos for s in sets for c in range(n_chunks)):
        layout = "looped"
    elif n_chunks == 2 and all(s[0] + s[1] == 2 * n_pos - 1 for s in sets):
        layout = "v-shape"
    else:
        layout = "custom"
    return placement, chunk_of, layout


def guess_schedule(frame: pd.DataFrame, layout: str, stages: int) -> str:
    """Name the schedule from the op pattern of the first step (``unknown`` if unsure)."""
    names = frame["name"].astype(str)
    if names.str.contains("OVERLAP_F_B", regex=False).any():
        return "dualpipev"
    comp = frame.loc[frame["op"].isin(["F", "B", "W"]) & (frame["replica"] == 0)]
    if comp.empty:
        return "unknown"
    comp = comp.loc[comp["step"] == comp["step"].min()].sort_values("start_s", kind="stable")
    has_w = bool((comp["op"] == "W").any())

    def forwards_before_first_b(stage: int) -> tuple[int, int]:
        ops = comp.loc[comp["stage"] == stage, "op"].astype(str).tolist()
        first_b = ops.index("B") if "B" in ops else len(ops)
        return ops[:first_b].count("F"), ops.count("F")

    if layout == "single":
        if has_w:
            return "zb-h1" if forwards_before_first_b(0)[0] <= stages else "zb-h2"
        before, total = forwards_before_first_b(stages - 1)
        return "gpipe" if before == total and total > 1 else "1f1b"
    if layout == "looped":
        if has_w:
            return "zb-interleaved"
        all_f_first = all(b == t for b, t in (forwards_before_first_b(s) for s in range(stages)))
        return "looped-bfs" if all_f_first else "interleaved"
    if layout == "v-shape":
        return "zbv" if has_w else "v-shape"
    return "unknown"


def to_events(ops: pd.DataFrame, source: str, run_id: str) -> tuple[pd.DataFrame, RunMeta]:
    placement, chunk_of, layout_name = layout(ops, source)
    rank = ops["rank"].to_numpy()
    stage = np.array([placement[r][0] for r in rank], dtype=np.int32)
    replica = np.array([placement[r][1] for r in rank], dtype=np.int32)
    chunk = np.array(
        [chunk_of.get((r, s), 0) for r, s in zip(rank, ops["stage_index"], strict=True)],
        dtype=np.int32,
    )
    replicas = max(p[1] for p in placement.values()) + 1
    kind_map = dict(KIND_TO_OP, REDUCE_GRAD="ALLREDUCE" if replicas > 1 else "OTHER")
    op = ops["kind"].map(kind_map).fillna("OTHER")
    step = ops["step"].to_numpy(np.int64)
    ts = ops["ts_us"].to_numpy(np.float64)
    origin = pd.Series(ts).groupby(step).transform("min").to_numpy()
    frame = pd.DataFrame(
        {
            "run_id": run_id,
            "step": step,
            "rank": rank.astype(np.int32),
            "stage": stage,
            "replica": replica,
            "chunk": chunk,
            "microbatch": ops["microbatch"].to_numpy(np.int32),
            "op": op.to_numpy(),
            "start_s": (ts - origin) / 1e6,
            "duration_s": ops["dur_us"].to_numpy(np.float64) / 1e6,
            "wait_s": ops["wait_us"].to_numpy(np.float64) / 1e6,
            "host": ops["host"].to_numpy(),
            "name": ops["name"].to_numpy(),
        }
    )
    frame = frame.sort_values(["step", "rank", "start_s"], kind="stable").reset_index(drop=True)
    stages = len({p[0] for p in placement.values()})
    chunks = max(chunk_of.values()) + 1
    is_comp = frame["op"].isin(["F", "B", "W"])
    microbatches = int(frame.loc[is_comp, "microbatch"].max()) + 1 if is_comp.any() else 1
    meta = RunMeta(
        schedule=guess_schedule(frame, layout_name, stages),
        stages=stages,
        microbatches=max(microbatches, int(frame["microbatch"].max()) + 1, 1),
        chunks=chunks,
        replicas=replicas,
        partition=None,
        source="kineto",
        extra={"stage_layout": layout_name, "ranks": len(placement)},
    )
    return frame, meta



__all__ = ["KIND_TO_OP", "guess_schedule", "layout", "to_events"]
