"""THE step-timing module: step time and bubble fraction of a pipeline, simulated or observed.

Everything that predicts a step's time scores it by simulating the schedule
(:mod:`bubblecast.sim.schedules`) with the vectorised engine (:func:`bubblecast.sim.engine.
simulate`), batched into one call: the policies' candidate partitions and forecast horizons
(:func:`predicted_step`), the service's forecasts (:func:`stage_op_durations` then
:func:`step_times`). The step time of a recorded run is :func:`observed_step_times` (SPEC §2:
earliest start to latest end of any op). Bubble fraction per SPEC §2: total idle over
``ranks x window``.

A few rows of a small graph (a served forecast: one row per horizon, tens of ops) are timed by
:func:`scalar_program` instead of the engine: the same recurrence (each op starts at the latest
of its lane predecessor's end, or the origin, and each dependency's end plus lag x comm) as
straight-line Python float code compiled once per graph, bit-identical to the engine (the same
IEEE max and add per op) and cheaper than its per-level numpy calls at this size.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pandas as pd

from bubblecast.errors import BubblecastError
from bubblecast.sim.engine import OpGraph, simulate
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
    share = _op_share(sg, shape.microbatches, tuple(float(x) for x in weights))
    return np.atleast_2d(stage_compute)[:, sg.stage] * share[None, :]


def _op_share(sg: ScheduleGraph, microbatches: int, weights: tuple[float, float, float]
              ) -> np.ndarray:
    """Each op's share of its rank's step compute (read-only; cached for the latest graphs)."""
    key = (id(sg), microbatches, weights)
    hit = _SHARES.get(key)
    if hit is not None and hit[0] is sg:
        return hit[1]
    wf, wb, ww = weights
    share = np.array([wf, wb, ww])[sg.kind] + ww * sg.fused
    share *= 1.0 / (microbatches * sg.schedule.chunks) / (wf + wb + ww)
    share.flags.writeable = False
    if len(_SHARES) >= 64:
        _SHARES.pop(next(iter(_SHARES)))
    _SHARES[key] = (sg, share)
    return share


_SHARES: dict[tuple, tuple[ScheduleGraph, np.ndarray]] = {}

#: :func:`step_times` uses the compiled scalar program up to this many ops per graph and
#: (rows x ops) cells per call; above, the vectorised engine is cheaper.
SCALAR_MAX_OPS = 1024
SCALAR_MAX_CELLS = 4096

#: ``program(durations, comm) -> (earliest start, latest end)`` of one row (Python floats).
ScalarProgram = Callable[[list[float], float], tuple[float, float]]


def scalar_program(graph: OpGraph) -> ScalarProgram:
    """The engine's recurrence for ``graph`` (origin 0) as one compiled Python function of a
    row of durations (a list in op order) and the communication time, returning the earliest
    start and latest end. Ops are visited in a topological order; each start is the ``max``
    of the same candidates the engine takes, each arrival ``end + lag * comm``, so every
    value is the engine's bit for bit (finite, non-negative inputs; the caller checks)."""
    key = id(graph)
    hit = _PROGRAMS.get(key)
    if hit is not None and hit[0] is graph:
        return hit[1]
    n = graph.n_ops
    prev = graph.prev.tolist()
    incoming: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    for (src, dst), lag in zip(graph.deps.tolist(), graph.dep_lag.tolist(), strict=True):
        incoming[dst].append((src, lag))
    lags = sorted({lag for deps in incoming for _, lag in deps if lag != 0.0})
    lines = ["def program(d, c):"]
    lines += [f"    a{k} = {lag!r} * c" for k, lag in enumerate(lags)]
    if n:
        lines.append(f"    {', '.join(f'd{i}' for i in range(n))}, = d")
    for i in _topological(prev, incoming):
        cands = [f"e{prev[i]}" if prev[i] >= 0 else "0.0"]
        cands += [f"e{src} + a{lags.index(lag)}" if lag != 0.0 else f"e{src}"
                  for src, lag in incoming[i]]
        lines.append(f"    s{i} = {cands[0]}")
        for cand in cands[1:]:  # max() without a call: the same value
            lines.append(f"    t = {cand}\n    if t > s{i}: s{i} = t")
        lines.append(f"    e{i} = s{i} + d{i}")
    if n > 1:
        lines.append(f"    return min({', '.join(f's{i}' for i in range(n))}), "
                     f"max({', '.join(f'e{i}' for i in range(n))})")
    else:
        lines.append("    return s0, e0")
    namespace: dict = {}
    exec(compile("\n".join(lines), f"<steptime program, {n} ops>", "exec"), namespace)
    program = namespace["program"]
    if len(_PROGRAMS) >= 32:
        _PROGRAMS.pop(next(iter(_PROGRAMS)))
    _PROGRAMS[key] = (graph, program)
    return program


_PROGRAMS: dict[int, tuple[OpGraph, ScalarProgram]] = {}


def _topological(prev: list[int], incoming: list[list[tuple[int, float]]]) -> list[int]:
    """Ops in an order where each comes after its lane predecessor and its dependencies
    (Kahn's algorithm); ValueError on a cycle, as the engine raises."""
    n = len(prev)
    out_edges: list[list[int]] = [[] for _ in range(n)]
    indeg = [0] * n
    for i in range(n):
        for src in ([prev[i]] if prev[i] >= 0 else []) + [s for s, _ in incoming[i]]:
            out_edges[src].append(i)
            indeg[i] += 1
    ready = [i for i in range(n) if indeg[i] == 0]
    order = []
    while ready:
        i = ready.pop()
        order.append(i)
        for j in out_edges[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                ready.append(j)
    if len(order) != n:
        raise ValueError("OpGraph: the dependencies form a cycle (a deadlocked schedule)")
    return order


def _scalar_times(graph: OpGraph, stages: int, durations: np.ndarray, comm: float
                  ) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`step_times` by :func:`scalar_program` and float arithmetic (the same IEEE
    operations as the array formulas); None when the engine should time it instead (large,
    non-finite or negative input)."""
    rows, n = durations.shape
    if n > SCALAR_MAX_OPS or rows * n > SCALAR_MAX_CELLS or n != graph.n_ops or n == 0:
        return None
    if not (np.isfinite(durations).all() and durations.min() >= 0.0) \
            or not (math.isfinite(comm) and comm >= 0.0):
        return None
    program = scalar_program(graph)
    c = float(comm)
    windows, bubbles = [], []
    for row, busy in zip(durations.tolist(), durations.sum(axis=1).tolist(), strict=True):
        first, last = program(row, c)
        window = last - first
        cells = stages * window
        bubble = (cells - busy) / cells if cells > 0 else 0.0
        windows.append(window)
        bubbles.append(min(max(bubble, 0.0), 1.0))
    return np.array(windows), np.array(bubbles)


def step_times(shape: PipelineShape, durations: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(step_s, bubble_fraction)``, each ``(batch,)``, per row of ``(batch, ops)`` durations:
    the SPEC §2 window (earliest start to latest end) and total idle / (ranks x window), 0 for
    an empty window."""
    sg = shape_graph(shape)
    durations = np.atleast_2d(np.asarray(durations, dtype=np.float64))
    fast = _scalar_times(sg.graph, shape.stages, durations, shape.comm_s)
    if fast is not None:
        return fast
    return engine_step_times(shape, durations)


def engine_step_times(shape: PipelineShape, durations: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`step_times` by the vectorised engine alone (no scalar program): the path for
    large batches, and the reference the scalar program is tested against."""
    sg = shape_graph(shape)
    durations = np.atleast_2d(np.asarray(durations, dtype=np.float64))
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
