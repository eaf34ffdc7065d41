"""What telemetry says about packed micro-batches: their statistics, each rank's observed
compute per micro-batch, and a linear cost model fitted to them.

:func:`microbatch_table` reads one run's compute ops (SPEC §1 optional columns ``tokens``,
``tokens_sq``, ``documents``, ``layers``) into a :class:`MicrobatchTable`: per step and replica
each logged micro-batch's statistics, and per step, rank and micro-batch the F + B + W seconds
it took there. Nothing else is read: no ``speed`` column, no run metadata beyond the shape.

:func:`fit_cost` fits a :class:`~bubblecast.sim.documents.WorkCost` (per layer, speed 1) by
non-negative least squares of each (rank, micro-batch)'s seconds per layer, divided by a scale
(the rank's speed at that step, when known), on its tokens, tokens_sq and documents.
:func:`fit_cost_and_speeds` fits cost and speeds together when speeds are unknown: it
alternates the cost fit with speeds re-estimated as observed / predicted seconds (per step and
rank, or one per rank), normalised to a median of 1 (the cost carries the scale).
:func:`observed_speeds` is that ratio for any cost: each rank's compute over what the cost
model predicts for the work it ran, the partition- and plan-invariant speed signal policies
forecast.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from bubblecast.errors import BubblecastError
from bubblecast.sim.documents import WorkCost
from bubblecast.telemetry.schema import RunMeta

KINDS = ("F", "B", "W")


@dataclass(frozen=True)
class MicrobatchTable:
    """One run's packed micro-batches as telemetry logged them (see the module doc).

    ``tokens``, ``tokens_sq``, ``documents``: ``(T, R, M)`` per step, replica and logged
    micro-batch (0 where a replica ran fewer); ``compute``: ``(T, R, P, M)`` F + B + W seconds
    of that micro-batch on that rank (all its chunks); ``layers``: ``(T, R, P)`` layers the rank
    held (1 when not logged); ``kind_seconds``: ``(T, P, 3)`` each stage's F, B and W seconds
    per step (a backward that is not split counts as B)."""

    steps: np.ndarray
    tokens: np.ndarray
    tokens_sq: np.ndarray
    documents: np.ndarray
    compute: np.ndarray
    layers: np.ndarray
    kind_seconds: np.ndarray

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """``(T, R, P, M)``."""
        return self.compute.shape  # type: ignore[return-value]

    def rows(self, lo: int, hi: int) -> MicrobatchTable:
        """Steps ``lo .. hi - 1`` (by position; views)."""
        part = slice(lo, hi)
        return MicrobatchTable(self.steps[part], self.tokens[part], self.tokens_sq[part],
                               self.documents[part], self.compute[part], self.layers[part],
                               self.kind_seconds[part])

    def head(self, t: int) -> MicrobatchTable:
        """The first ``t`` steps: what a policy deciding step ``t`` may see."""
        return self.rows(0, t)

    def kind_weights(self) -> tuple[float, float, float]:
        """F, B, W shares of all compute (equal when nothing was observed)."""
        total = self.kind_seconds.sum(axis=(0, 1))
        if total.sum() <= 0:
            return (1.0, 1.0, 1.0)
        return tuple(float(x) for x in total / total.sum())  # type: ignore[return-value]

    def predicted(self, cost: WorkCost) -> np.ndarray:
        """``(T, R, P)`` seconds ``cost`` predicts for each rank's work at each step."""
        per_mb = cost.microbatch(self.tokens, self.tokens_sq, self.documents)  # (T, R, M)
        return per_mb.sum(axis=2)[:, :, None] * self.layers


def microbatch_table(frame: pd.DataFrame, meta: RunMeta) -> MicrobatchTable:
    """The :class:`MicrobatchTable` of one run's compute rows (``frame``: that run's events;
    BubblecastError naming the column when ``tokens``/``tokens_sq``/``documents`` are missing
    or null on a compute op)."""
    comp = frame.loc[frame["op"].astype(str).isin(KINDS)]
    for col in ("tokens", "tokens_sq", "documents"):
        if col not in comp.columns or comp[col].isna().any():
            raise BubblecastError(f"events column '{col}': needed on every compute op of a "
                                  "packed-document run")
    steps = np.unique(comp["step"].to_numpy(np.int64))
    ti = np.searchsorted(steps, comp["step"].to_numpy(np.int64))
    r = comp["replica"].to_numpy(np.int64)
    s = comp["stage"].to_numpy(np.int64)
    m = comp["microbatch"].to_numpy(np.int64)
    if (m < 0).any():
        raise BubblecastError("events column 'microbatch': a compute op of a packed-document run "
                              "has no micro-batch (-1)")
    T, R, P = len(steps), int(meta.replicas), int(meta.stages)
    M = max(int(meta.microbatches), int(m.max()) + 1 if len(m) else 1)
    dur = comp["duration_s"].to_numpy(np.float64)
    compute = np.zeros((T, R, P, M))
    np.add.at(compute, (ti, r, s, m), dur)
    stats = []
    for col in ("tokens", "tokens_sq", "documents"):
        out = np.zeros((T, R, M))
        out[ti, r, m] = comp[col].to_numpy(np.float64)
        stats.append(out)
    layers = np.ones((T, R, P))
    if "layers" in comp.columns and not comp["layers"].isna().any():
        layers[ti, r, s] = comp["layers"].to_numpy(np.float64)
    kind = comp["op"].astype(str).map({"F": 0, "B": 1, "W": 2}).to_numpy(np.int64)
    kind_seconds = np.zeros((T, P, 3))
    np.add.at(kind_seconds, (ti, s, kind), dur)
    return MicrobatchTable(steps, *stats, compute, np.maximum(layers, 1.0), kind_seconds)


def fit_cost(table: MicrobatchTable, scale: np.ndarray | None = None) -> WorkCost | None:
    """Non-negative least squares of each (step, rank, micro-batch)'s seconds per layer, divided
    by ``scale`` (``(T, R, P)``, e.g. the rank's speed; None: 1), on its tokens, tokens_sq and
    documents; None when the table holds no work to fit."""
    T, R, P, M = table.shape
    per = np.broadcast_to(table.layers[..., None], (T, R, P, M))
    if scale is not None:
        per = per * np.asarray(scale, dtype=np.float64)[..., None]
    y = table.compute / per
    x = np.stack([np.broadcast_to(a[:, :, None, :], (T, R, P, M))
                  for a in (table.tokens, table.tokens_sq, table.documents)], axis=-1)
    ok = (table.compute > 0) & (np.broadcast_to(table.tokens[:, :, None, :], y.shape) > 0)
    if not ok.any():
        return None
    a, b = x[ok], y[ok]
    norm = np.sqrt((a * a).sum(axis=0))
    norm[norm == 0] = 1.0
    coef = _nnls_gram((a / norm).T @ (a / norm), (a / norm).T @ b) / norm
    if not np.any(coef > 0):
        return None
    return WorkCost(per_token=float(coef[0]), per_token_sq=float(coef[1]),
                    per_document=float(coef[2]))


def _nnls_gram(gram: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """Non-negative least squares from the normal equations (``A'A``, ``A'b``) of a few
    columns, exactly: the minimiser is the unconstrained fit on its own support, so every
    support is tried and the best non-negative fit kept (``A'b`` misses the constant
    ``b'b``, the same for all)."""
    k = len(rhs)
    best, best_obj = np.zeros(k), 0.0
    for mask in range(1, 1 << k):
        on = np.array([(mask >> i) & 1 for i in range(k)], dtype=bool)
        try:
            x = np.linalg.solve(gram[np.ix_(on, on)], rhs[on])
        except np.linalg.LinAlgError:
            continue
        if (x < 0).any():
            continue
        obj = -float(x @ rhs[on])  # b'b - 2x'A'b + x'A'Ax with A'A x = A'b on the support
        if obj < best_obj - 1e-15 * max(1.0, abs(best_obj)):
            best = np.zeros(k)
            best[on] = x
            best_obj = obj
    return best


def observed_speeds(table: MicrobatchTable, cost: WorkCost) -> np.ndarray:
    """``(T, R, P)`` each rank's observed compute over ``cost``'s prediction for its work (1
    where it ran nothing)."""
    pred = table.predicted(cost)
    obs = table.compute.sum(axis=3)
    return np.where(pred > 0, obs / np.where(pred > 0, pred, 1.0), 1.0)


def fit_cost_and_speeds(table: MicrobatchTable, per_step: bool = True, iterations: int = 3
                        ) -> tuple[WorkCost | None, np.ndarray]:
    """Cost and speeds fitted together (see the module doc): ``(cost, (T, R, P) speeds)``;
    ``per_step`` False keeps one speed per rank (its median ratio over the steps). The
    speeds' median is 1; ``(None, ones)`` when there is nothing to fit."""
    T, R, P, _ = table.shape
    scale = np.ones((T, R, P))
    cost = None
    for _ in range(max(1, iterations)):
        cost = fit_cost(table, scale)
        if cost is None:
            return None, np.ones((T, R, P))
        ratio = observed_speeds(table, cost)
        if not per_step:
            ratio = np.broadcast_to(np.median(ratio, axis=0, keepdims=True), ratio.shape)
        med = float(np.median(ratio))
        scale = ratio / med if med > 0 else np.ones_like(ratio)
    cost = fit_cost(table, scale)
    if cost is None:
        return None, np.ones((T, R, P))
    speeds = observed_speeds(table, cost)
    if not per_step:
        speeds = np.broadcast_to(np.median(speeds, axis=0, keepdims=True), speeds.shape).copy()
    return cost, speeds
