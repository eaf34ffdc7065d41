"""THE step-timing module: step time and bubble fraction of a pipeline, simulated or observed.

Everything that predicts a step's time scores it by simulating the schedule
(:mod:`bubblecast.sim.schedules`) with the vectorised engine (:func:`bubblecast.sim.engine.
simulate`), batched into one call: the policies' candidate partitions and forecast horizons
(:func:`predicted_step`), the service's forecasts (:func:`stage_op_durations` then
:func:`step_times`). The step time of a recorded run is :func:`observed_step_times` (SPEC §2:
earliest start to latest end of any op). Bubble fraction per SPEC §2: total idle over
``ranks x window``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from bubblecast.errors import BubblecastError
from bubblecast.sim.engine import simulate
from bubblecast.sim.schedules import ScheduleGraph, check_schedule, schedule_graph
from bubblecast.sim.shape import PipelineShape


def shape_graph(shape: PipelineShape) -> ScheduleGraph:
    """The (cached) schedule graph of ``shape``; BubblecastError naming the field otherwise."""
    return schedule_graph(shape.schedule, shape.stages, shape.microbatches, shape.chunks)


def timing_shape(schedule: str = "1f1b", stages: int = 1, microbatches: int = 1,
                 chunks: int = 1, comm_s: float = 0.0) -> PipelineShape:
    """A :class:`PipelineShape` the engine can time: its schedule is simulable and its numbers
    fit the schedule's rules (checked here, once, rather than at the first timing)."""
    if not (np.isfinite(comm_s) and comm_s >= 0):
        raise BubblecastError(f"comm_s: must be finite and >= 0, got {comm_s}")
    schedule, chunks = check_schedule(schedule, stages, microbatches, chunks)
    schedule_graph(schedule, stages, microbatches, chunks)  # the simulator's own messages
    return PipelineShape(schedule, stages, microbatches, chunks, float(comm_s))


def op_durations(shape: PipelineShape, f: np.ndarray, b: np.ndarray, w: np.ndarray
                 ) -> np.ndarray:
    """Per-op durations ``(batch, ops)`` from per-microbatch F, B and W seconds per virtual
    stage, each ``(batch, V)`` or per microbatch ``(batch, V, M)``. A backward without its own
    W op (every backward of an unsplit schedule) runs B + W as one op (SPEC §3)."""
    sg = shape_graph(shape)
    vs = sg.virtual_stage
    by_kind = [np.asarray(x, dtype=np.float64) for x in (f, b, w)]
    out = np.zeros((np.atleast_2d(by_kind[0]).shape[0], sg.graph.n_ops))
    for k, values in enumerate(by_kind):
        for mask in ((sg.kind == k), (sg.fused if k == 2 else None)):
            if mask is None or not mask.any():
                continue
            values = np.atleast_2d(values) if values.ndim < 3 else values
            if values.ndim == 3:
                out[:, mask] += values[:, vs[mask], sg.microbatch[mask]]
            else:
                out[:, mask] += values[:, vs[mask]]
    return out


def stage_op_durations(shape: PipelineShape, stage_compute: np.ndarray,
                       weights: tuple[float, float, float] = (1.0, 1.0, 1.0)) -> np.ndarray:
    """Per-op durations ``(batch, ops)`` from per-rank compute seconds per step
    ``(batch, stages)``: split evenly over microbatches and chunks, then over F/B/W by
    ``weights`` (a backward without its own W op carries B+W, SPEC §3)."""
    sg = shape_graph(shape)
    wf, wb, ww = (float(x) for x in weights)
    share = np.array([wf, wb, ww])[sg.kind] + ww * sg.fused
    share *= 1.0 / (shape.microbatches * sg.schedule.chunks) / (wf + wb + ww)
    return np.atleast_2d(stage_compute)[:, sg.stage] * share[None, :]


def step_times(shape: PipelineShape, durations: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(step_s, bubble_fraction)``, each ``(batch,)``, per row of ``(batch, ops)`` durations:
    the SPEC §2 window (earliest start to latest end) and total idle / (ranks x window), 0 for
    an empty window."""
    sg = shape_graph(shape)
    start, end = simulate(sg.graph, durations, comm=shape.comm_s)
    window = end.max(axis=1) - start.min(axis=1)
    cells = shape.stages * window
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


def predicted_step(shape: PipelineShape, partitions: list[tuple[int, ...]], costs: np.ndarray,
                   speeds: np.ndarray, mb_factor: np.ndarray | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Step time and bubble of each partition under each speed row.

    ``speeds`` is ``(H, P)`` per-rank time multipliers (H scenarios, e.g. forecast horizons);
    ``mb_factor`` an optional ``(H, M)`` work multiplier per microbatch (token counts). Returns
    ``(len(partitions), H)`` arrays from a single engine call.
    """
    speeds = np.atleast_2d(np.asarray(speeds, dtype=np.float64))
    h = speeds.shape[0]
    vspeed = speeds[:, shape_graph(shape).rank_of_vstage]  # each virtual stage at its rank's
    work = np.stack([stage_kind_work(p, costs) for p in partitions])  # (K, 3, V)
    per = work[:, None, :, :] * vspeed[None, :, None, :]  # (K, H, 3, V)
    per = per.reshape(-1, 3, work.shape[-1])
    if mb_factor is not None:
        fac = np.tile(np.atleast_2d(mb_factor), (len(partitions), 1))  # (K*H, M)
        kinds = [per[:, k, :, None] * fac[:, None, :] for k in range(3)]
    else:
        kinds = [per[:, k, :] for k in range(3)]
    step, bubble = step_times(shape, op_durations(shape, *kinds))
    return step.reshape(len(partitions), h), bubble.reshape(len(partitions), h)


def op_times(frame: pd.DataFrame, start: np.ndarray | None = None,
             duration: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(start, end)`` of every row of an event frame, or of the given replayed times."""
    s = frame["start_s"].to_numpy(np.float64) if start is None else np.asarray(start, float)
    d = frame["duration_s"].to_numpy(np.float64) if duration is None else np.asarray(duration,
                                                                                     float)
    return s, s + d


def observed_step_times(frame: pd.DataFrame, start: np.ndarray | None = None,
                        duration: np.ndarray | None = None) -> pd.Series:
    """SPEC step time per step of a recorded (or replayed) run: earliest start to latest end
    of any op on any rank."""
    s, e = op_times(frame, start, duration)
    g = pd.DataFrame({"step": frame["step"].to_numpy(np.int64), "s": s, "e": e}).groupby("step")
    return (g["e"].max() - g["s"].min()).rename("step_time_s")
