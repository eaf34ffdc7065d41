"""Step time and bubble fraction of a schedule for given per-stage compute.

The service asks this for every forecast. Graphs come from
:func:`bubblecast.sim.schedules.schedule_graph` (the SPEC §2 dependencies and communication
model) and are prepared once per (schedule, stages, microbatches, chunks). Large batches run
through the vectorised engine (:func:`bubblecast.sim.engine.simulate`); a request's batch is
tiny (one row per horizon or candidate partition), where numpy's per-call overhead dominates,
so small graphs are timed by a plain loop over the ops in topological order, the same
recurrence (start = max(previous op on the lane, each dependency's end + lag x comm)). Tests
check both paths agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from bubblecast.errors import BubblecastError
from bubblecast.serve.schemas import RequestError
from bubblecast.sim.engine import simulate
from bubblecast.sim.schedules import ScheduleGraph, schedule_graph

#: Up to this many (row, op) cells a request is timed by the loop, above it by the engine.
LOOP_CELLS = 4096


@dataclass(frozen=True)
class Prepared:
    """A schedule graph plus what every request on it reuses."""

    sg: ScheduleGraph
    stages: int
    split_backward: bool
    per_mb: float  # 1 / (microbatches x chunks)
    order: list[int]  # ops in topological order
    preds: list[tuple[tuple[int, float], ...]]  # per op: (source op, lag multiplier) pairs


def pipeline_graph(schedule: str, stages: int, microbatches: int, chunks: int = 1) -> Prepared:
    """The prepared graph of a schedule; RequestError naming the pipeline field otherwise."""
    try:
        return _prepared(schedule, stages, microbatches, chunks)
    except BubblecastError as exc:
        text = str(exc)
        name, _, rest = text.partition(": ")
        if name.startswith("--") and rest:
            raise RequestError(f"pipeline.{name[2:]}", rest) from None
        raise RequestError("pipeline", text) from None


@lru_cache(maxsize=64)
def _prepared(schedule: str, stages: int, microbatches: int, chunks: int) -> Prepared:
    sg = schedule_graph(schedule, stages, microbatches, chunks)
    g = sg.graph
    preds: list[list[tuple[int, float]]] = [[] for _ in range(g.n_ops)]
    for i, p in enumerate(g.prev.tolist()):
        if p >= 0:
            preds[i].append((p, 0.0))
    for (src, dst), lag in zip(g.deps.tolist(), g.dep_lag.tolist(), strict=True):
        preds[dst].append((src, lag))
    order = np.concatenate(g.levels()).tolist() if g.n_ops else []
    return Prepared(sg, stages, bool(np.any(sg.kind == 2)), 1.0 / (microbatches * chunks),
                    order, [tuple(p) for p in preds])


def op_durations(pg: Prepared, stage_compute: np.ndarray,
                 weights: tuple[float, float, float]) -> np.ndarray:
    """Per-op durations ``(batch, ops)`` from per-stage compute seconds per step
    ``(batch, stages)``: split over microbatches and chunks, then over F/B/W by ``weights``
    (the backward op carries B+W when the schedule does not split it, as SPEC §3 says)."""
    wf, wb, ww = (float(x) for x in weights)
    share = np.array([wf, wb, ww] if pg.split_backward else [wf, wb + ww, 0.0])
    share *= pg.per_mb / (wf + wb + ww)
    return np.atleast_2d(stage_compute)[:, pg.sg.stage] * share[pg.sg.kind][None, :]


def _loop_windows(pg: Prepared, dur: np.ndarray, comm: float) -> np.ndarray:
    """Makespan per row by one pass over the ops in topological order (origin 0)."""
    out = np.empty(dur.shape[0])
    order, preds = pg.order, pg.preds
    for r, row in enumerate(dur.tolist()):
        end = [0.0] * len(row)
        last = 0.0
        for i in order:
            t = 0.0
            for src, lag in preds[i]:
                e = end[src] + lag * comm if lag else end[src]
                if e > t:
                    t = e
            t += row[i]
            end[i] = t
            if t > last:
                last = t
        out[r] = last
    return out


def step_times(pg: Prepared, stage_compute: np.ndarray,
               weights: tuple[float, float, float] = (1.0, 1.0, 1.0),
               comm: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """``(step_time_s, bubble_fraction)``, each ``(batch,)``, for ``(batch, stages)`` compute.

    Every op starts at 0 or later and the first ops start at 0, so the step time is the
    latest end. Bubble fraction per SPEC §2: total idle / (ranks x window) over compute ops;
    0 for an empty window.
    """
    dur = op_durations(pg, stage_compute, weights)
    if dur.size <= LOOP_CELLS:
        window = _loop_windows(pg, dur, float(comm))
    else:
        start, end = simulate(pg.sg.graph, dur, comm=comm)
        window = end.max(axis=1) - start.min(axis=1)
    busy = dur.sum(axis=1)
    cells = pg.stages * window
    safe = np.where(cells > 0, cells, 1.0)
    bubble = np.where(cells > 0, (cells - busy) / safe, 0.0)
    return window, np.clip(bubble, 0.0, 1.0)
