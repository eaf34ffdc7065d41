"""What a policy sees (:class:`PolicyState`, :class:`RunContext`) and the planning speed.

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
from bubblecast.policy.solver import Partition, PartitionProblem
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
    now in force; ``last_action`` the step index of the policy's last repartition (or None).
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

    def problem(self, rank_speed: np.ndarray) -> PartitionProblem:
        return PartitionProblem(self.costs.sum(axis=1), np.maximum(self.vspeed(rank_speed), 1e-12),
                                memory=self.memory, memory_cap=self.memory_cap)


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
