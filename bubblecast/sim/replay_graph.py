"""Dependency graph of one logged step, for replay (see :mod:`bubblecast.sim.replay`).

Columns are a step's ops in lane order (by rank, then start). Fused sends and receives of a
rank form one *unit*; units that exchange data (a send and its receive, the participants of a
collective) form an *exchange*, which the engine times with a zero-length barrier node that
every participant waits for and that waits for every participant's previous op. Direct compute
dependencies (F after the previous virtual stage's F, B after the next one's B) pay the
communication lag when they cross ranks. With ``joins``, each unit is preceded by a node
holding its launch delay.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from bubblecast.sim.engine import OpGraph
from bubblecast.sim.schedules import lookup_schedule, vstage_ranks
from bubblecast.telemetry.schema import COMM_OPS, OPS, RunMeta

OP_INDEX = {op: i for i, op in enumerate(OPS)}
_OP = OP_INDEX
_PARTNER = {_OP["SEND_F"]: (_OP["RECV_F"], 1), _OP["SEND_B"]: (_OP["RECV_B"], -1)}


@dataclass
class StepLayout:
    """Dependency structure shared by a group of steps; columns are ops in lane order."""

    unit_first: np.ndarray  # (U,) first column of each unit (fused ops form one unit)
    col_unit: np.ndarray  # (n,) unit of each column
    unit_prev: np.ndarray  # (U,) previous unit on the lane, -1 if none
    unit_comp: np.ndarray  # (U,) exchange the unit takes part in, -1 if none
    dep_src: np.ndarray  # (k,) producer column of each direct compute dependency
    dep_dst: np.ndarray  # (k,) consumer column
    unpaired_recv: np.ndarray  # (n,) receives with no matching send
    graph: OpGraph
    joins: bool  # units are preceded by a launch-delay node


def _codes(*keys: np.ndarray) -> np.ndarray:
    """One dense int64 code per row of the key columns (equal rows, equal codes), column by
    column (each step re-densified, so the codes never overflow)."""
    code = np.zeros(len(keys[0]), dtype=np.int64)
    for key in keys:
        uniq, inverse = np.unique(np.asarray(key), return_inverse=True)
        code = code * len(uniq) + inverse.reshape(-1)
        code = np.unique(code, return_inverse=True)[1].reshape(-1)
    return code


def _cumcount(*keys: np.ndarray) -> np.ndarray:
    """Occurrence number of each row among the rows with its keys, in row order (pandas'
    groupby cumcount)."""
    code = _codes(*keys)
    order = np.argsort(code, kind="stable")
    sorted_code = code[order]
    starts = np.flatnonzero(np.r_[True, sorted_code[1:] != sorted_code[:-1]])
    run_start = np.repeat(starts, np.diff(np.r_[starts, len(code)]))
    out = np.empty(len(code), dtype=np.int64)
    out[order] = np.arange(len(code)) - run_start
    return out


def _join(left: list[np.ndarray], right: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Rows of an inner join on the key columns, in left order (as pandas' merge): (left row,
    right row) pairs; by codes when the right keys are unique, else by pandas."""
    nl = len(left[0])
    codes = _codes(*(np.r_[a, b] for a, b in zip(left, right, strict=True)))
    lc, rc = codes[:nl], codes[nl:]
    order = np.argsort(rc, kind="stable")
    rs = rc[order]
    if len(rs) and not (rs[1:] == rs[:-1]).any():
        at = np.minimum(np.searchsorted(rs, lc), max(len(rs) - 1, 0))
        hit = np.flatnonzero(rs[at] == lc) if len(rs) else np.zeros(0, dtype=np.int64)
        return hit, order[at[hit]]
    cols = [str(i) for i in range(len(left))]
    pairs = pd.DataFrame(dict(zip(cols, left, strict=True)) | {"_l": np.arange(nl)}).merge(
        pd.DataFrame(dict(zip(cols, right, strict=True)) | {"_r": np.arange(len(right[0]))}),
        on=cols)
    return pairs["_l"].to_numpy(np.int64), pairs["_r"].to_numpy(np.int64)


def exchange_edges(c: dict[str, np.ndarray], stages: int, pair_p2p: bool = True
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Column pairs that belong to one exchange, and which receives found their send."""
    n = len(c["op"])
    cols = np.arange(n)
    is_p2p = np.isin(c["op"], [_OP[o] for o in COMM_OPS]) & pair_p2p
    occ = np.full(n, -1)
    occ[is_p2p] = _cumcount(c["rank"][is_p2p], c["op"][is_p2p])
    sends = np.flatnonzero(np.isin(c["op"], list(_PARTNER)) & is_p2p)
    partner = np.array([_PARTNER[o][0] for o in c["op"][sends]], dtype=np.int64)
    shift = np.array([_PARTNER[o][1] for o in c["op"][sends]], dtype=np.int64)
    left = [c["replica"][sends], c["tp"][sends], (c["stage"][sends] + shift) % stages, partner,
            occ[sends]]
    recvs = np.flatnonzero(np.isin(c["op"], [_OP["RECV_F"], _OP["RECV_B"]]) & is_p2p)
    right = [c["replica"][recvs], c["tp"][recvs], c["stage"][recvs], c["op"][recvs],
             occ[recvs]]
    li, ri = _join(left, right)
    a, b = [sends[li].astype(np.int64)], [recvs[ri].astype(np.int64)]
    paired = np.zeros(n, dtype=bool)
    paired[b[0]] = True
    coll = np.flatnonzero(c["group"] != "")
    if coll.size:
        g = c["group"][coll]
        occ_c = _cumcount(c["rank"][coll], c["kind"][coll])
        k1 = np.select([g == "dp", g == "pp", g == "tp"],
                       [c["stage"][coll], c["replica"][coll], c["replica"][coll]], -1)
        k2 = np.select([g == "dp", g == "pp", g == "tp"],
                       [c["tp"][coll], c["tp"][coll], c["stage"][coll]], -1)
        code = _codes(c["kind"][coll], occ_c, k1, k2)
        _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
        a.append(cols[coll][first[inverse.reshape(-1)]].astype(np.int64))
        b.append(cols[coll])
    return np.concatenate(a), np.concatenate(b), paired


def components(a: np.ndarray, b: np.ndarray, n: int) -> np.ndarray:
    """Exchange id of each unit (connected components of size >= 2), -1 for none.

    Union-find by hooking roots onto the smaller root, then path compression, vectorised.
    """
    keep = a != b
    a, b = a[keep], b[keep]
    parent = np.arange(n)
    while True:
        ra, rb = parent[a], parent[b]
        diff = ra != rb
        if not diff.any():
            break
        np.minimum.at(parent, np.maximum(ra[diff], rb[diff]), np.minimum(ra[diff], rb[diff]))
        while True:
            nxt = parent[parent]
            if (nxt == parent).all():
                break
            parent = nxt
    size = np.bincount(parent, minlength=n)
    big = size[parent] > 1
    comp = np.full(n, -1, dtype=np.int64)
    _, first, inverse = np.unique(parent[big], return_index=True, return_inverse=True)
    comp[big] = np.argsort(np.argsort(first))[inverse.reshape(-1)]  # in order of appearance
    return comp


def compute_deps(c: dict[str, np.ndarray], stages: int) -> tuple[np.ndarray, np.ndarray]:
    """F after the previous virtual stage's F, B after the next one's B (same microbatch)."""
    fb = np.flatnonzero(np.isin(c["op"], [_OP["F"], _OP["B"]]) & (c["mb"] >= 0))
    vstage = c["vstage"][fb]
    op = c["op"][fb]
    keys = [c["replica"][fb], c["tp"][fb], vstage, c["mb"][fb], op]
    want = keys[:2] + [np.where(op == _OP["F"], vstage - 1, vstage + 1)] + keys[3:]
    dst, src = _join(want, keys)
    return fb[src].astype(np.int64), fb[dst].astype(np.int64)


def build_layout(c: dict[str, np.ndarray], stages: int, joins: bool,
                 pair_p2p: bool = True) -> StepLayout:
    fused = c["fused"]
    col_unit = np.cumsum(~fused) - 1
    unit_first = np.flatnonzero(~fused)
    n_units = len(unit_first)
    urank = c["rank"][unit_first]
    units = np.arange(n_units)
    unit_prev = np.where(np.r_[False, urank[1:] == urank[:-1]], units - 1, -1)
    a, b, paired = exchange_edges(c, stages, pair_p2p)
    comp = components(col_unit[a], col_unit[b], n_units)
    dep_src, dep_dst = compute_deps(c, stages)
    unpaired = np.isin(c["op"], [_OP["RECV_F"], _OP["RECV_B"]]) & ~paired
    # Engine nodes: units, then (with joins) one launch-delay node per unit, then one barrier
    # per exchange that starts when every participant is ready.
    n_comp = int(comp.max()) + 1
    base = 2 * n_units if joins else n_units
    lanes = int(urank.max()) + 1 if n_units else 0  # each barrier is a lane of its own
    node_rank = np.r_[urank, urank if joins else [], lanes + np.arange(n_comp)]
    if joins:
        node_prev = np.r_[units + n_units, unit_prev, np.full(n_comp, -1)]
        ready = units + n_units
        direct_dst = col_unit[dep_dst] + n_units
    else:
        node_prev = np.r_[unit_prev, np.full(n_comp, -1)]
        ready = unit_prev
        direct_dst = col_unit[dep_dst]
    ex = np.flatnonzero(comp >= 0)
    has_ready = ex[ready[ex] >= 0]
    deps = np.concatenate([
        np.c_[col_unit[dep_src], direct_dst],
        np.c_[ready[has_ready], base + comp[has_ready]],
        np.c_[base + comp[ex], ex],
    ]).astype(np.int64)
    cross = (c["rank"][dep_src] != c["rank"][dep_dst]).astype(np.float64)  # same rank: no lag
    lag = np.r_[cross, np.zeros(len(has_ready) + len(ex))]
    graph = OpGraph(rank=node_rank.astype(np.int64), prev=node_prev.astype(np.int64),
                    deps=deps, dep_lag=lag)
    return StepLayout(unit_first, col_unit, unit_prev, comp, dep_src, dep_dst, unpaired, graph,
                   joins)


def run_placement(meta: RunMeta, frame: pd.DataFrame) -> np.ndarray:
    """``(stages, chunks)``: the virtual stage of each (stage, chunk) of a logged run.

    In order: the run's recorded ``vstages`` (``extra``, as ``bubblecast simulate`` writes
    for non-looped placements), ``stage_layout: v-shape`` (Kineto imports), the placement of a
    schedule bubblecast knows by name (``torch:`` classes and readable ``csv:`` files
    included); else, for an unknown schedule with several chunks, the order in which
    microbatch 0's forwards ran in the first step (each virtual stage's F follows the previous
    one's), when that covers every (stage, chunk) once; else looped (``c * P + s``).
    """
    p, v = int(meta.stages), int(meta.chunks)
    looped = np.arange(v)[None, :] * p + np.arange(p)[:, None]
    table = _valid(meta.extra.get("vstages"), p, v)
    if table is None and meta.extra.get("stage_layout") == "v-shape" and v == 2:
        table = np.c_[np.arange(p), 2 * p - 1 - np.arange(p)]
    name = str(meta.schedule)
    known = lookup_schedule(name) is not None or name.startswith("torch:") or (
        name.startswith("csv:") and Path(name[4:]).is_file())
    if table is None and known:
        owner = vstage_ranks(name, p, v)
        table = _valid([np.flatnonzero(owner == r).tolist() for r in range(p)], p, v)
    if table is None and v > 1 and p > 1:
        table = _observed_placement(frame, p, v)
    return looped if table is None else table


def _valid(value: object, p: int, v: int) -> np.ndarray | None:
    """``value`` as a ``(p, v)`` placement holding each virtual stage once, else None."""
    try:
        table = np.asarray(value, dtype=np.int64)
    except (TypeError, ValueError):
        return None
    if table.shape != (p, v) or sorted(table.ravel().tolist()) != list(range(p * v)):
        return None
    return table


def _observed_placement(frame: pd.DataFrame, p: int, v: int) -> np.ndarray | None:
    """The placement microbatch 0's forwards of the first step ran in (replica 0's first
    rank per stage), or None when they do not visit every (stage, chunk) once."""
    f = frame[(frame["op"] == "F") & (frame["microbatch"] == 0)]
    if f.empty:
        return None
    f = f[(f["step"] == f["step"].min()) & (f["replica"] == f["replica"].min())]
    f = f[f["rank"] == f.groupby("stage")["rank"].transform("min")]
    f = f.sort_values(["start_s", "duration_s"], kind="stable")
    pairs = list(zip(f["stage"].astype(int), f["chunk"].astype(int), strict=True))
    if len(set(pairs)) != p * v or sorted(pairs) != [(s, c) for s in range(p)
                                                        for c in range(v)]:
        return None
    table = np.empty((p, v), dtype=np.int64)
    for i, (s, c) in enumerate(pairs):
        table[s, c] = i
    return table


def lane_order(step: np.ndarray, rank: np.ndarray, start: np.ndarray,
               ties: tuple[np.ndarray, ...] = ()) -> np.ndarray | slice:
    """Row order by (step, rank, start), ties broken by ``ties`` then row.

    Returns ``slice(None)`` (index without copying) when the rows are already in that order
    with no ties, which is how simulators and importers write them; else a sort's indices.
    """
    n = len(step)
    if n < 2:
        return slice(None)
    ds, dr = np.diff(step), np.diff(rank)
    ok = (ds > 0) | ((ds == 0) & (dr > 0))
    same = ~ok
    same &= (ds == 0) & (dr == 0)
    if (ok | (same & (np.diff(start) > 0))).all():
        return slice(None)
    return np.lexsort((np.arange(n), *ties[::-1], start, rank, step))


def pack_codes(fields: list[np.ndarray], bits: tuple[int, ...]) -> np.ndarray:
    """One uint64 per row: the fields bit-packed when they fit (exact), else hashed."""
    if all(x.size == 0 or (x.min() >= 0 and x.max() < 2**b)
           for x, b in zip(fields, bits, strict=True)):
        out, shift = np.zeros(len(fields[0]), dtype=np.uint64), 0
        for x, b in zip(fields, bits, strict=True):
            out |= x.astype(np.uint64) << np.uint64(shift)
            shift += b
        return out
    out = mix_hash(fields[0])
    for x in fields[1:]:
        out = mix_hash(out ^ x.astype(np.uint64))
    return out


def mix_hash(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser, vectorised (uint64 arithmetic wraps)."""
    x = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))
