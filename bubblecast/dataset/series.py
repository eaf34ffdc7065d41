"""Events -> one row per (run, replica, stage, step): compute seconds, work held, delay signal.

The delay signal ``y`` is the rank's compute time per unit of work it held at the step. Work is
the cost of the layers the stage held (per-layer costs from the run metadata when known, else
the layer count, else 1) times the microbatch load (tokens processed when the ``tokens`` column
is filled, else the number of microbatches). Because work moves with the layers, ``y`` keeps
its meaning across a repartition: a forecast of ``y`` times the work a stage will hold is a
forecast in seconds for any partition.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from bubblecast.errors import BubblecastError
from bubblecast.telemetry.events import Events
from bubblecast.telemetry.schema import RunMeta

KEYS: list[str] = ["run_id", "replica", "stage", "step"]
#: The events columns the dataset reads (step series and covariates' rank map); the optional
#: ones among them are what ``read_events(path, columns=EVENT_COLUMNS)`` needs besides the
#: required columns it always reads.
EVENT_COLUMNS: tuple[str, ...] = ("run_id", "replica", "stage", "step", "rank", "chunk", "op",
                                  "duration_s", "layers", "tokens", "speed")

#: Keys of ``RunMeta.extra`` read for per-layer costs (a list) besides the simulator's
#: ``workload`` (per-layer ``forward_ms`` + ``backward_ms``, converted to seconds).
LAYER_COST_KEYS: tuple[str, ...] = ("layer_costs",)


def layer_costs(meta: RunMeta) -> np.ndarray | None:
    """Per-layer compute cost of one microbatch (F + B + W), or None when unknown.

    From the simulator's ``workload`` (ms, returned in seconds so that ``y`` is the rank's
    slowdown factor, 1 = nominal) or a plain ``layer_costs`` list in any unit.
    """
    workload = meta.extra.get("workload")
    if isinstance(workload, dict) and isinstance(workload.get("layers"), list):
        try:
            return np.array([float(x["forward_ms"]) + float(x["backward_ms"])
                             for x in workload["layers"]]) * 1e-3
        except (KeyError, TypeError, ValueError):
            return None
    for key in LAYER_COST_KEYS:
        value = meta.extra.get(key)
        if isinstance(value, (list, tuple)) and value:
            if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in value):
                bad = next(x for x in value if not isinstance(x, (int, float))
                           or isinstance(x, bool))
                raise BubblecastError(f"run metadata '{key}': expected a list of numbers, "
                                      f"got {type(bad).__name__} {bad!r:.40}")
            return np.asarray(value, dtype=np.float64)
    return None


def tokens_ref(meta: RunMeta) -> float:
    """Tokens that count as one unit of microbatch load (the mean tokens when known, else 1)."""
    model = meta.extra.get("tokens_model")
    if isinstance(model, dict) and isinstance(model.get("mean_tokens"), (int, float)) \
            and model["mean_tokens"] > 0:
        return float(model["mean_tokens"])
    value = meta.extra.get("tokens_ref")
    return float(value) if isinstance(value, (int, float)) and value > 0 else 1.0


def scenario_name(meta: RunMeta) -> str:
    """The run's scenario label (the simulator stores a dict with a ``name``)."""
    scen = meta.extra.get("scenario", "unknown")
    if isinstance(scen, dict):
        scen = scen.get("name", "unknown")
    return str(scen)


def _group_codes(frame: pd.DataFrame) -> tuple[np.ndarray, pd.DataFrame]:
    """Dense group id per row for (run, replica, stage, step), sorted, and the key frame."""
    run = frame["run_id"].cat.codes.to_numpy()
    replica, stage = frame["replica"].to_numpy(), frame["stage"].to_numpy()
    step = frame["step"].to_numpy()
    n_rep, n_stage, n_step = (int(replica.max()) + 1, int(stage.max()) + 1,
                              int(step.max()) + 1)
    key = run.astype(np.int64)  # built in place: one int64 array, no temporary per column
    for values, span in ((replica, n_rep), (stage, n_stage), (step, n_step)):
        key *= span
        key += values
    if key.size and int(key.max()) < 4 * key.size + 4096:  # dense keys: no sort
        present = np.zeros(int(key.max()) + 1, dtype=bool)
        present[key] = True
        uniq = np.flatnonzero(present)
        index = np.cumsum(present, dtype=np.int64) - 1
        del present
        inverse = index[key]
    else:
        uniq, inverse = np.unique(key, return_inverse=True)
    del key
    s, rest = uniq % n_step, uniq // n_step
    g, rest = rest % n_stage, rest // n_stage
    r, run_code = rest % n_rep, rest // n_rep
    cats = frame["run_id"].cat.categories
    keys = pd.DataFrame({
        "run_id": pd.Categorical.from_codes(run_code.astype(np.int32), categories=cats),
        "replica": r.astype(np.int32), "stage": g.astype(np.int32), "step": s.astype(np.int64),
    })
    return inverse.astype(np.int64, copy=False), keys


def run_slices(keys: pd.DataFrame) -> dict[str, slice]:
    """Row range of each run in a frame sorted by run (category code order)."""
    codes = keys["run_id"].cat.codes.to_numpy()
    cats = keys["run_id"].cat.categories
    bounds = np.searchsorted(codes, np.arange(len(cats) + 1))
    return {str(c): slice(int(bounds[i]), int(bounds[i + 1])) for i, c in enumerate(cats)
            if bounds[i + 1] > bounds[i]}


def _layers_per_group(frame: pd.DataFrame, inverse: np.ndarray, n: int) -> np.ndarray:
    """Layers the rank held per group (the ``layers`` column is the rank's total; NaN if absent)."""
    if "layers" not in frame.columns:
        return np.full(n, np.nan)
    column = frame["layers"]
    per = np.full(n, -np.inf)
    if isinstance(column.dtype, np.dtype) and column.dtype.kind in "iu":  # no nulls: as is
        values = column.to_numpy()
    else:
        values = np.nan_to_num(column.to_numpy(dtype=np.float64, na_value=np.nan), nan=-np.inf)
    # A rank holds one layer count at a step: one value per group is its maximum (a scatter
    # and a check, not maximum.at's slow unbuffered loop over every event)
    per[inverse] = values
    if not (per[inverse] == values).all():
        per[:] = -np.inf
        np.maximum.at(per, inverse, values)
    return np.where(np.isfinite(per), per, np.nan)


def _static_layers(keys: pd.DataFrame, runs: dict[str, RunMeta],
                   slices: dict[str, slice]) -> np.ndarray:
    """Layers per stage from each run's static ``partition`` (summed over chunks)."""
    out = np.full(len(keys), np.nan)
    stage = keys["stage"].to_numpy()
    for run_id, rows in slices.items():
        meta = runs.get(run_id)
        if meta is None or meta.partition is None:
            continue
        part = np.asarray(meta.partition, dtype=np.float64)
        per_stage = part.reshape(-1, meta.stages).sum(axis=0) if len(part) != meta.stages \
            else part
        out[rows] = per_stage[np.clip(stage[rows], 0, meta.stages - 1)]
    return out


def _virtual_partitions(meta: RunMeta, steps: np.ndarray) -> np.ndarray | None:
    """Layers per virtual stage at each of ``steps`` from ``partition`` and the simulator's
    ``partition_steps`` (``[[first_step, partition], ...]``); None when not per virtual stage."""
    width = meta.stages * meta.chunks
    changes = meta.extra.get("partition_steps")
    if isinstance(changes, list) and changes:
        firsts = np.array([int(c[0]) for c in changes])
        table = np.array([c[1] for c in changes], dtype=np.int64)
    elif meta.partition is not None:
        firsts, table = np.array([0]), np.array([meta.partition], dtype=np.int64)
    else:
        return None
    if table.shape[1] != width:
        return None
    idx = np.clip(np.searchsorted(firsts, steps, side="right") - 1, 0, len(firsts) - 1)
    return table[idx]


def _cost_held(keys: pd.DataFrame, layers: np.ndarray, runs: dict[str, RunMeta],
               slices: dict[str, slice]) -> np.ndarray:
    """Cost of the layers each rank held (per microbatch) at each step.

    Virtual stages hold consecutive layers (virtual stage ``c * P + s`` is chunk ``c`` of stage
    ``s``). With one chunk the blocks follow from the ``layers`` column (any repartition is
    seen); with several, from the run's partition metadata. Without per-layer costs the cost
    is the layer count (or 1 when unknown).
    """
    cost = np.where(np.isfinite(layers), layers, 1.0)
    all_step, all_stage = keys["step"].to_numpy(), keys["stage"].to_numpy()
    all_replica = keys["replica"].to_numpy()
    for run_id, rows in slices.items():
        meta = runs.get(run_id)
        try:
            costs = layer_costs(meta) if meta is not None else None
        except BubblecastError as exc:
            raise BubblecastError(f"run '{run_id}': {exc}") from None
        if costs is None:
            continue
        prefix = np.r_[0.0, np.cumsum(costs)]
        idx = np.arange(rows.start, rows.stop)
        step, stage = all_step[rows], all_stage[rows]
        parts = _virtual_partitions(meta, step) if meta.chunks > 1 else None
        if parts is not None:
            bounds = np.concatenate([np.zeros((len(parts), 1), dtype=np.int64),
                                     np.cumsum(parts, axis=1)], axis=1)
            if bounds[:, -1].max() > len(costs):
                raise BubblecastError(f"run '{run_id}': the partition holds "
                                      f"{int(bounds[:, -1].max())} layers but the metadata "
                                      f"lists {len(costs)} layer costs")
            held = np.zeros(len(idx))
            rows = np.arange(len(idx))
            for c in range(meta.chunks):
                v = c * meta.stages + stage
                held += prefix[bounds[rows, v + 1]] - prefix[bounds[rows, v]]
            cost[idx] = held
            continue
        ok = np.isfinite(layers[idx])
        if not ok.all():
            continue
        lay = layers[idx].astype(np.int64)
        replica = all_replica[rows]
        # Rows are sorted by (replica, stage, step); order them by (replica, step, stage) so a
        # cumulative sum over stages gives each stage's first layer.
        order = np.lexsort((stage, step, replica))
        lay_o = lay[order]
        grp = replica[order] * (step.max() + 1) + step[order]
        csum = np.cumsum(lay_o)
        first = np.r_[True, grp[1:] != grp[:-1]]
        base = np.maximum.accumulate(np.where(first, csum - lay_o, 0))
        start = csum - lay_o - base
        end = start + lay_o
        if end.max() > len(costs):
            raise BubblecastError(f"run '{run_id}': stages hold {int(end.max())} layers but the "
                                  f"metadata lists {len(costs)} layer costs")
        held = np.empty(len(idx))
        held[order] = prefix[end] - prefix[start]
        cost[idx] = held
    return cost


def step_series(events: Events) -> pd.DataFrame:
    """One row per (run, replica, stage, step) with ``compute_s``, ``work`` and ``y``.

    Columns: the keys, ``compute_s`` (summed compute-op seconds), ``microbatches``, ``layers``
    (NaN when unknown), ``cost`` (cost of the layers held), ``tokens`` and ``tokens2`` (sum of
    tokens and of squared tokens over the step's microbatches; NaN when unknown), ``work``,
    ``y`` = compute_s / work, and ``speed`` (the simulator's ground truth) when present.
    Sorted by keys, so each (run, replica, stage) series is contiguous and ordered by step.
    """
    frame = events.frame
    is_compute = frame["op"].isin(["F", "B", "W"]).to_numpy()
    # only the columns used, and no copy at all when every row is a compute op (simulated
    # and most recorded runs): a copy of 10M events is most of the dataset's memory
    used = [c for c in EVENT_COLUMNS if c in frame.columns]
    comp = frame[used] if is_compute.all() else frame.loc[is_compute, used]
    if comp.empty:
        raise BubblecastError("events: no compute ops (F, B, W) to build a dataset from")
    if not isinstance(comp["run_id"].dtype, pd.CategoricalDtype):
        comp = comp.assign(run_id=comp["run_id"].astype("category"))
    runs = comp["run_id"].cat
    codes = runs.codes.to_numpy()
    if not codes.size or codes.min() < 0 or (np.bincount(codes, minlength=len(
            runs.categories)) == 0).any():
        comp = comp.assign(run_id=runs.remove_unused_categories())  # (a sort of every code)
    inverse, keys = _group_codes(comp)
    n = len(keys)
    compute_s = np.bincount(inverse, weights=comp["duration_s"].to_numpy(), minlength=n)
    is_f = (comp["op"] == "F").to_numpy() & (comp["chunk"].to_numpy() == 0)
    mbs = np.bincount(inverse[is_f], minlength=n).astype(np.float64)
    out = keys
    out["compute_s"] = compute_s
    out["microbatches"] = np.where(mbs > 0, mbs, np.nan)
    slices = run_slices(keys)
    layers = _layers_per_group(comp, inverse, n)
    if not np.isfinite(layers).all():
        layers = np.where(np.isfinite(layers), layers, _static_layers(keys, events.runs, slices))
    out["layers"] = layers
    out["cost"] = _cost_held(keys, layers, events.runs, slices)
    tokens = np.full(n, np.nan)
    tokens2 = np.full(n, np.nan)
    if "tokens" in comp.columns:
        tok = comp["tokens"].array[is_f].to_numpy(dtype=np.float64, na_value=np.nan)
        ok = np.isfinite(tok)
        sums = np.bincount(inverse[is_f][ok], weights=tok[ok], minlength=n)
        sq = np.bincount(inverse[is_f][ok], weights=tok[ok] ** 2, minlength=n)
        cnt = np.bincount(inverse[is_f][ok], minlength=n)
        full = (cnt > 0) & (cnt == mbs)
        tokens[full], tokens2[full] = sums[full], sq[full]
    out["tokens"] = tokens
    out["tokens2"] = tokens2
    ref = np.ones(n)
    for run_id, rows in slices.items():
        if run_id in events.runs:
            ref[rows] = tokens_ref(events.runs[run_id])
    load = np.where(np.isfinite(tokens), tokens / ref, np.nan_to_num(mbs, nan=1.0))
    load = np.where(load > 0, load, 1.0)
    out["work"] = out["cost"].to_numpy() * load
    out["y"] = compute_s / out["work"].to_numpy()
    if "speed" in comp.columns:
        spd = comp["speed"].to_numpy(dtype=np.float64, na_value=np.nan)
        ok = np.isfinite(spd)
        if ok.all():  # no subset copies of 10M values
            tot, cnt = (np.bincount(inverse, weights=spd, minlength=n),
                        np.bincount(inverse, minlength=n))
        else:
            tot = np.bincount(inverse[ok], weights=spd[ok], minlength=n)
            cnt = np.bincount(inverse[ok], minlength=n)
        with np.errstate(invalid="ignore", divide="ignore"):
            out["speed"] = np.where(cnt > 0, tot / np.maximum(cnt, 1), np.nan)
    cats = out["run_id"].cat.categories
    scen = np.array([scenario_name(events.runs[str(c)]) if str(c) in events.runs
                     else "unknown" for c in cats], dtype=object)
    out["scenario"] = pd.Categorical(scen[out["run_id"].cat.codes.to_numpy()])
    return out
