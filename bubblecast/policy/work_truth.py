"""The stand-in for ground truth when a packed-document run has none: a recorded run's own fit.

A simulated packed-document run saves the truth behind its durations (the true micro-batch
cost, each rank's slowdown, each stage's F/B/W), and ``policy-eval`` times every policy's plans
against it. A run recorded on real hardware (``collect --model packed``, ``run --arch
packed``, ``bubblecast.record`` with ``set_documents``) has only its telemetry.
:func:`estimated_truth` builds the :class:`~bubblecast.policy.work_policies.WorkTruth` that
telemetry supports, so the same evaluation answers "what would these plans have done on the
documents this run saw":

- ``cost``: the linear cost model fitted to the run's own compute ops together with per-step
  rank speeds (:func:`bubblecast.policy.work_fit.fit_cost_and_speeds`, in sample);
- ``speed``: those fitted per-step speeds of every rank (its compute over the fit's
  prediction);
- ``vstage_kind``: per step, each stage's recorded F, B and W shares of its compute times the
  layers it held (its chunks sharing them equally);
- ``comm_s``: 0 -- transfers are not part of the fit, so predicted step times are compute and
  bubbles only.

The plans are then timed exactly as against a simulation's truth, noise-free: the figures are
the fit's predictions for this run, not measurements (:data:`ESTIMATED_NOTE` says so in the
report).
"""

from __future__ import annotations

import numpy as np

from bubblecast.errors import BubblecastError
from bubblecast.policy.work_fit import MicrobatchTable, fit_cost_and_speeds
from bubblecast.policy.work_policies import WorkTruth

ESTIMATED_NOTE = ("a recorded run without simulator truth: per-step plans timed against the "
                  "cost model and per-step rank speeds fitted to this run's own telemetry (in "
                  "sample, noise-free, transfers left out) with the engine: predictions, not "
                  "measurements")


def estimated_truth(table: MicrobatchTable, schedule: str, chunks: int, run_id: str
                    ) -> WorkTruth:
    """The :class:`WorkTruth` a recorded run's telemetry supports (see the module doc);
    BubblecastError naming the run when its compute ops hold no work to fit."""
    from bubblecast.sim.schedules import vstage_ranks

    cost, speeds = fit_cost_and_speeds(table, per_step=True)
    if cost is None:
        raise BubblecastError(f"run '{run_id}': no packed micro-batch work to fit a cost "
                              "model to (every compute op has zero tokens)")
    T, _, P, _ = table.shape
    owner = vstage_ranks(schedule, P, chunks)
    total = table.kind_seconds.sum(axis=2, keepdims=True)
    share = np.where(total > 0, table.kind_seconds / np.where(total > 0, total, 1.0), 1.0 / 3)
    per_rank = table.layers.mean(axis=1)[:, :, None] * share  # (T, P, 3), summing to layers
    vstage_kind = per_rank[:, owner, :] / max(1, chunks)
    return WorkTruth(cost, np.asarray(speeds, dtype=np.float64), vstage_kind, owner, 0.0)
