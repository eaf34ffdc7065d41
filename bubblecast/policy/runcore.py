"""The types and arithmetic shared by the two ways of loading a run for evaluation.

See :mod:`bubblecast.policy.rundata` (ground truth, and the loader) and
:mod:`bubblecast.policy.replaydata` (logged runs): both write each compute op as
``multiplier x nominal`` with the helpers here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from bubblecast.policy.solver import Partition
from bubblecast.sim.shape import PipelineShape, even_partition
from bubblecast.sim.steptime import stage_kind_work
from bubblecast.telemetry.schema import RunMeta

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
