"""Applying an action at a step boundary: new plan, layer migration, two-phase commit.

1. Every rank derives the same new :class:`Plan` from the action (an invalid one is refused
   identically everywhere, with no communication).
2. Layers whose owner changes travel with their optimizer state (:mod:`.migration`); the
   receivers build new module objects, so the old ones stay intact.
3. Each rank builds its new optimizer, stages and schedule (no communication), then all ranks
   vote (``all_gather_object`` of an ok flag). All yes: every rank commits. Any no: every
   rank drops what it built and keeps training on the old plan, with unchanged parameters.

The record of each action (``ok``, ``seconds``, ``bytes``, ``layers_moved``, the partitions)
is appended to ``trainer.actions`` and ends up in ``RunMeta.extra["actions"]``: the policy's
migration cost model reads seconds and bytes from there.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from bubblecast.errors import BubblecastError
from bubblecast.policy.actions import (
    Action,
    NoOp,
    Repartition,
    SetMicrobatches,
    SetSchedule,
    action_to_json,
)
from bubblecast.runtime.migration import FaultHook, install_state, plan_moves, transfer
from bubblecast.runtime.plan import Plan, check_plan, resolve_schedule
from bubblecast.runtime.train_config import TrainConfig


class Trainer(Protocol):
    """What a transition reads and calls on the trainer it switches (``runtime.trainer``'s
    :class:`~bubblecast.runtime.trainer.Trainer`; a protocol here, so that the transition
    does not import the trainer that imports it)."""

    config: TrainConfig
    plan: Plan
    step: int
    rank: int
    world: int
    device: Any
    group: Any
    model: Any  # a LayerModel: make_empty(i) builds layer i with fresh parameters
    layers: dict[int, nn.Module]
    optimizer: torch.optim.Optimizer
    actions: list[dict[str, Any]]
    fault_hook: FaultHook | None
    test_drop_optimizer_state: bool

    def new_optimizer(self, layers: dict[int, nn.Module]) -> torch.optim.Optimizer: ...

    def build_runtime(self, plan: Plan, layers: dict[int, nn.Module]
                      ) -> tuple[list[Any], Any]: ...

    def commit(self, plan: Plan, layers: dict[int, nn.Module],
               optimizer: torch.optim.Optimizer, stages: list[Any], schedule: Any) -> None: ...


def next_plan(plan: Plan, action: Action, batch_size: int | None = None) -> Plan:
    """The plan ``action`` leads to from ``plan``; BubblecastError if it is not runnable."""
    layers = plan.layers
    if isinstance(action, Repartition):
        return check_plan(plan.schedule, plan.stages, plan.microbatches, layers,
                          action.partition, plan.chunks, batch_size)
    if isinstance(action, SetMicrobatches):
        return check_plan(plan.schedule, plan.stages, int(action.microbatches), layers,
                          plan.partition, plan.chunks, batch_size)
    if isinstance(action, SetSchedule):
        info = resolve_schedule(action.schedule)
        chunks = info.default_chunks
        if info.multi and info.style == "loop" and info.default_chunks > 1 and plan.chunks > 1:
            chunks = plan.chunks
        partition = plan.partition if len(plan.partition) == plan.stages * chunks else None
        return check_plan(info.name, plan.stages, plan.microbatches, layers, partition,
                          chunks, batch_size)
    if isinstance(action, NoOp):
        return plan
    raise BubblecastError(f"action: cannot apply {type(action).__name__}")


def apply_action(trainer: Trainer, action: Action) -> dict[str, Any]:
    """Collective over the trainer's group; returns (and records) what happened."""
    old = trainer.plan
    record: dict[str, Any] = {"step": trainer.step, "action": action_to_json(action),
                              "ok": True, "seconds": 0.0, "bytes": 0, "layers_moved": 0,
                              "from": list(old.partition), "to": list(old.partition),
                              "error": None}
    try:
        new = next_plan(old, action, trainer.config.batch_size)
    except BubblecastError as exc:
        record.update(ok=False, error=str(exc))
        trainer.actions.append(record)
        return record
    record["to"] = list(new.partition)
    if new == old:
        trainer.actions.append(record)
        return record
    record.update(_migrate(trainer, old, new))
    trainer.actions.append(record)
    return record


def _migrate(trainer: Trainer, old: Plan, new: Plan) -> dict[str, Any]:
    t0 = time.perf_counter()
    rank, device = trainer.rank, trainer.device
    moves = plan_moves(old.owner(), new.owner())
    got = transfer(moves, rank, trainer.layers, trainer.optimizer,
                   build=lambda i: trainer.model.make_empty(i).to(device), device=device,
                   group=trainer.group, fault_hook=trainer.fault_hook,
                   drop_optimizer_state=trainer.test_drop_optimizer_state)
    error, built = got.error, None
    if error is None:
        try:
            built = _assemble(trainer, new, got)
            if trainer.fault_hook is not None:
                trainer.fault_hook("build", None)
        except Exception as exc:
            error = f"rank {rank}: rebuilding the stage: {exc!r}"
    vote = {"ok": error is None, "error": error, "bytes": got.bytes_sent,
            "seconds": time.perf_counter() - t0}
    votes: list[Any] = [None] * trainer.world
    dist.all_gather_object(votes, vote, group=trainer.group)
    ok = all(v["ok"] for v in votes)
    if ok and built is not None:
        trainer.commit(new, *built)
    errors = [v["error"] for v in votes if v["error"]]
    return {"ok": ok, "error": None if ok else "; ".join(errors),
            "seconds": max(v["seconds"] for v in votes) if ok else time.perf_counter() - t0,
            "bytes": sum(v["bytes"] for v in votes), "layers_moved": len(moves),
            "to": list(new.partition) if ok else list(old.partition),
            "requested": list(new.partition), "schedule": new.schedule,
            "microbatches": new.microbatches}


def _assemble(trainer: Trainer, plan: Plan, got: Any) -> tuple:
    """New layers, optimizer (state carried over), stages and schedule for ``plan``."""
    mine = plan.layers_of(trainer.rank)
    layers = {i: (trainer.layers[i] if i in trainer.layers else got.layers[i]) for i in mine}
    optimizer = trainer.new_optimizer(layers)
    hyper = {k: v for k, v in trainer.optimizer.param_groups[0].items() if k != "params"}
    optimizer.param_groups[0].update(hyper)
    for i in mine:
        if i in trainer.layers:
            for p in layers[i].parameters():
                if p in trainer.optimizer.state:
                    optimizer.state[p] = trainer.optimizer.state[p]
        else:
            states = got.optim.get(i, {})
            for pname, p in layers[i].named_parameters():
                install_state(optimizer, p, states.get(pname, {}))
    stages, schedule = trainer.build_runtime(plan, layers)
    return layers, optimizer, stages, schedule
