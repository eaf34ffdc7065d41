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
"""

from __future__ import annotations

import numpy as np

from bubblecast.errors import BubblecastError
from bubblecast.policy.replaydata import from_replay
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
from bubblecast.sim.steptime import shape_graph, timing_shape
from bubblecast.telemetry.events import Events

__all__ = ["RunData", "StepOutcome", "from_simulation", "has_ground_truth", "load_run"]


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


def has_ground_truth(events: Events, run_id: str) -> bool:
    meta = events.runs[run_id]
    return "workload" in meta.extra and "speed" in events.frame.columns


def load_run(events: Events, run_id: str, layers_per_stage: int = 8) -> RunData:
    """The run's evaluation data: ground truth when it has it, else replay-rescaled."""
    if has_ground_truth(events, run_id):
        return from_simulation(events.run(run_id) if len(events.run_ids) > 1 else events, run_id)
    return from_replay(events.run(run_id) if len(events.run_ids) > 1 else events, run_id,
                       layers_per_stage)
