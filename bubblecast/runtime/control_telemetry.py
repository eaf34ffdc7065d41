"""Controller telemetry: each rank's compute seconds per step, gathered cheaply on rank 0.

Every rank keeps, per step, the sum of its compute-op (F, B, W) durations, read from the
recorder's public step hook at each step end (:class:`StepProbe`: a few tuple reads per
step, no allocation beyond one float). At a control boundary one ``all_gather`` of a small float64
tensor per rank (``[n, compute of the last K steps, new per-layer forward and total cost
samples]``, ``1 + K + 2L`` values) brings everything to rank 0, where :class:`History` keeps
the series the policies read: per-step compute per rank, the partition and micro-batch count in
force at each step, and per-layer cost samples.

The policies' *speed* is compute seconds per unit of layer cost held, per micro-batch:
``compute[t, r] / (M_t x cost held by r at t)``. Layer costs come from each layer's first
``cost_samples`` samples, then are frozen, so that a rank that slows down later shows up in its
speed, not in the costs of the layers it holds.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bubblecast.errors import BubblecastError


class StepProbe:
    """Collects this rank's compute seconds per step from a :class:`Recorder`, through its
    public step hook (the step's rows are still buffered then). Needs a recording recorder.
    """

    def __init__(self, recorder: Any) -> None:
        if not getattr(recorder, "record", False):
            raise BubblecastError("controller: needs a trainer that records telemetry "
                                  "(record=True)")
        self.values: list[float] = []
        recorder.add_step_hook(self._on_step)

    def _on_step(self, view: Any) -> None:
        self.values.append(view.compute_s())

    def take(self, last: int) -> list[float]:
        """The last ``last`` per-step values (oldest first); the buffer is emptied."""
        out, self.values = self.values[-last:], []
        return out


def pack(compute: list[float], every: int, samples: list[dict[str, Any]],
         layers: int) -> np.ndarray:
    """``[n, compute x every (NaN padded), forward cost x L, total cost x L]`` for one rank;
    ``samples`` are recorder layer-cost dicts, the latest per layer wins."""
    out = np.full(1 + every + 2 * layers, np.nan)
    n = min(len(compute), every)
    out[0] = n
    if n:
        out[1:1 + n] = compute[-n:]
    for s in samples:
        i = int(s["layer"])
        if 0 <= i < layers:
            out[1 + every + i] = float(s["forward_s"])
            out[1 + every + layers + i] = float(s["total_s"])
    return out


def unpack(rows: np.ndarray, every: int, layers: int
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gathered ``(P, 1 + every + 2L)`` -> compute ``(n, P)``, forward ``(P, L)``, total
    ``(P, L)`` (NaN where a rank sent no sample)."""
    counts = rows[:, 0].astype(np.int64)
    n = int(counts.min()) if len(counts) else 0
    compute = rows[:, 1:1 + n].T.copy()
    fwd = rows[:, 1 + every:1 + every + layers]
    tot = rows[:, 1 + every + layers:1 + every + 2 * layers]
    return compute, fwd, tot


def held_cost(partitions: np.ndarray, totals: np.ndarray, stages: int) -> np.ndarray:
    """``(T, P)`` layer cost each rank holds at each step (loop placement: virtual stage
    ``v`` runs on rank ``v % P``); ``partitions`` is ``(T, V)``, ``totals`` ``(L,)``."""
    edges = np.concatenate([np.zeros((len(partitions), 1), dtype=np.int64),
                            np.cumsum(partitions, axis=1)], axis=1)
    csum = np.concatenate([[0.0], np.cumsum(totals)])
    per_v = csum[edges[:, 1:]] - csum[edges[:, :-1]]  # (T, V)
    v = per_v.shape[1]
    return per_v.reshape(len(partitions), v // stages, stages).sum(axis=1)


class History:
    """Rank 0's view of the run: see the module docstring.

    ``limit`` bounds the steps kept (older ones are dropped); ``split_backward`` says whether
    the schedule runs W apart from B (it decides how a layer's backward cost is split).
    """

    def __init__(self, stages: int, layers: int, *, limit: int = 512, cost_samples: int = 5,
                 measured_costs: bool = True, split_backward: bool = False) -> None:
        if limit < 2 or cost_samples < 1:
            raise BubblecastError("controller history: limit >= 2 and cost_samples >= 1")
        self.stages, self.layers, self.limit = stages, layers, limit
        self.cost_samples, self.measured = cost_samples, measured_costs
        self.split_backward = split_backward
        self.steps = np.zeros(0, dtype=np.int64)
        self.compute = np.zeros((0, stages))
        self.partitions = np.zeros((0, 0), dtype=np.int64)
        self.microbatches = np.zeros(0, dtype=np.int64)
        self._fwd: list[list[float]] = [[] for _ in range(layers)]
        self._tot: list[list[float]] = [[] for _ in range(layers)]

    def __len__(self) -> int:
        return len(self.steps)

    def add(self, steps: list[int], compute: np.ndarray, partitions: list[tuple[int, ...]],
            microbatches: list[int]) -> None:
        """Append observed steps (``compute`` is ``(n, P)``); keep the last ``limit``."""
        n = compute.shape[0]
        if n == 0:
            return
        parts = np.asarray(partitions[-n:], dtype=np.int64)
        if parts.shape[1] != self.partitions.shape[1]:  # first steps, or chunks changed
            self.partitions = np.zeros((0, parts.shape[1]), dtype=np.int64)
            self.steps, self.compute = self.steps[:0], self.compute[:0]
            self.microbatches = self.microbatches[:0]
        keep = self.limit
        self.steps = np.r_[self.steps, np.asarray(steps[-n:], dtype=np.int64)][-keep:]
        self.compute = np.vstack([self.compute, compute])[-keep:]
        self.partitions = np.vstack([self.partitions, parts])[-keep:]
        self.microbatches = np.r_[self.microbatches,
                                  np.asarray(microbatches[-n:], dtype=np.int64)][-keep:]

    def add_samples(self, fwd: np.ndarray, tot: np.ndarray) -> None:
        """Per-layer cost samples ``(P, L)`` (NaN = none); a layer keeps its first
        ``cost_samples`` samples."""
        for r in range(fwd.shape[0]):
            for i in np.flatnonzero(np.isfinite(tot[r]) & np.isfinite(fwd[r])):
                if len(self._tot[i]) < self.cost_samples and tot[r, i] > 0:
                    self._fwd[i].append(float(fwd[r, i]))
                    self._tot[i].append(float(tot[r, i]))

    def costs(self) -> np.ndarray:
        """``(L, 3)`` F, B, W cost per layer per micro-batch: each layer's median forward
        sample, times one backward/forward ratio shared by all layers (the median over every
        sample: a single sample's ratio comes from one micro-batch's ops and is noisy).
        Layers without samples take the median of the others; uniform when there are none."""
        f = np.array([np.median(s) if s else np.nan for s in self._fwd])
        ratios = [t / x for fs, ts in zip(self._fwd, self._tot, strict=True)
                  for x, t in zip(fs, ts, strict=True) if x > 0]
        if not self.measured or not np.isfinite(f).any() or not ratios:
            f, ratio = np.full(self.layers, 1.0 / 3.0), 3.0
        else:
            f[np.isnan(f)] = np.nanmedian(f)
            ratio = max(float(np.median(ratios)), 1.0)
        back = f * (ratio - 1.0)
        if self.split_backward:
            return np.stack([f, back / 2, back / 2], axis=1)
        return np.stack([f, back, np.zeros_like(f)], axis=1)

    def held(self, costs: np.ndarray) -> np.ndarray:
        """``(T, P)`` layer cost held per rank per step under ``costs``."""
        return held_cost(self.partitions, costs.sum(axis=1), self.stages)

    def speeds(self, costs: np.ndarray) -> np.ndarray:
        """``(T, P)`` speed per rank per step (see the module docstring)."""
        work = self.held(costs) * self.microbatches[:, None]
        return self.compute / np.maximum(work, 1e-300)
