"""What a policy sees (:class:`PolicyState`, :class:`RunContext`) and the planning speed.

A stage's time is its speed times its load, ``fixed + sum of its layers' costs``: ``fixed`` is
the per-op cost that does not move with the layers (launch and framework overhead, per
micro-batch; :attr:`PolicyState.fixed`, 0 unless the run measured it). With it the best split of
a slow stage is further from the compute-only one (live CPU runtime, 12 layers on 2 stages,
one slowed 2x: 9|3, not 8|4), and policies aim there in one move. :meth:`PolicyState.stage_load`,
:meth:`PolicyState.problem` and :meth:`PolicyState.predicted_step` are what policies score with.

The planning speed is the one formula every consumer of the predictive policy uses to turn
speed quantile forecasts into the per-rank speeds it plans on: a risk-weighted mix of the p50
and p90 forecasts (:func:`planning_speed`), averaged over the horizons with each horizon
standing for the steps since the previous one (:func:`mean_planning_speed`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from bubblecast.policy.cost import MigrationCost
from bubblecast.policy.solver import Partition, PartitionProblem, stage_work
from bubblecast.sim.shape import PipelineShape


def horizon_weights(horizons: Sequence[int] | np.ndarray) -> np.ndarray:
    """Steps each of the increasing ``horizons`` stands for (those since the previous one)."""
    return np.diff(np.r_[0, np.asarray(horizons, dtype=np.float64)])


def horizon_grid(horizon: int) -> tuple[np.ndarray, np.ndarray]:
    """Forecast horizons the predictive policy scores (1, 2, 4, ..., ``horizon``) and the
    steps each one stands for."""
    points = [1]
    while points[-1] * 2 <= horizon:
        points.append(points[-1] * 2)
    if points[-1] != horizon:
        points.append(horizon)
    hz = np.array(points, dtype=np.int64)
    weight = np.diff(np.r_[0, hz]).astype(np.float64)
    return hz, weight


def planning_speed(quantiles: np.ndarray, risk: float) -> np.ndarray:
    """``(H, P)`` speeds planned on from ``(H, P, 3)`` p10/p50/p90 speed forecasts:
    ``(1 - risk) x p50 + risk x p90`` (risk 0 = median, 1 = pessimistic)."""
    q = np.asarray(quantiles, dtype=np.float64)
    return (1.0 - risk) * q[:, :, 1] + risk * q[:, :, 2]


def mean_planning_speed(horizons: Sequence[int] | np.ndarray, quantiles: np.ndarray,
                        risk: float) -> np.ndarray:
    """``(P,)`` planning speed averaged over ``horizons``, each weighted by the steps it stands
    for (:func:`horizon_weights`): the speed a policy plans a move on."""
    plan = planning_speed(quantiles, risk)
    weight = horizon_weights(horizons)
    return (plan * weight[:, None]).sum(axis=0) / weight.sum()


@dataclass
class PolicyState:
    """What a policy sees after step ``t`` (index into the run, 0-based).

    ``history`` is ``(t + 1, P)``: each rank's observed speed (compute seconds per unit of
    layer cost; the slowest replica's where there are several) for steps ``0..t``;
    ``costs`` is ``(L, 3)`` per-layer F, B, W cost; ``partition`` the layers per virtual stage
    now in force; ``last_action`` the step index of the policy's last repartition (or None);
    ``fixed`` ``(P,)`` each rank's per-micro-batch cost that stays with the rank whatever layers
    it holds, in ``costs`` units (None: 0; split evenly over a rank's virtual stages and over
    F, B, W like the layers' costs).
    """

    t: int
    history: np.ndarray
    partition: Partition
    costs: np.ndarray
    pipeline: PipelineShape
    migration: MigrationCost
    last_action: int | None = None
    memory: np.ndarray | None = None
    memory_cap: np.ndarray | float | None = None
    fixed: np.ndarray | None = None

    def vspeed(self, rank_speed: np.ndarray) -> np.ndarray:
        """Per-virtual-stage speeds from per-rank ones (each virtual stage at its rank's:
        ``c * P + r`` looped, ``r`` and ``2P - 1 - r`` V-shape)."""
        from bubblecast.sim.schedules import vstage_ranks

        pipe = self.pipeline
        return np.asarray(rank_speed, dtype=np.float64)[
            vstage_ranks(pipe.schedule, pipe.stages, pipe.chunks)]

    @property
    def move_bytes(self) -> np.ndarray | None:
        """Bytes each layer ships when it moves (None when unknown: count layers instead)."""
        b = self.migration.layer_bytes
        return b if np.any(b > 0) else None

    def vfixed(self) -> np.ndarray | None:
        """Per-virtual-stage fixed cost (each rank's split over its chunks), None when none."""
        if self.fixed is None:
            return None
        return self.vspeed(self.fixed) / self.pipeline.chunks

    def stage_load(self, partition: Partition) -> np.ndarray:
        """Per-virtual-stage load under ``partition``: fixed cost plus the layers' costs."""
        work = stage_work(partition, self.costs.sum(axis=1))
        fixed = self.vfixed()
        return work if fixed is None else work + fixed

    def problem(self, rank_speed: np.ndarray) -> PartitionProblem:
        return PartitionProblem(self.costs.sum(axis=1), np.maximum(self.vspeed(rank_speed), 1e-12),
                                memory=self.memory, memory_cap=self.memory_cap,
                                fixed=self.vfixed())

    def predicted_step(self, partitions: list[Partition], speeds: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray]:
        """Engine step time and bubble ``(K, H)`` of each partition under each ``(H, P)``
        speed row, fixed costs included (:func:`bubblecast.sim.steptime.predicted_step`
        without them)."""
        from bubblecast.sim.steptime import (
            op_durations,
            predicted_step,
            shape_graph,
            stage_kind_work,
            step_times,
        )

        fixed = self.vfixed()
        if fixed is None:
            return predicted_step(self.pipeline, partitions, self.costs, speeds)
        speeds = np.atleast_2d(np.asarray(speeds, dtype=np.float64))
        kinds = self.costs.sum(axis=0)
        share = kinds / kinds.sum() if kinds.sum() > 0 else np.array([1.0, 0.0, 0.0])
        vspeed = speeds[:, shape_graph(self.pipeline).rank_of_vstage]  # (H, V)
        work = np.stack([stage_kind_work(p, self.costs) for p in partitions])  # (K, 3, V)
        work = work + share[None, :, None] * fixed[None, None, :]
        per = (work[:, None, :, :] * vspeed[None, :, None, :]).reshape(-1, 3, work.shape[-1])
        step, bubble = step_times(self.pipeline, op_durations(self.pipeline, *per.transpose(
            1, 0, 2)))
        k, h = len(partitions), speeds.shape[0]
        return step.reshape(k, h), bubble.reshape(k, h)


@dataclass
class RunContext:
    """Facts about a run fixed before it starts; only the oracle reads ``true_step_times``.

    ``true_step_times(partitions)`` returns the realised ``(K, T)`` step times (migration
    excluded) of each partition at every step of the run.
    """

    steps: int
    initial: Partition
    true_step_times: Callable[[list[Partition]], np.ndarray] | None = None
    true_speed: np.ndarray | None = None  # (T, P) realised per-rank speeds
