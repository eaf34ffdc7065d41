"""Activation memory of a schedule, from its op order alone.

A microbatch's activations on a rank's chunk are held from the end of its forward until its
backward is complete: its W where the schedule splits the backward, else its (full) B. One
(microbatch, chunk) pair holds ``1 / chunks`` of the activations a microbatch leaves on the
whole rank (each chunk holds ``1 / chunks`` of the rank's layers), so the figures are in
microbatches of the rank's activations and comparable across schedules and chunk counts:
1F1B peaks at ``min(P, M)`` on rank 0, GPipe at ``M``, ZB-V at about 1F1B's (the zero-bubble
paper's ``P M_B``).
"""

from __future__ import annotations

import numpy as np

from bubblecast.sim.schedules import Schedule, build_schedule


def in_flight(schedule: Schedule) -> list[np.ndarray]:
    """Per rank, microbatches holding activations after each of its ops (op order)."""
    out = []
    for lane in schedule.ranks:
        last_backward = {}
        for i, op in enumerate(lane):
            if op.kind != "F":
                last_backward[op.microbatch, op.chunk] = i
        release = np.zeros(len(lane))
        for i in last_backward.values():
            release[i] -= 1.0
        for i, op in enumerate(lane):
            if op.kind == "F":
                release[i] += 1.0
        out.append(np.cumsum(release) / schedule.chunks)
    return out


def peak_activations(schedule: Schedule) -> np.ndarray:
    """``(stages,)``: each rank's peak in-flight activations, in microbatches."""
    return np.array([float(curve.max(initial=0.0)) for curve in in_flight(schedule)])


def schedule_peak(name: str, stages: int, microbatches: int, chunks: int = 1) -> float:
    """The largest per-rank peak of schedule ``name`` (the memory a cap must allow)."""
    return float(peak_activations(build_schedule(name, stages, microbatches, chunks)).max())
