"""Two-rank scenarios for tests/runtime/test_live_plan.py (torchrun, gloo, CPU): the live
planner of the packed model (1 replica x 2 stages and 2 replicas x 1 stage), its fail-open
path (a planner that raises, plans a broken step, then its process exits), and the loader's
order on the same steps for comparison.

``python -m torch.distributed.run --standalone --nproc-per-node 2 dist_live_plan.py OUT_DIR``
writes ``OUT_DIR/<scenario>-rank<r>.pt``.
"""

from __future__ import annotations

import os
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from bubblecast.errors import BubblecastError
from bubblecast.policy.work_plan import WorkPlan
from bubblecast.runtime.live_plan import LivePlanner
from bubblecast.runtime.plan_worker import PlanWorker
from bubblecast.runtime.shutdown import exit_process
from bubblecast.runtime.train_config import ModelSpec, TrainConfig
from bubblecast.runtime.trainer import Trainer, init_distributed

SPEC = ModelSpec(kind="packed", layers=4, hidden=8, seq_len=64, vocab=29, heads=2,
                 dtype="float64")
STEPS = 6
#: Steps whose plan the broken planner spoils: it raises at 2, drops a document at 3, and its
#: process exits at 4 (4 and 5 then run the loader's order).
RAISES, DROPS, DIES = 2, 3, 4


def config(**kw: Any) -> TrainConfig:
    base = {"model": SPEC, "stages": 2, "microbatches": 4, "schedule": "1f1b",
            "optimizer": "sgd", "lr": 0.3, "layer_cost_every": 0, "seed": 7}
    return TrainConfig(**{**base, **kw})


def run(**kw: Any) -> dict[str, Any]:
    t = Trainer(config(**kw), record=True)
    for _ in range(STEPS):
        t.train_step()
    planner = t.packed.planner
    out = {"losses": t.gather_losses(), "state": t.layer_state(), "rank": t.global_rank,
           "counts": dict(t.packed.counts),
           "decisions": list(planner.decisions) if planner is not None else []}
    t.packed.close()
    t.recording.close()
    return out


@dataclass
class BrokenWorker(PlanWorker):
    """A planner that raises at step RAISES, drops a document at DROPS and exits (code 3)
    at DIES (its class crosses into the worker process, as a user's subclass would)."""

    def plan_step(self, step: int, speeds: Any, seen: bool) -> tuple[WorkPlan, dict[str, Any]]:
        plan, record = super().plan_step(step, speeds, seen)
        if step == RAISES:
            raise BubblecastError("planner broke on purpose")
        if step == DROPS:  # the first micro-batch loses its first document
            first = plan.microbatches[0]
            plan = WorkPlan(((first[0][1:], *first[1:]), *plan.microbatches[1:]))
        if step == DIES:
            os._exit(3)
        return plan, record


def broken() -> dict[str, Any]:
    t = Trainer(config(), record=True)
    t.packed.planner = LivePlanner(t, "tokens", worker=BrokenWorker)
    for _ in range(STEPS):
        t.train_step()
    out = {"losses": t.gather_losses(), "rank": t.global_rank,
           "decisions": list(t.packed.planner.decisions)}
    t.packed.close()
    t.recording.close()
    return out


def main(out_dir: str) -> int:
    out = Path(out_dir)
    init_distributed("gloo")
    torch.set_num_threads(1)
    rank = dist.get_rank()
    scenarios = {"static": lambda: run(), "tokens": lambda: run(planner="tokens"),
                 "static_dp": lambda: run(stages=1, replicas=2, microbatches=3),
                 "tokens_dp": lambda: run(stages=1, replicas=2, microbatches=3,
                                          planner="tokens"),
                 "broken": broken}
    for name, fn in scenarios.items():
        try:
            result = fn()
        except Exception:
            torch.save({"error": traceback.format_exc()}, out / f"{name}-rank{rank}.pt")
            raise
        torch.save(result, out / f"{name}-rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    exit_process(main(sys.argv[1]))  # no finalization: see runtime.shutdown
