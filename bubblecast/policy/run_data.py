"""One run, ready for offline policy evaluation: costs, observed speeds, counterfactual steps.

Every compute op's duration is written as ``multiplier x nominal``, where ``nominal`` is the
cost of the layers its (virtual) stage holds for that op type and ``multiplier`` everything
else (the rank's speed, the microbatch's tokens, per-op noise). Moving layers changes only
``nominal``, so an op's counterfactual duration under another partition is ``multiplier x
nominal(new partition)``, and each rank's observed speed (``unit``: its compute over its
nominal) is the same whatever partition a policy chose.

Two modes:

- ``counterfactual`` (simulated runs: the run metadata holds the ``workload`` and the events a
  ``speed`` column): the per-layer costs are the ground truth, so a counterfactual op equals
  what the simulator gives for that partition (noise included); steps are timed with the
  engine on the run's schedule.
- ``replay-rescaled`` (logged runs without ground truth, e.g. a Megatron trace): per-layer
  costs come from the metadata when present, else from each stage's median op time spread
  evenly over the layers it is assumed to hold; steps are re-timed with the replay engine
  (:mod:`bubblecast.sim.replay`), compute ops rescaled by the layers moved, everything else
  (communication, optimizer, collectives) as replayed.

A ``replay-rescaled`` run's per-layer costs are the run metadata's ``workload`` or
``layer_costs`` when present; otherwise each virtual stage's median per-microbatch op time, per
op type, spread evenly over the layers it held (the ``layers`` column, the metadata's
partition, or ``layers_per_stage`` per stage as an explicit assumption). Both modes share the
arithmetic here (:func:`nominal_table`, :func:`multiplier`, :func:`work_unit`,
:func:`fill_nan`) and return a :class:`RunData`; :func:`load_run` picks the mode.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from bubblecast.errors import BubblecastError
from bubblecast.policy.solver import Partition
from bubblecast.sim.shape import PipelineShape, even_partition
from bubblecast.sim.steptime import shape_graph, stage_kind_work, timing_shape
from bubblecast.telemetry.events import Events
from bubblecast.telemetry.schema import RunMeta

__all__ = ["KIND", "RunData", "StepOutcome", "fill_nan", "from_replay", "from_simulation",
           "has_ground_truth", "load_run", "logged_partitions", "multiplier", "nominal_table",
           "work_unit"]

KIND = {"F": 0, "B": 1, "W": 2}


@dataclass
class StepOutcome:
    """Per step: step time (no migration), idle and rank x window seconds (for bubbles)."""

    step_s: np.ndarray
    idle_s: np.ndarray
    cells_s: np.ndarray


@dataclass
class RunData:
    """What the evaluator needs from one run (see the module doc)."""

    run_id: str
    mode: str
    note: str
    pipeline: PipelineShape
    costs: np.ndarray  # (L, 3) F, B, W cost per layer per microbatch
    param_bytes: np.ndarray  # (L,)
    initial: Partition  # per virtual stage, the logged partition at the first step
    steps: np.ndarray  # (T,) step numbers
    unit: np.ndarray  # (T, D, P) observed per-rank speed
    outcome: Callable[[np.ndarray], StepOutcome]  # (T, V) partitions per step -> outcome
    activation_bytes: np.ndarray | None = None  # (L,) per microbatch, when known
    extra: dict = field(default_factory=dict)  # the run metadata's extra (measured migrations)

    @property
    def history(self) -> np.ndarray:
        """``(T, P)``: the slowest replica's speed per rank (it paces the step)."""
        return self.unit.max(axis=1)

    def constant(self, partitions: list[Partition]) -> np.ndarray:
        """``(K, T)`` realised step times when each partition is kept for the whole run."""
        T = len(self.steps)
        return np.stack([self.outcome(np.tile(np.asarray(p), (T, 1))).step_s
                         for p in partitions])


def nominal_table(parts: np.ndarray, costs: np.ndarray, split: bool
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Unique partitions and their ``(U, 3, V)`` nominal cost per op kind (B+W merged when the
    schedule does not split the backward)."""
    uniq, inverse = np.unique(np.asarray(parts, dtype=np.int64), axis=0, return_inverse=True)
    table = np.stack([stage_kind_work(tuple(int(x) for x in p), costs) for p in uniq])
    if not split:
        table[:, 1] += table[:, 2]
        table[:, 2] = 0.0
    return table, inverse.reshape(-1)


def logged_partitions(meta: RunMeta, steps: np.ndarray, layers: int, v: int) -> np.ndarray:
    """``(T, V)`` logged partition per step (``partition_steps`` when it changed)."""
    base = meta.partition
    if base is None or len(base) != v:
        if base is not None and len(base) * meta.chunks == v:
            from bubblecast.sim.workload import expand_partition

            base = expand_partition(base, layers, meta.stages, meta.chunks).tolist()
        else:
            base = even_partition(layers, v)
    out = np.tile(np.asarray(base, dtype=np.int64), (len(steps), 1))
    for first, part in meta.extra.get("partition_steps", []) or []:
        out[steps >= int(first)] = np.asarray(part, dtype=np.int64)
    return out


def multiplier(duration: np.ndarray, nominal: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    """Each op's duration over its nominal cost (``fallback`` where the nominal is 0)."""
    ok = nominal > 0
    return np.where(ok, duration / np.where(ok, nominal, 1.0), fallback)


def work_unit(mult_weighted: np.ndarray, nominal: np.ndarray, key: np.ndarray, n: int
              ) -> np.ndarray:
    """Per group: sum of durations over sum of nominal costs (a work-weighted mean speed)."""
    dur = np.bincount(key, mult_weighted, minlength=n)
    nom = np.bincount(key, nominal, minlength=n)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = dur / nom
    return np.where(nom > 0, out, np.nan)


def fill_nan(unit: np.ndarray) -> np.ndarray:
    """Ranks that held no work at a step keep their previous (or 1.0) speed."""
    out = unit.copy()
    flat = out.reshape(out.shape[0], -1)
    frame = pd.DataFrame(flat).ffill().bfill().fillna(1.0)
    return frame.to_numpy().reshape(out.shape)


def from_simulation(events: Events, run_id: str) -> RunData:
    """A simulated run (``counterfactual`` mode); see the module doc."""
    from bubblecast.sim.engine import simulate
    from bubblecast.sim.workload import Workload, work_factor

    meta = events.runs[run_id]
    wl = Workload.from_json(meta.extra["workload"], f"run '{run_id}' metadata")
    costs = np.stack([wl.forward, wl.backward - wl.weight, wl.weight], axis=1) / 1000.0
    comm = float(meta.extra.get("sim", {}).get("comm_ms", 0.0)) / 1000.0
    pipe = timing_shape(meta.schedule, meta.stages, meta.microbatches, meta.chunks, comm)
    sg = shape_graph(pipe)
    comp = events.compute()
    steps = np.unique(comp["step"].to_numpy(np.int64))
    T, D, P, n = len(steps), meta.replicas, meta.stages, sg.graph.n_ops
    ti = np.searchsorted(steps, comp["step"].to_numpy(np.int64))
    d = comp["replica"].to_numpy(np.int64)
    op_index = {(int(s), int(c), int(m), int(k)): i for i, (s, c, m, k) in
                enumerate(zip(sg.stage, sg.chunk, sg.microbatch, sg.kind, strict=True))}
    kinds = comp["op"].astype(str).map(KIND).to_numpy(np.int64)
    key = zip(comp["stage"].to_numpy(), comp["chunk"].to_numpy(), comp["microbatch"].to_numpy(),
              kinds, strict=True)
    try:
        col = np.fromiter((op_index[(int(a), int(b), int(c), int(k))] for a, b, c, k in key),
                          dtype=np.int64, count=len(comp))
    except KeyError as exc:
        raise BubblecastError(f"run '{run_id}': op {exc.args[0]} is not in the "
                              f"{meta.schedule} schedule the metadata names") from None
    if len(comp) != T * D * n:
        raise BubblecastError(f"run '{run_id}': {len(comp)} compute ops, expected {T * D * n} "
                              f"({T} steps x {D} replicas x {n})")
    dur = np.zeros((T, D, n))
    dur[ti, d, col] = comp["duration_s"].to_numpy(np.float64)
    layers = wl.n_layers
    logged = logged_partitions(meta, steps, layers, pipe.virtual_stages)
    table, inv = nominal_table(logged, costs, pipe.split_backward)
    vs, kind = sg.virtual_stage, sg.kind
    nominal = table[inv][:, kind, vs]  # (T, n)
    # Fallback multiplier where an op's nominal cost is 0: ground-truth speed x token work.
    speed = np.ones((T, D, n))
    if "speed" in comp.columns:
        speed[ti, d, col] = comp["speed"].to_numpy(np.float64)
    tok = np.ones((T, D, n))
    if "tokens" in comp.columns and "tokens_model" in meta.extra:
        tm = meta.extra["tokens_model"]
        tok[ti, d, col] = work_factor(comp["tokens"].to_numpy(np.float64),
                                      tm.get("mean_tokens", 1.0), tm.get("quadratic_share", 0.0))
    mult = multiplier(dur, nominal[:, None, :], speed * tok)
    # Observed speed: compute over nominal work, the known-ahead token work divided out.
    rank_key = (np.arange(T)[:, None, None] * D + np.arange(D)[None, :, None]) * P \
        + sg.stage[None, None, :]
    nom_b = np.broadcast_to(nominal[:, None, :], dur.shape)
    unit = work_unit((mult / tok * nom_b).ravel(), nom_b.ravel(), rank_key.ravel(), T * D * P)
    unit = fill_nan(unit.reshape(T, D, P))

    def outcome(parts: np.ndarray) -> StepOutcome:
        tab, inv2 = nominal_table(parts, costs, pipe.split_backward)
        new = tab[inv2][:, kind, vs]  # (T, n)
        durations = (mult * new[:, None, :]).reshape(T * D, n)
        start, end = simulate(sg.graph, durations, comm=comm)
        window = (end.max(axis=1) - start.min(axis=1)).reshape(T, D)
        busy = durations.sum(axis=1).reshape(T, D)
        cells = P * window
        return StepOutcome(end.max(axis=1).reshape(T, D).max(axis=1),
                           (cells - busy).sum(axis=1), cells.sum(axis=1))

    return RunData(run_id, "counterfactual",
                   "counterfactual op times from the simulation's ground truth (speeds, tokens, "
                   "noise) and its per-layer costs, timed with the engine", pipe, costs,
                   wl.param_bytes.copy(), tuple(int(x) for x in logged[0]), steps, unit, outcome,
                   wl.activation_bytes.copy(), dict(meta.extra))


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


def has_ground_truth(events: Events, run_id: str) -> bool:
    meta = events.runs[run_id]
    return "workload" in meta.extra and "speed" in events.frame.columns


def load_run(events: Events, run_id: str, layers_per_stage: int = 8) -> RunData:
    """The run's evaluation data: ground truth when it has it, else replay-rescaled."""
    if has_ground_truth(events, run_id):
        return from_simulation(events.run(run_id) if len(events.run_ids) > 1 else events, run_id)
    return from_replay(events.run(run_id) if len(events.run_ids) > 1 else events, run_id,
                       layers_per_stage)
