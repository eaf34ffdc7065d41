"""Replay of logged steps (SPEC §2 *Replay*), vectorised with the timing engine.

Each step's ops keep their observed order on each rank (lane) and wait for the previous op on
it. Cross-rank dependencies: F after the previous virtual stage's F of the same microbatch, B
after the next one's B (plus the communication lag when the log records no transfers); and
*exchanges*: a collective, or a send with its receive (the i-th send on a link pairs with the
i-th receive), starts on all its participants at the latest of their ready times. Sends and
receives a rank issued together (same start and end, as Megatron's fused
``send_forward_recv_backward``) form one unit. Recorded exchange durations include waiting, so
a participant's pure transfer time is its end minus the last participant's start; unpaired
receives take a low quantile of their link's durations.

Collectives are ``ALLREDUCE`` ops and ops whose log ``name`` is a known collective
(:data:`KNOWN_COLLECTIVES`, e.g. Megatron's ``optimizer-clip-main-grad``, which the importer
maps to ``OTHER``); the i-th occurrence on each rank of one name joins the same collective
among the ranks of its communicator (``dp``, the default for ``ALLREDUCE``: one stage across
replicas). Kineto imports post sends and receives without blocking (``ReplayConfig.p2p``).

Steps with identical per-rank op signatures share one graph and replay in one engine call.
:class:`ReplayModel` builds everything once; :meth:`ReplayModel.run` replays with any
durations (what-if scenarios, a policy's candidate actions).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from bubblecast.errors import BubblecastError
from bubblecast.sim.engine import simulate
from bubblecast.sim.replay_graph import (
    OP_INDEX,
    StepLayout,
    build_layout,
    lane_order,
    mix_hash,
    pack_codes,
    run_placement,
)
from bubblecast.telemetry.events import Events
from bubblecast.telemetry.schema import COMM_OPS, COMPUTE_OPS, OPS

#: Communicator of a collective by its log ``name``: ``dp`` one stage across replicas, ``pp``
#: the stages of one replica that ran it (e.g. first and last for tied embeddings), ``tp`` the
#: ranks of one (replica, stage), ``world`` every rank that ran it.
KNOWN_COLLECTIVES: dict[str, str] = {
    "params-all-gather": "dp", "grads-reduce-scatter": "dp", "grads-all-reduce": "dp",
    "embedding-grads-all-reduce": "pp", "position-embedding-grads-all-reduce": "pp",
    "layernorm-grads-all-reduce": "tp", "optimizer-clip-main-grad": "world",
}  # fmt: skip
GROUP_KINDS: tuple[str, ...] = ("dp", "pp", "tp", "world")


@dataclass
class ReplayConfig:
    """How to replay.

    ``launch_delays`` keeps each op's observed slack that the model does not explain (host-side
    launch gaps); off by default, as in SPEC §2. ``comm_s`` is the lag of a direct compute
    dependency; ``None`` estimates it (0 when the log records sends and receives).
    ``p2p``: ``blocking`` sends and receives (NCCL, Megatron: a send and its receive form an
    exchange), ``posted`` (torch.distributed.pipelining's runtime only posts them and the
    consumer waits inside its compute op: they are local ops and compute dependencies pay the
    estimated lag) or ``auto`` (``posted`` for Kineto imports, else ``blocking``).
    ``transfer_quantile``: quantile of a link's durations taken as an unpaired receive's pure
    transfer time.
    ``collectives`` maps more op names to a communicator kind (:data:`GROUP_KINDS`).
    """

    launch_delays: bool = False
    p2p: str = "auto"
    comm_s: float | None = None
    transfer_quantile: float = 0.1
    fuse_tol_s: float = 1e-7
    collectives: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.comm_s is not None and not (np.isfinite(self.comm_s) and self.comm_s >= 0):
            raise ValueError(f"ReplayConfig.comm_s must be finite and >= 0, got {self.comm_s}")
        if not 0.0 <= self.transfer_quantile <= 1.0:
            raise ValueError(f"ReplayConfig.transfer_quantile must be in [0, 1], "
                             f"got {self.transfer_quantile}")
        if self.p2p not in ("auto", "blocking", "posted"):
            raise ValueError(f"ReplayConfig.p2p must be auto, blocking or posted, got {self.p2p!r}")
        if self.fuse_tol_s < 0:
            raise ValueError("ReplayConfig.fuse_tol_s must be >= 0")
        bad = {k: v for k, v in self.collectives.items() if v not in GROUP_KINDS}
        if bad:
            raise ValueError(f"ReplayConfig.collectives: unknown kinds {bad} (use {GROUP_KINDS})")


@dataclass
class ReplayResult:
    """Replayed start and end of every op (run-frame row order) and per-step step times."""

    start: np.ndarray
    end: np.ndarray
    steps: np.ndarray
    observed_step_s: np.ndarray
    replayed_step_s: np.ndarray

    @property
    def error(self) -> np.ndarray:
        """Per-step relative error |replayed - observed| / observed."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.abs(self.replayed_step_s - self.observed_step_s) / self.observed_step_s


def select_run(events: Events, run_id: str | None = None) -> tuple[str, Events]:
    """The only run of ``events``, or ``run_id``; a one-line error otherwise."""
    col = events.frame["run_id"]
    if isinstance(col.dtype, pd.CategoricalDtype):
        codes = np.unique(np.asarray(col.cat.codes))
        ids = [str(col.cat.categories[c]) for c in codes[codes >= 0]]
    else:
        ids = [str(r) for r in pd.unique(col)]
    if run_id is None:
        if len(ids) != 1:
            raise BubblecastError(f"the file holds {len(ids)} runs; choose one with --run")
        run_id = ids[0]
    elif run_id not in ids:
        raise BubblecastError(f"--run: no run '{run_id}' (runs: {', '.join(ids[:10])})")
    return run_id, (events if len(ids) == 1 else events.run(run_id))


@dataclass
class _StepGroup:
    members: np.ndarray  # indices into ReplayModel.steps
    rows: np.ndarray  # (S, n) run-frame rows of each member step, in lane order
    origin: np.ndarray  # (S,) observed earliest start of each step
    layout: StepLayout | None = None
    block: slice | None = None  # rows is this contiguous range of frame rows, reshaped

    def take(self, values: np.ndarray) -> np.ndarray:
        """``values[rows]``; a view when the rows are one contiguous block."""
        if self.block is not None:
            return values[self.block].reshape(self.rows.shape)
        return values[self.rows]

    def put(self, target: np.ndarray, values: np.ndarray) -> None:
        """``target[rows] = values``."""
        if self.block is not None:
            target[self.block] = values.reshape(-1)
        else:
            target[self.rows] = values


# -- the model --------------------------------------------------------------------------------
class ReplayModel:
    """Dependency graphs of every step of one run, ready to replay with any durations.

    Per row of :attr:`frame` (the run's events): :attr:`rank`, :attr:`observed` and
    :attr:`pure` durations, :attr:`kind` (op type: the op for compute ops, sends and receives,
    else the log's ``name`` when present; names in :attr:`kind_names`), :attr:`is_compute`,
    :attr:`is_comm` (sends, receives, collectives) and :attr:`delay` (launch delays, zero
    unless configured). Per logged step: :attr:`steps`, :attr:`origin`, :attr:`observed_step_s`.
    """

    def __init__(self, events: Events, run_id: str | None = None,
                 config: ReplayConfig | None = None) -> None:
        self.config = config or ReplayConfig()
        self.run_id, ev = select_run(events, run_id)
        f = self.frame = ev.frame
        if len(f) == 0:
            raise BubblecastError(f"run '{self.run_id}' has no events to replay")
        meta = ev.runs[self.run_id]
        self.stages = meta.stages
        mode = self.config.p2p
        self.blocking_p2p = mode == "blocking" or (mode == "auto" and meta.source != "kineto")
        #: ``(stages, chunks)``: virtual stage of each rank's chunk (:func:`run_placement`).
        self.placement = run_placement(meta, f)
        self.rank = f["rank"].to_numpy(np.int64)
        self.start = f["start_s"].to_numpy(np.float64)
        self.observed = f["duration_s"].to_numpy(np.float64)
        self.op = np.asarray(f["op"].cat.codes, dtype=np.int64)
        self.is_compute = np.isin(self.op, [OP_INDEX[o] for o in COMPUTE_OPS])
        self.is_p2p = np.isin(self.op, [OP_INDEX[o] for o in COMM_OPS])
        labels = list(OPS)
        key = self.op.copy()
        if "name" in f.columns:
            name_code, names = pd.factorize(f["name"])
            use = (name_code >= 0) & ~self.is_compute & ~self.is_p2p
            key[use] = len(OPS) + name_code[use]
            labels += [str(x) for x in names]
        codes, uniques = pd.factorize(key)
        self.kind = codes.astype(np.int64)
        self.kind_names = [labels[u] for u in uniques]
        known = {**KNOWN_COLLECTIVES, **self.config.collectives}
        kind_group = np.array([known.get(k, "dp" if k == "ALLREDUCE" else "")
                               for k in self.kind_names], dtype=object)
        allreduce = np.zeros(len(uniques), dtype=bool)
        allreduce[self.kind[self.op == OP_INDEX["ALLREDUCE"]]] = True
        kind_group[allreduce & (kind_group == "")] = "dp"
        self.group = kind_group[self.kind]
        self.is_comm = self.is_p2p | (self.group != "")
        self._group_steps()
        self._estimate()

    def _group_steps(self) -> None:
        f, cfg = self.frame, self.config
        n = len(f)
        step = f["step"].to_numpy(np.int64)
        end = self.start + self.observed
        order = lane_order(step, self.rank, self.start, (end, self.op))
        s_step, s_rank, p2p = step[order], self.rank[order], self.is_p2p[order]
        fused = np.r_[False, (s_step[1:] == s_step[:-1]) & (s_rank[1:] == s_rank[:-1])
                      & p2p[1:] & p2p[:-1]]
        fused &= np.abs(np.diff(self.start[order], prepend=np.nan)) <= cfg.fuse_tol_s
        fused &= np.abs(np.diff(end[order], prepend=np.nan)) <= cfg.fuse_tol_s
        self.fused = np.empty(n, dtype=bool)
        self.fused[order] = fused
        bounds = np.flatnonzero(np.r_[True, s_step[1:] != s_step[:-1], True])
        first, lengths = bounds[:-1], np.diff(bounds)
        self.steps = s_step[first]
        self.origin = np.minimum.reduceat(self.start[order], first)
        self.observed_step_s = np.maximum.reduceat(end[order], first) - self.origin
        chunk = f["chunk"].to_numpy(np.int64)[order]
        mb = f["microbatch"].to_numpy(np.int64)[order]
        fields = [s_rank, self.op[order], chunk, mb + 1, self.kind[order], fused.astype(np.int64)]
        code = pack_codes(fields, (24, 4, 6, 16, 12, 1))
        pos = (np.arange(n) - np.repeat(first, lengths)).astype(np.uint64)
        h = mix_hash(code ^ mix_hash(pos))
        sig = pd.factorize(pd.MultiIndex.from_arrays([lengths, np.add.reduceat(h, first)]))[0]
        roles = self._rank_roles()
        self.groups: list[_StepGroup] = []
        for g in range(int(sig.max()) + 1):
            members = np.flatnonzero(sig == g)
            pos = first[members][:, None] + np.arange(lengths[members[0]])
            block = code[pos]
            if not (block == block[:1]).all():  # guard against a hash collision
                raise BubblecastError(f"run '{self.run_id}': step signature hash collision")
            grp = _StepGroup(members, pos if isinstance(order, slice) else order[pos],
                             self.origin[members])
            if isinstance(order, slice) and (np.diff(pos[:, 0]) == pos.shape[1]).all():
                grp.block = slice(int(pos[0, 0]), int(pos[-1, -1]) + 1)
            rep = grp.rows[0]
            c = {"rank": self.rank[rep], "op": self.op[rep], "kind": self.kind[rep],
                 "chunk": chunk[pos[0]], "mb": mb[pos[0]], "fused": fused[pos[0]],
                 "group": self.group[rep]}
            c.update({k: v[c["rank"]] for k, v in roles.items()})
            c["vstage"] = self._vstage(c["stage"], c["chunk"])
            grp.layout = build_layout(c, self.stages, cfg.launch_delays, self.blocking_p2p)
            self.groups.append(grp)

    @property
    def v_shape(self) -> bool:
        """True when rank ``r`` holds virtual stages ``r`` and ``2P - 1 - r``."""
        p = self.stages
        return self.placement.shape == (p, 2) and p > 1 and bool(
            (self.placement[:, 1] == 2 * p - 1 - np.arange(p)).all())

    def _vstage(self, stage: np.ndarray, chunk: np.ndarray) -> np.ndarray:
        """Virtual stage of each (stage, chunk); chunks beyond the placement count looped."""
        p, v = self.placement.shape
        ok = (stage >= 0) & (stage < p) & (chunk >= 0) & (chunk < v)
        looped = chunk * self.stages + stage
        return np.where(ok, self.placement[np.clip(stage, 0, p - 1), np.clip(chunk, 0, v - 1)],
                        looped)

    def _rank_roles(self) -> dict[str, np.ndarray]:
        """Stage, replica and tensor-parallel index of each rank (index = rank)."""
        f = self.frame
        first = f.drop_duplicates("rank")[["rank", "stage", "replica"]]
        size = int(first["rank"].max()) + 1
        out = {k: np.zeros(size, dtype=np.int64) for k in ("stage", "replica", "tp")}
        r = first["rank"].to_numpy(np.int64)
        out["stage"][r] = first["stage"].to_numpy()
        out["replica"][r] = first["replica"].to_numpy()
        first = first.sort_values("rank")
        out["tp"][first["rank"].to_numpy()] = first.groupby(["replica", "stage"]).cumcount()
        return out

    def _estimate(self) -> None:
        """Communication lag, pure transfer times and (optionally) launch delays."""
        cfg = self.config
        end = self.start + self.observed
        if cfg.comm_s is not None:
            self.comm = float(cfg.comm_s)
        elif self.blocking_p2p and self.is_p2p.any():
            self.comm = 0.0
        else:
            self.comm = self._estimate_comm(end)
        self.pure = self.observed.copy()
        unpaired = np.zeros(len(self.pure), dtype=bool)
        for grp in self.groups:
            L = grp.layout
            comp_col = L.unit_comp[L.col_unit]
            mem = np.flatnonzero(comp_col >= 0)
            unpaired[grp.rows[:, L.unpaired_recv]] = True
            if not mem.size:
                continue
            mem = mem[np.argsort(comp_col[mem], kind="stable")]
            cuts = np.flatnonzero(np.r_[True, np.diff(comp_col[mem]) != 0])
            rows = grp.rows[:, mem]
            last_start = np.maximum.reduceat(self.start[rows], cuts, axis=1)
            transfer = end[rows] - last_start[:, comp_col[mem]]
            self.pure[rows] = np.clip(transfer, 0.0, self.observed[rows])
        if unpaired.any():
            idx = np.flatnonzero(unpaired)
            key = pd.MultiIndex.from_arrays([self.rank[idx], self.op[idx]])
            low = pd.Series(self.observed[idx]).groupby(key).transform("quantile",
                                                                       cfg.transfer_quantile)
            self.pure[idx] = low.to_numpy()
        self.delay = np.zeros(len(self.pure))
        if cfg.launch_delays:
            for grp in self.groups:
                L, rows = grp.layout, grp.rows
                ready = self._ready(grp, end)
                first = rows[:, L.unit_first]
                self.delay[first] = np.maximum(self.start[first] - ready, 0.0)

    def _ready(self, grp: _StepGroup, end: np.ndarray) -> np.ndarray:
        """Observed time each unit could have started under the model, (S, U)."""
        L, rows = grp.layout, grp.rows
        unit_end = np.maximum.reduceat(grp.take(end), L.unit_first, axis=1)
        ready = np.where(L.unit_prev >= 0, unit_end[:, np.maximum(L.unit_prev, 0)],
                         grp.origin[:, None])
        dst = L.col_unit[L.dep_dst]
        lag = self.comm * (self.rank[rows[0, L.dep_src]] != self.rank[rows[0, L.dep_dst]])
        ready[:, dst] = np.maximum(ready[:, dst], end[rows[:, L.dep_src]] + lag)
        return ready

    def _estimate_comm(self, end: np.ndarray) -> float:
        """Median slack of dependency-bound compute ops: exact on a run made by the model, and
        on real logs the typical per-hop cost (transfer plus launch overhead).

        An op is dependency-bound when it started after the previous compute op on its rank
        ended (posted sends and receives in between do not count). Up to 1000 steps per
        signature group are sampled, evenly spread."""
        slack = []
        for grp in self.groups:
            L = grp.layout
            rows = grp.rows[np.unique(np.linspace(0, len(grp.rows) - 1, 1000).astype(int))]
            if not len(L.dep_dst):
                continue
            cross = self.rank[rows[0, L.dep_src]] != self.rank[rows[0, L.dep_dst]]
            src, dst = L.dep_src[cross], L.dep_dst[cross]
            comp = np.flatnonzero(self.is_compute[rows[0]])
            lane = self.rank[rows[0, comp]]
            prev_comp = np.where(np.r_[False, lane[1:] == lane[:-1]], np.r_[-1, comp[:-1]], -1)
            prev = prev_comp[np.searchsorted(comp, dst)]
            prev_end = np.where(prev >= 0, end[rows[:, np.maximum(prev, 0)]], -np.inf)
            st = self.start[rows[:, dst]]
            waited = st - prev_end > 1e-9 * np.maximum(1.0, np.abs(st))
            slack.append((st - end[rows[:, src]])[waited])
        values = np.concatenate(slack) if slack else np.zeros(0)
        return float(max(np.median(values), 0.0)) if values.size else 0.0

    def run(self, durations: np.ndarray | None = None) -> ReplayResult:
        """Replay with ``durations`` (run-frame row order; pure transfer times for exchanges).

        ``None`` replays with the estimated pure durations (:attr:`pure`).
        """
        dur = self.pure if durations is None else np.asarray(durations, dtype=np.float64)
        if dur.shape != self.pure.shape:
            raise ValueError(f"durations have shape {dur.shape}, expected {self.pure.shape}")
        if not np.isfinite(dur).all() or (dur < 0).any():
            raise ValueError("durations must be finite and >= 0")
        start, end = np.empty(len(dur)), np.empty(len(dur))
        replayed = np.empty(len(self.steps))
        for grp in self.groups:
            L, rows = grp.layout, grp.rows
            d = grp.take(dur)
            n_units = len(L.unit_first)
            node = np.zeros((len(rows), L.graph.n_ops))
            node[:, :n_units] = np.maximum.reduceat(d, L.unit_first, axis=1)
            if L.joins:
                node[:, n_units:2 * n_units] = self.delay[rows[:, L.unit_first]]
            try:
                s_node, _ = simulate(L.graph, node, self.comm, grp.origin)
            except ValueError as exc:
                step = self.steps[grp.members[0]]
                raise BubblecastError(f"run '{self.run_id}', step {step}: cannot replay the "
                                      f"observed order: {exc}") from None
            s = s_node[:, L.col_unit]
            grp.put(start, s)
            grp.put(end, s + d)
            replayed[grp.members] = (s + d).max(axis=1) - s.min(axis=1)
        return ReplayResult(start, end, self.steps.copy(), self.observed_step_s.copy(), replayed)


def replay(events: Events, durations: np.ndarray | None = None, *, run_id: str | None = None,
           config: ReplayConfig | None = None) -> ReplayResult:
    """Replay one run with its pure durations, or with ``durations`` (run-frame row order)."""
    return ReplayModel(events, run_id, config).run(durations)
