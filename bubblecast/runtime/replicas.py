"""Data-parallel replicas of the pipeline: which rank is which, their process groups, and the
gradient all-reduce between them.

A job of ``replicas x stages`` ranks runs ``replicas`` copies of the pipeline. Global rank
``g`` is stage ``g % stages`` of replica ``g // stages`` (a replica's ranks are consecutive,
so they share a node first). Each replica's stages talk over their *pipeline* group; the
ranks holding the same stage in every replica form that stage's *data-parallel* group, over
which gradients are all-reduced after each step (summed: the packed model's loss is already
divided by the whole global batch's tokens; averaged for the fixed-batch models, whose
micro-batch losses are means). Imported only inside workers (torch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Layout:
    """Where global ranks sit: ``replicas`` pipelines of ``stages`` consecutive ranks."""

    stages: int
    replicas: int = 1

    @property
    def world(self) -> int:
        return self.stages * self.replicas

    def replica_of(self, rank: int) -> int:
        return rank // self.stages

    def stage_of(self, rank: int) -> int:
        return rank % self.stages

    def pipeline_ranks(self, replica: int) -> list[int]:
        """Global ranks of ``replica``'s pipeline, stage by stage."""
        return list(range(replica * self.stages, (replica + 1) * self.stages))

    def stage_ranks(self, stage: int) -> list[int]:
        """Global ranks holding ``stage``, replica by replica (its data-parallel group)."""
        return [r * self.stages + stage for r in range(self.replicas)]


def make_groups(layout: Layout) -> tuple[Any, Any]:
    """Collective over the whole job: this rank's ``(pipeline group, data-parallel group)``.
    With one replica: ``(None, None)`` (the default group is the pipeline). Every rank
    creates every group, in the same order, as ``torch.distributed.new_group`` requires."""
    if layout.replicas == 1:
        return None, None
    rank = dist.get_rank()
    pipe = dp = None
    for r in range(layout.replicas):
        group = dist.new_group(layout.pipeline_ranks(r))
        if layout.replica_of(rank) == r:
            pipe = group
    for s in range(layout.stages):
        group = dist.new_group(layout.stage_ranks(s))
        if layout.stage_of(rank) == s:
            dp = group
    return pipe, dp


def allreduce_grads(params: list[torch.nn.Parameter], group: Any, divide: float = 1.0) -> None:
    """Collective over ``group``: sum every parameter's gradient over its members (in one flat
    buffer), then divide by ``divide``; a missing gradient counts as zeros."""
    if not params:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
    if divide != 1.0:
        flat /= divide
    at = 0
    for p, g in zip(params, grads, strict=True):
        n = g.numel()
        piece = flat[at:at + n].view_as(g)
        if p.grad is None:
            p.grad = piece.clone()
        else:
            p.grad.copy_(piece)
        at += n


def allreduce_sum(value: float, group: Any, device: Any = "cpu") -> float:
    """Collective over ``group``: the sum of ``value`` over its members (float64)."""
    box = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(box, op=dist.ReduceOp.SUM, group=group)
    return float(box.item())


def shared_origin(origin_wall: float | None, device: Any = "cpu") -> float:
    """Collective over the whole job: global rank 0's clock origin (``origin_wall`` or its
    wall clock now), so that every replica's events count from the same instant."""
    from bubblecast.runtime.clock import wall_clock

    box = torch.tensor([wall_clock() if origin_wall is None else float(origin_wall)],
                       dtype=torch.float64, device=device)
    dist.broadcast(box, src=0)
    return float(box.item())
