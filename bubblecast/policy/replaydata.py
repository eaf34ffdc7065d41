"""Evaluation data of a logged run without ground truth (``replay-rescaled`` mode).

See :mod:`bubblecast.policy.rundata` (which imports this module, never the reverse).
Per-layer costs: the run metadata's ``workload`` or ``layer_costs`` when present; otherwise
each virtual stage's median per-microbatch op time, per op type, spread evenly over the layers
it held (the ``layers`` column, the metadata's partition, or ``layers_per_stage`` per stage as
an explicit assumption). Counterfactual steps are re-timed with
:class:`bubblecast.sim.replay.ReplayModel`.
"""

from __future__ import annotations

import numpy as np

from bubblecast.errors import BubblecastError
from bubblecast.policy.runcore import (
    KIND,
    RunData,
    StepOutcome,
    fill_nan,
    logged_partitions,
    multiplier,
    nominal_table,
    work_unit,
)
from bubblecast.sim.shape import PipelineShape
from bubblecast.sim.steptime import timing_shape
from bubblecast.telemetry.events import Events


def _meta_costs(extra: dict) -> np.ndarray | None:
    if "workload" in extra:
        from bubblecast.sim.workload import Workload

        wl = Workload.from_json(extra["workload"], "run metadata")
        return np.stack([wl.forward, wl.backward - wl.weight, wl.weight], axis=1) / 1000.0
    value = extra.get("layer_costs")
    if isinstance(value, dict) and {"layer", "forward_s", "total_s"} <= set(value):
        # The runtime's per-layer samples: median forward and backward (total - forward).
        layer = np.asarray(value["layer"], dtype=np.int64)
        fwd = np.asarray(value["forward_s"], dtype=np.float64)
        tot = np.asarray(value["total_s"], dtype=np.float64)
        if layer.size and layer.size == fwd.size == tot.size and layer.min() >= 0:
            n = int(layer.max()) + 1
            out = np.zeros((n, 3))
            for i in range(n):
                sel = layer == i
                if sel.any():
                    out[i, 0] = np.median(fwd[sel])
                    out[i, 1] = max(float(np.median(tot[sel] - fwd[sel])), 0.0)
            return out if np.all(out[:, :2].sum(axis=1) > 0) else None
        return None
    if isinstance(value, dict):
        cols = [np.asarray(value.get(k, []), dtype=np.float64) for k in ("f", "b", "w")]
        n = max(len(c) for c in cols)
        if n:
            return np.stack([c if len(c) == n else np.zeros(n) for c in cols], axis=1)
    elif isinstance(value, (list, tuple)) and value:
        c = np.asarray(value, dtype=np.float64)
        return np.stack([c / 3, c / 3, c / 3], axis=1)
    return None


def _layers_column(f, steps: np.ndarray, stages: int, layers: int) -> np.ndarray | None:
    """``(T, P)`` layers per stage per step from the ``layers`` column, when it is complete and
    every step holds all ``layers`` (a run repartitioned as it went, e.g. by the runtime)."""
    if "layers" not in f.columns or f["layers"].isna().any():
        return None
    table = f.groupby(["step", "stage"])["layers"].first().unstack()
    if table.shape[1] != stages or table.isna().any().any():
        return None
    out = table.reindex(steps).to_numpy()
    if np.isnan(out.astype(np.float64)).any() or np.any(out.sum(axis=1) != layers) \
            or np.any(out < 1):
        return None
    return out.astype(np.int64)


def _median_costs(per_layer: np.ndarray, vs: np.ndarray, kind: np.ndarray,
                  partition: np.ndarray, layers: int) -> np.ndarray:
    """``(layers, 3)`` costs: each virtual stage's median per-layer op time, per op kind,
    spread over the layers it holds in ``partition``."""
    costs = np.zeros((layers, 3))
    edges = np.r_[0, np.cumsum(partition)]
    for s in range(len(partition)):
        for k in range(3):
            sel = (vs == s) & (kind == k)
            costs[edges[s]:edges[s + 1], k] = float(np.median(per_layer[sel])) \
                if sel.any() else 0.0
    return costs


def from_replay(events: Events, run_id: str, layers_per_stage: int = 8) -> RunData:
    """A logged run re-timed by the replay engine with compute rescaled by the layers moved."""
    from bubblecast.sim.replay import ReplayModel

    if layers_per_stage < 1:
        raise BubblecastError(f"layers_per_stage: must be >= 1, got {layers_per_stage}")
    meta = events.runs[run_id]
    model = ReplayModel(events, run_id)
    f = model.frame
    P, V, D = meta.stages, meta.stages * meta.chunks, meta.replicas
    split = bool((f["op"] == "W").any())
    try:
        pipe = timing_shape(meta.schedule if meta.schedule != "unknown" else "1f1b", P,
                            meta.microbatches, meta.chunks, float(model.comm))
    except BubblecastError:  # shape only; replay times steps
        pipe = PipelineShape("1f1b", P, 1, 1, float(model.comm))
    comp = np.flatnonzero(model.is_compute)
    steps = np.asarray(model.steps, dtype=np.int64)
    order = np.argsort(steps)
    steps = steps[order]
    step_of = f["step"].to_numpy(np.int64)[comp]
    ti = np.searchsorted(steps, step_of)
    stage = f["stage"].to_numpy(np.int64)[comp]
    vs = f["chunk"].to_numpy(np.int64)[comp] * P + stage
    d = f["replica"].to_numpy(np.int64)[comp]
    kind = f["op"].astype(str).map(KIND).to_numpy()[comp].astype(np.int64)
    dur = model.observed[comp]
    costs = _meta_costs(meta.extra)
    note = "replay-rescaled: no ground truth in this run; "
    if costs is None:
        if meta.partition is not None:
            layers = int(sum(meta.partition))
        elif "layers" in f.columns and f["layers"].notna().any():
            layers = int(f.loc[f["step"] == steps[0]].groupby("stage")["layers"].first().sum())
        else:
            layers = layers_per_stage * V
            note += f"assumed {layers_per_stage} equal layers per stage; "
        logged = _layers_column(f, steps, P, layers) if meta.chunks == 1 else None
        if logged is None:
            logged = logged_partitions(meta, steps, layers, V)
        costs = _median_costs(dur / logged[ti, vs], vs, kind, logged[0], layers)
        note += "per-layer costs from each stage's median op time; "
    else:
        logged = _layers_column(f, steps, P, len(costs)) if meta.chunks == 1 else None
        if logged is None:
            logged = logged_partitions(meta, steps, len(costs), V)
        note += "per-layer costs from the run metadata; "
    note += "steps re-timed by the replay engine with compute scaled by the layers moved"
    table, inv = nominal_table(logged, costs, split)
    nominal = table[inv[ti], kind, vs]
    mult = multiplier(dur, nominal, np.ones_like(dur))
    T = len(steps)
    rank_key = (ti * D + d) * P + stage
    unit = fill_nan(work_unit(mult * nominal, nominal, rank_key, T * D * P).reshape(T, D, P))
    step_pos = np.searchsorted(steps, np.asarray(model.steps, dtype=np.int64))
    group = ti * D + d

    def outcome(parts: np.ndarray) -> StepOutcome:
        tab, inv2 = nominal_table(parts, costs, split)
        durations = model.pure.copy()
        durations[comp] = mult * tab[inv2[ti], kind, vs]
        res = model.run(durations)
        step_s = np.empty(T)
        step_s[step_pos] = res.replayed_step_s
        lo = np.full(T * D, np.inf)
        hi = np.full(T * D, -np.inf)
        np.minimum.at(lo, group, res.start[comp])
        np.maximum.at(hi, group, res.end[comp])
        window = np.where(np.isfinite(lo), hi - lo, 0.0)
        busy = np.bincount(group, durations[comp], minlength=T * D)
        cells = P * window
        return StepOutcome(step_s, (cells - busy).reshape(T, D).sum(axis=1),
                           cells.reshape(T, D).sum(axis=1))

    return RunData(run_id, "replay-rescaled", note, pipe, costs, np.zeros(len(costs)),
                   tuple(int(x) for x in logged[0]), steps, unit, outcome, None, dict(meta.extra))
