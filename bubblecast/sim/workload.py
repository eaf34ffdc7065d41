"""Workload model: per-layer costs and a partition (layers per stage) give stage op times.

Sources of per-layer costs (:func:`load_workload`):

- ``uniform:L`` -- ``L`` identical layers; with ``--f/--b/--w`` per stage, each layer costs
  ``f * P / L`` (``P`` stages), so an even split reproduces the per-stage times (and each of
  ``V`` chunks takes ``1/V`` of them).
- a JSON file -- ``{"name": str, "layers": [{"name": str, "forward_ms": float,
  "backward_ms": float, "weight_ms": float (optional), "param_bytes": float (optional),
  "activation_bytes": float (optional)}, ...]}`` (a bare list of layers is accepted too).
  ``backward_ms`` is the whole backward; ``weight_ms`` is its weight-gradient part (W, taken
  out of it for the zero-bubble schedules); when absent, W is ``weight_fraction`` of the
  backward of layers that hold parameters and 0 for the others.
- a PipeDream ``graph.txt`` profile -- lines ``nodeN -- Layer -- forward_compute_time=..,
  backward_compute_time=.., activation_size=.., parameter_size=..`` and edges ``nodeA -- nodeB``;
  layers are taken in topological order of the edges (ties by node number).

A partition lists layers per stage: ``stages`` entries (split evenly over a rank's chunks in
multi-chunk schedules) or ``stages * chunks`` entries in virtual-stage order (rank ``r`` chunk
``c`` is virtual stage ``c * P + r`` in looped schedules; ``r`` and ``2P - 1 - r`` in V-shape
ones). Virtual stages hold consecutive layers. It may change
between steps: :func:`partition_matrix` accepts one partition, a ``(steps, S)`` array or a
callable ``step -> partition``.

Counterfactuals: :func:`counterfactual_stage_times` recomputes per-step per-rank compute times
of a simulated run under another partition from the ground truth the run saved (workload in
the run metadata, per-rank ``speed`` and per-microbatch ``tokens`` columns).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bubblecast.errors import BubblecastError
from bubblecast.sim.schedules import vstage_ranks
from bubblecast.sim.shape import even_partition

#: Default W share of a parameter-holding layer's backward when the source gives no split.
WEIGHT_FRACTION = 1 / 3

PartitionSpec = Sequence[int] | np.ndarray | Callable[[int], Sequence[int]] | None


@dataclass(frozen=True)
class Workload:
    """Per-layer costs in ms per microbatch: ``forward``, ``backward`` (the whole backward,
    B + W) and ``weight`` (its W part); sizes in bytes."""

    forward: np.ndarray
    backward: np.ndarray
    weight: np.ndarray
    param_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0))
    activation_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0))
    names: tuple[str, ...] = ()
    name: str = "workload"

    def __post_init__(self) -> None:
        n = len(np.asarray(self.forward))
        arrays = {"forward": self.forward, "backward": self.backward, "weight": self.weight,
                  "param_bytes": self.param_bytes, "activation_bytes": self.activation_bytes}
        for key, value in arrays.items():
            a = np.asarray(value, dtype=np.float64).reshape(-1)
            if key in ("param_bytes", "activation_bytes") and a.size == 0:
                a = np.zeros(n)
            if a.shape != (n,):
                raise BubblecastError(f"workload '{self.name}': '{key}' has {a.size} layers, "
                                      f"'forward' {n}")
            if not np.all(np.isfinite(a)) or (a < 0).any():
                raise BubblecastError(f"workload '{self.name}': '{key}' must be finite and >= 0")
            object.__setattr__(self, key, a)
        if n == 0:
            raise BubblecastError(f"workload '{self.name}': no layers")
        if (self.weight > self.backward + 1e-12).any():
            i = int(np.flatnonzero(self.weight > self.backward + 1e-12)[0])
            raise BubblecastError(f"workload '{self.name}': layer {i} has weight_ms > backward_ms")
        if not self.names:
            object.__setattr__(self, "names", tuple(f"layer{i}" for i in range(n)))

    @property
    def n_layers(self) -> int:
        return len(self.forward)

    @classmethod
    def uniform(cls, layers: int, f: float = 1.0, b: float = 1.0, w: float = 1.0,
                stages: int | None = None) -> Workload:
        """``layers`` equal layers sized so that ``stages`` even stages each cost f, b, w
        (W is part of the backward: each layer's backward is ``(b + w) * stages / layers``)."""
        if layers < 1:
            raise BubblecastError(f"--model: uniform needs at least 1 layer, got {layers}")
        scale = (stages or layers) / layers
        ones = np.ones(layers)
        return cls(ones * f * scale, ones * (b + w) * scale, ones * w * scale,
                   name=f"uniform:{layers}")

    def with_extra_last(self, extra_ms: tuple[float, float, float]) -> Workload:
        """A copy whose last layer costs ``extra_ms`` = (f, b, w) more (an output head)."""
        f, b, w = (np.array(self.forward), np.array(self.backward), np.array(self.weight))
        f[-1] += extra_ms[0]
        b[-1] += extra_ms[1] + extra_ms[2]
        w[-1] += extra_ms[2]
        return Workload(f, b, w, self.param_bytes, self.activation_bytes, self.names, self.name)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "layers": [
            {"name": self.names[i], "forward_ms": float(self.forward[i]),
             "backward_ms": float(self.backward[i]), "weight_ms": float(self.weight[i]),
             "param_bytes": float(self.param_bytes[i]),
             "activation_bytes": float(self.activation_bytes[i])}
            for i in range(self.n_layers)]}

    @classmethod
    def from_json(cls, obj: Any, source: str = "<json>",
                  weight_fraction: float = WEIGHT_FRACTION) -> Workload:
        layers = obj.get("layers") if isinstance(obj, dict) else obj
        if not isinstance(layers, list) or not layers:
            raise BubblecastError(f"{source}: expected a non-empty 'layers' list")
        cols: dict[str, list[float]] = {k: [] for k in ("forward_ms", "backward_ms", "weight_ms",
                                                         "param_bytes", "activation_bytes")}
        names = []
        for i, layer in enumerate(layers):
            if not isinstance(layer, dict):
                raise BubblecastError(f"{source}: layers[{i}] is not an object")
            for key in ("forward_ms", "backward_ms"):
                if key not in layer:
                    raise BubblecastError(f"{source}: layers[{i}] has no '{key}'")
            try:
                for key, values in cols.items():
                    default = None if key == "weight_ms" else 0.0
                    v = layer.get(key, default)
                    values.append(np.nan if v is None else float(v))
            except (TypeError, ValueError):
                raise BubblecastError(f"{source}: layers[{i}]: costs must be numbers") from None
            names.append(str(layer.get("name", f"layer{i}")))
        back, params = np.array(cols["backward_ms"]), np.array(cols["param_bytes"])
        weight = np.array(cols["weight_ms"])
        guess = np.where(params > 0, back * weight_fraction, 0.0)
        weight = np.where(np.isnan(weight), guess, weight)
        name = obj.get("name", Path(source).stem) if isinstance(obj, dict) else Path(source).stem
        return cls(np.array(cols["forward_ms"]), back, weight, params,
                   np.array(cols["activation_bytes"]), tuple(names), str(name))


_NODE = re.compile(r"^\s*(node\d+) -- (.*) -- forward_compute_time=([^,]+), "
                   r"backward_compute_time=([^,]+), activation_size=(.+), parameter_size=([^,\s]+)")
_EDGE = re.compile(r"^\s*(node\d+) -- (node\d+)\s*$")


def _size(text: str) -> float:
    """``123.0`` or ``[1.0; 2.0]`` (PipeDream's multi-output nodes) as total bytes."""
    return float(sum(float(x) for x in text.strip().strip("[]").split(";") if x.strip()))


def read_pipedream(path: str | Path, weight_fraction: float = WEIGHT_FRACTION) -> Workload:
    """A PipeDream ``graph.txt`` profile as a workload, layers in topological order."""
    p = Path(path)
    nodes: dict[str, tuple[str, float, float, float, float]] = {}
    edges: list[tuple[str, str]] = []
    for lineno, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        if m := _EDGE.match(line):
            edges.append((m.group(1), m.group(2)))
        elif m := _NODE.match(line):
            try:
                nodes[m.group(1)] = (m.group(2).strip(), float(m.group(3)), float(m.group(4)),
                                     _size(m.group(6)), _size(m.group(5)))
            except ValueError:
                raise BubblecastError(f"{p}: line {lineno}: bad number") from None
        else:
            raise BubblecastError(f"{p}: line {lineno}: not a PipeDream node or edge")
    if not nodes:
        raise BubblecastError(f"{p}: no nodes found")
    order = _topological(list(nodes), edges, p)
    name, fwd, bwd, params, acts = (list(x) for x in zip(*(nodes[k] for k in order), strict=True))
    params_a, bwd_a = np.array(params), np.array(bwd)
    weight = np.where(params_a > 0, bwd_a * weight_fraction, 0.0)
    return Workload(np.array(fwd), bwd_a, weight, params_a, np.array(acts),
                    tuple(f"{k}:{n}" for k, n in zip(order, name, strict=True)),
                    p.name.split(".")[0])


def _topological(names: list[str], edges: list[tuple[str, str]], path: Path) -> list[str]:
    import heapq

    def key(node: str) -> int:
        return int(node[4:])

    for a, b in edges:
        for node in (a, b):
            if node not in names:
                raise BubblecastError(f"{path}: edge names unknown node '{node}'")
    succ: dict[str, list[str]] = {k: [] for k in names}
    indeg = dict.fromkeys(names, 0)
    for a, b in edges:
        succ[a].append(b)
        indeg[b] += 1
    heap = [(key(k), k) for k in names if indeg[k] == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        _, k = heapq.heappop(heap)
        order.append(k)
        for nxt in succ[k]:
            indeg[nxt] -= 1
            if indeg[nxt] == 0:
                heapq.heappush(heap, (key(nxt), nxt))
    if len(order) != len(names):
        raise BubblecastError(f"{path}: the graph's edges form a cycle")
    return order


def load_workload(spec: str, *, f: float = 1.0, b: float = 1.0, w: float = 1.0,
                  stages: int | None = None) -> Workload:
    """``uniform:L``, a JSON file or a PipeDream ``graph.txt`` file (see the module doc)."""
    if spec.startswith("uniform:"):
        try:
            layers = int(spec.split(":", 1)[1])
        except ValueError:
            raise BubblecastError(f"--model: expected uniform:L with an integer L, got '{spec}'") \
                from None
        return Workload.uniform(layers, f, b, w, stages)
    path = Path(spec)
    if not path.is_file():
        raise BubblecastError(f"--model: no such file '{spec}' (or use uniform:L)")
    text = path.read_text()
    if text.lstrip().startswith(("{", "[")):
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BubblecastError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})") \
                from None
        return Workload.from_json(obj, str(path))
    return read_pipedream(path)


def expand_partition(partition: Sequence[int], layers: int, stages: int,
                     chunks: int = 1, schedule: str = "1f1b") -> np.ndarray:
    """Validate a partition and return layers per virtual stage (``stages * chunks``); a
    per-rank partition is split evenly over the rank's chunks, placed as ``schedule`` does."""
    part = [int(x) for x in partition]
    if len(part) not in (stages, stages * chunks):
        want = f"{stages}" if chunks == 1 else f"{stages} or {stages * chunks}"
        raise BubblecastError(f"--partition: {len(part)} entries, expected {want}")
    if any(x < 1 for x in part):
        raise BubblecastError(f"--partition: every stage needs at least 1 layer, got {part}")
    if sum(part) != layers:
        raise BubblecastError(f"--partition: sums to {sum(part)} layers, the model has {layers}")
    if len(part) == stages and chunks > 1:
        if min(part) < chunks:
            raise BubblecastError(f"--partition: each rank needs at least {chunks} layers "
                                  f"(one per chunk), got {part}")
        per_rank = [list(even_partition(x, chunks)) for x in part]
        owner = vstage_ranks(schedule, stages, chunks)
        part = [per_rank[r].pop(0) for r in owner.tolist()]
    return np.asarray(part, dtype=np.int64)


def partition_matrix(spec: PartitionSpec, steps: int, layers: int, stages: int,
                     chunks: int = 1, schedule: str = "1f1b") -> np.ndarray:
    """Layers per virtual stage for every step, ``(steps, stages * chunks)``."""
    if spec is None:
        row = np.asarray(even_partition(layers, stages * chunks), dtype=np.int64)
        return np.broadcast_to(row, (steps, len(row)))
    if callable(spec):
        return np.stack([expand_partition(spec(s), layers, stages, chunks, schedule)
                         for s in range(steps)])
    arr = np.asarray(spec)
    if arr.ndim == 2:
        if arr.shape[0] != steps:
            raise BubblecastError(f"--partition: {arr.shape[0]} rows for {steps} steps")
        return np.stack([expand_partition(r, layers, stages, chunks, schedule) for r in arr])
    row = expand_partition(arr.tolist(), layers, stages, chunks, schedule)
    return np.broadcast_to(row, (steps, len(row)))


def stage_costs(workload: Workload, parts: np.ndarray) -> np.ndarray:
    """Per step and virtual stage, the (f, b, w) ms of one microbatch: ``(steps, S, 3)``.

    ``b`` is the input-gradient part (backward minus W); virtual stage ``s`` holds the
    consecutive layers after those of stages ``0..s-1``.
    """
    parts = np.atleast_2d(parts)
    bounds = np.concatenate([np.zeros((len(parts), 1), dtype=np.int64),
                             np.cumsum(parts, axis=1)], axis=1)
    out = np.empty(parts.shape + (3,))
    b_only = workload.backward - workload.weight
    for k, per_layer in enumerate((workload.forward, b_only, workload.weight)):
        cum = np.concatenate([[0.0], np.cumsum(per_layer)])
        out[..., k] = cum[bounds[:, 1:]] - cum[bounds[:, :-1]]
    return out


def counterfactual_stage_times(meta: Any, speed: np.ndarray, tokens: np.ndarray | None,
                               partition: PartitionSpec) -> np.ndarray:
    """Compute ms per step and rank of a simulated run under another ``partition``.

    ``meta`` is the run's :class:`~bubblecast.telemetry.RunMeta` (its ``extra`` holds the
    ``workload`` and ``tokens_model`` that :mod:`bubblecast.sim.simulator` saved); ``speed`` the
    ground-truth factors ``(steps, ranks)`` (the ``speed`` column per step and rank, ranks
    numbered ``replica * stages + stage``); ``tokens`` the ``(steps, replicas, microbatches)``
    token counts of a ``seqlen`` run or ``None``; ``partition`` as in :func:`partition_matrix`.
    Returns ``(steps, ranks)``: the sum over the rank's chunks and the step's microbatches of
    F + B + W, noise-free (the per-op noise has mean 1). Equals the simulated busy time of a
    run without per-op noise.
    """
    extra = getattr(meta, "extra", meta)
    if "workload" not in extra:
        raise BubblecastError("run metadata has no 'workload': not a bubblecast simulation")
    workload = Workload.from_json(extra["workload"], "run metadata")
    stages, chunks = int(meta.stages), int(meta.chunks)
    m, replicas = int(meta.microbatches), int(meta.replicas)
    speed = np.atleast_2d(np.asarray(speed, dtype=np.float64))
    steps = speed.shape[0]
    if speed.shape[1] != stages * replicas:
        raise BubblecastError(f"speed: {speed.shape[1]} ranks, the run has {stages * replicas}")
    schedule = str(getattr(meta, "schedule", "1f1b"))
    parts = partition_matrix(partition, steps, workload.n_layers, stages, chunks, schedule)
    per_mb = stage_costs(workload, parts).sum(axis=2)  # (steps, S) F + B + W per microbatch
    owner = vstage_ranks(schedule, stages, chunks)
    per_rank = np.zeros((steps, stages))
    np.add.at(per_rank.T, owner, per_mb.T)  # (steps, stages): each rank's chunks summed
    if tokens is not None:
        model = extra.get("tokens_model")
        if model is None:
            raise BubblecastError("tokens given but the run metadata has no 'tokens_model'")
        tokens = np.asarray(tokens, dtype=np.float64)
        if tokens.shape != (steps, replicas, m):
            raise BubblecastError(f"tokens: shape {tokens.shape}, expected {(steps, replicas, m)}")
        work = work_factor(tokens, model["mean_tokens"],
                           model["quadratic_share"]).sum(axis=2)  # (steps, replicas)
    else:
        work = np.full((steps, replicas), float(m))
    total = per_rank[:, None, :] * work[:, :, None]  # (steps, replicas, stages)
    return total.reshape(steps, replicas * stages) * speed


def work_factor(tokens: np.ndarray, mean_tokens: float, quadratic_share: float) -> np.ndarray:
    """Compute multiplier of a microbatch with ``tokens`` tokens (1 at ``mean_tokens``):
    a linear part plus ``quadratic_share`` of attention-like quadratic cost."""
    x = np.asarray(tokens, dtype=np.float64) / float(mean_tokens)
    return (1.0 - quadratic_share) * x + quadratic_share * x * x
