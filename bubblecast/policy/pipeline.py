"""Step time of a pipeline for given per-stage compute, scored with the timing engine.

The policy never judges a partition by its largest stage alone: warm-up and drain bubbles
depend on every stage, so candidate partitions, forecast horizons and counterfactual steps
are all scored by simulating the run's schedule (:mod:`bubblecast.sim.schedules`) with
:func:`bubblecast.sim.engine.simulate`, batched into one call.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bubblecast.errors import BubblecastError
from bubblecast.sim.engine import simulate
from bubblecast.sim.schedules import ScheduleGraph, schedule_graph


@dataclass(frozen=True)
class Pipeline:
    """Shape of one pipeline replica: schedule, ranks, microbatches, chunks, p2p time."""

    schedule: str = "1f1b"
    stages: int = 1
    microbatches: int = 1
    chunks: int = 1
    comm_s: float = 0.0

    def __post_init__(self) -> None:
        if not (np.isfinite(self.comm_s) and self.comm_s >= 0):
            raise BubblecastError(f"comm_s: must be finite and >= 0, got {self.comm_s}")
        self.graph  # noqa: B018 - validates schedule, stages, microbatches and chunks

    @property
    def graph(self) -> ScheduleGraph:
        return schedule_graph(self.schedule, self.stages, self.microbatches, self.chunks)

    @property
    def virtual_stages(self) -> int:
        return self.stages * self.chunks

    @property
    def split_backward(self) -> bool:
        return self.graph.schedule.split_backward


def op_durations(pipe: Pipeline, f: np.ndarray, b: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Per-op durations ``(batch, ops)`` from per-microbatch F, B and W seconds per virtual
    stage, each ``(batch, V)`` or per microbatch ``(batch, V, M)``. Unsplit schedules run
    B + W as one backward op (SPEC §3)."""
    sg = pipe.graph
    vs = sg.virtual_stage
    by_kind = [np.asarray(x, dtype=np.float64) for x in (f, b, w)]
    if not pipe.split_backward:
        by_kind = [by_kind[0], by_kind[1] + by_kind[2], by_kind[2] * 0.0]
    out = np.zeros((np.atleast_2d(by_kind[0]).shape[0], sg.graph.n_ops))
    for k, values in enumerate(by_kind):
        mask = sg.kind == k
        if not mask.any():
            continue
        values = np.atleast_2d(values) if values.ndim < 3 else values
        if values.ndim == 3:
            out[:, mask] = values[:, vs[mask], sg.microbatch[mask]]
        else:
            out[:, mask] = values[:, vs[mask]]
    return out


def step_times(pipe: Pipeline, durations: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(step_s, bubble_fraction)`` per row of ``(batch, ops)`` durations (SPEC §2 window)."""
    sg = pipe.graph
    start, end = simulate(sg.graph, durations, comm=pipe.comm_s)
    window = end.max(axis=1) - start.min(axis=1)
    cells = pipe.stages * window
    busy = durations.sum(axis=1)
    bubble = np.where(cells > 0, (cells - busy) / np.where(cells > 0, cells, 1.0), 0.0)
    return window, np.clip(bubble, 0.0, 1.0)


def stage_kind_work(partition: tuple[int, ...], costs: np.ndarray) -> np.ndarray:
    """``(3, V)``: F, B and W cost each virtual stage holds (``costs`` is ``(L, 3)``)."""
    edges = np.concatenate([[0], np.cumsum(partition)])
    if edges[-1] != len(costs):
        raise BubblecastError(f"partition {list(partition)} holds {edges[-1]} layers, "
                              f"the model has {len(costs)}")
    c = np.vstack([np.zeros((1, 3)), np.cumsum(costs, axis=0)])
    return (c[edges[1:]] - c[edges[:-1]]).T


def predicted_step(pipe: Pipeline, partitions: list[tuple[int, ...]], costs: np.ndarray,
                   speeds: np.ndarray, mb_factor: np.ndarray | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Step time and bubble of each partition under each speed row.

    ``speeds`` is ``(H, P)`` per-rank time multipliers (H scenarios, e.g. forecast horizons);
    ``mb_factor`` an optional ``(H, M)`` work multiplier per microbatch (token counts). Returns
    ``(len(partitions), H)`` arrays from a single engine call.
    """
    speeds = np.atleast_2d(np.asarray(speeds, dtype=np.float64))
    h = speeds.shape[0]
    vspeed = np.tile(speeds, (1, pipe.chunks))  # virtual stage c*P + r runs on rank r
    work = np.stack([stage_kind_work(p, costs) for p in partitions])  # (K, 3, V)
    per = work[:, None, :, :] * vspeed[None, :, None, :]  # (K, H, 3, V)
    per = per.reshape(-1, 3, pipe.virtual_stages)
    if mb_factor is not None:
        fac = np.tile(np.atleast_2d(mb_factor), (len(partitions), 1))  # (K*H, M)
        kinds = [per[:, k, :, None] * fac[:, None, :] for k in range(3)]
    else:
        kinds = [per[:, k, :] for k in range(3)]
    step, bubble = step_times(pipe, op_durations(pipe, *kinds))
    return step.reshape(len(partitions), h), bubble.reshape(len(partitions), h)
