"""Choosing a pipeline schedule within an activation-memory cap (``SetSchedule``).

Every simulable schedule (:data:`bubblecast.sim.schedules.SIMULABLE`; only those torch ships
when ``runnable_only``, as the live runtime needs) is a candidate at the run's stages and
microbatches, with its default chunks per rank (the current chunks for the current schedule),
if its peak in-flight activations (:func:`bubblecast.sim.memory.schedule_peak`, in
microbatches of a rank's activations; 1F1B's is ``P``) fit ``activation_cap``. Each rank
keeps as many layers as it holds, split evenly over the candidate's chunks (which layers
they are follows the candidate's placement, so a switch between placements moves layers:
the decision's ``migration_s`` prices the layers whose rank changes, looped or V-shape, with
the state's :class:`~bubblecast.policy.cost.MigrationCost`); every candidate's step
time is simulated under the same per-rank speeds (:func:`~bubblecast.sim.steptime.
predicted_step`). :func:`choose_schedule` switches when the best candidate saves at least
``min_gain`` of the step; :class:`SchedulePolicy` does so after every step from the last
observed speeds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bubblecast.errors import BubblecastError
from bubblecast.policy.actions import SetSchedule
from bubblecast.policy.cost import schedule_placement
from bubblecast.policy.decision import Decision
from bubblecast.policy.policies import Policy
from bubblecast.policy.state import PolicyState
from bubblecast.sim.memory import schedule_peak
from bubblecast.sim.schedules import SCHEDULES, SIMULABLE, vstage_ranks
from bubblecast.sim.shape import PipelineShape
from bubblecast.sim.steptime import predicted_step, timing_shape
from bubblecast.sim.workload import expand_partition


@dataclass(frozen=True)
class ScheduleOption:
    """One candidate: its shape, the partition it would run, peak activations and step time."""

    shape: PipelineShape
    partition: tuple[int, ...]
    peak_activations: float
    step_s: float
    migration_s: float = 0.0


def rank_layers(shape: PipelineShape, partition: tuple[int, ...]) -> list[int]:
    """Layers each rank holds under ``partition`` (per virtual stage of ``shape``)."""
    owner = vstage_ranks(shape.schedule, shape.stages, len(partition) // shape.stages)
    return np.bincount(owner, weights=np.asarray(partition, float),
                       minlength=shape.stages).astype(int).tolist()


def schedule_options(state: PolicyState, rank_speed: np.ndarray,
                     activation_cap: float | None = None, runnable_only: bool = False
                     ) -> list[ScheduleOption]:
    """Every candidate schedule that fits the cap, with its predicted step time."""
    now = state.pipeline
    per_rank = rank_layers(now, tuple(state.partition))
    layers = int(sum(per_rank))
    out = []
    for name in SIMULABLE:
        spec = SCHEDULES[name]
        if runnable_only and spec.torch_class is None:
            continue
        chunks = now.chunks if name == now.schedule else spec.default_chunks
        try:
            shape = timing_shape(name, now.stages, now.microbatches, chunks, now.comm_s)
            if min(per_rank) < shape.chunks:
                continue
            part = tuple(expand_partition(per_rank, layers, shape.stages, shape.chunks,
                                          name).tolist())
        except BubblecastError:  # this schedule does not fit the shape
            continue
        peak = schedule_peak(name, shape.stages, shape.microbatches, shape.chunks)
        if activation_cap is not None and peak > activation_cap + 1e-9:
            continue
        step, _ = predicted_step(shape, [part], state.costs, np.atleast_2d(rank_speed))
        out.append(ScheduleOption(shape, part, peak, float(step[0, 0]),
                                  switch_seconds(state, shape, part)))
    return out


def switch_seconds(state: PolicyState, shape: PipelineShape, partition: tuple[int, ...]
                   ) -> float:
    """Pause of switching from the state's schedule and partition to ``shape`` running
    ``partition``: the layers whose rank changes under the two placements (0 for the
    current plan itself)."""
    now = state.pipeline
    if shape.schedule == now.schedule and tuple(partition) == tuple(state.partition):
        return 0.0
    old = schedule_placement(now.schedule, now.stages, len(state.partition) // now.stages)
    new = schedule_placement(shape.schedule, shape.stages, shape.chunks)
    seconds = state.migration.seconds(state.partition, partition, old, new)
    if shape.schedule != now.schedule:  # rebuilding the schedule pauses even if nothing moves
        seconds = max(seconds, state.migration.constants.fixed_pause_s)
    return seconds


def choose_schedule(state: PolicyState, rank_speed: np.ndarray,
                    activation_cap: float | None = None, min_gain: float = 0.02,
                    runnable_only: bool = False) -> Decision:
    """``SetSchedule`` to the fastest candidate within the cap when it saves ``min_gain`` of
    the current step time; else keep, saying why."""
    options = schedule_options(state, rank_speed, activation_cap, runnable_only)
    current = next((o for o in options if o.shape.schedule == state.pipeline.schedule), None)
    if current is None:
        now = state.pipeline
        step, _ = predicted_step(now, [tuple(state.partition)], state.costs,
                                 np.atleast_2d(rank_speed))
        now_s = float(step[0, 0])
    else:
        now_s = current.step_s
    if not options:
        return Decision.keep("no schedule fits the activation cap", predicted_step_s=now_s)
    best = min(options, key=lambda o: (o.step_s, o.peak_activations))
    if best.shape.schedule == state.pipeline.schedule or best.step_s > now_s * (1 - min_gain):
        return Decision.keep(f"no schedule within the cap saves {min_gain:.0%} "
                             f"(best {best.shape.schedule})", predicted_step_s=now_s,
                             predicted_step_with_action_s=best.step_s)
    cap = "no cap" if activation_cap is None else f"cap {activation_cap:g}"
    return Decision(SetSchedule(best.shape.schedule), predicted_step_s=now_s,
                    predicted_step_with_action_s=best.step_s, migration_s=best.migration_s,
                    reason=f"{best.shape.schedule} ({best.shape.chunks} chunks) peaks at "
                           f"{best.peak_activations:.2f} microbatches ({cap}) and saves "
                           f"{1 - best.step_s / now_s:.1%} of the step")


@dataclass
class SchedulePolicy(Policy):
    """After every step, switch to the fastest schedule within ``activation_cap`` under the
    last observed per-rank speeds (``runnable_only``: only schedules torch ships)."""

    activation_cap: float | None = None
    min_gain: float = 0.02
    runnable_only: bool = True
    name = "schedule"

    def decide(self, state: PolicyState) -> Decision:
        speed = np.asarray(state.history[-1], dtype=np.float64)
        return choose_schedule(state, speed, self.activation_cap, self.min_gain,
                               self.runnable_only)
