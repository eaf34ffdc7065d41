"""Two-rank scenarios for tests/runtime/test_dist.py, run under torchrun (gloo, CPU).

``python -m torch.distributed.run --standalone --nproc-per-node 2 dist_scenarios.py OUT_DIR``
runs every scenario once (one launch: process start-up dominates) and writes, per rank,
``OUT_DIR/<scenario>-rank<r>.pt`` with losses, layer states and whatever the test checks.
The test compares them with the single-process reference.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from bubblecast.policy.actions import Repartition, SetMicrobatches, SetSchedule
from bubblecast.runtime.plan import SCHEDULES
from bubblecast.runtime.shutdown import exit_process
from bubblecast.runtime.train_config import ModelSpec, TrainConfig
from bubblecast.runtime.trainer import Trainer, init_distributed

SPEC = ModelSpec(kind="gpt", layers=8, hidden=16, seq_len=8, vocab=32, heads=2, dtype="float64")
BASE = {"model": SPEC, "stages": 2, "microbatches": 4, "schedule": "1f1b", "batch_size": 8,
        "optimizer": "adam", "lr": 1e-2, "layer_cost_every": 0}
#: (step, action) applied before that step by the migration scenarios.
SCRIPT = [
    (2, Repartition((3, 5))), (4, Repartition((6, 2))), (5, Repartition((2, 6))),
    (6, SetMicrobatches(2)), (7, SetSchedule("interleaved")), (9, Repartition((1, 3, 2, 2))),
    (10, SetSchedule("zbv")), (12, SetSchedule("1f1b")), (13, SetMicrobatches(4)),
    (14, Repartition((4, 4))),
]
MIGRATION_STEPS = 16


def config(**kw: Any) -> TrainConfig:
    return TrainConfig(**{**BASE, **kw})


def microbatches_at(step: int) -> int:
    """Micro-batches the migration scenario uses at ``step`` (for the reference run)."""
    return 2 if 6 <= step < 13 else 4


def schedules() -> dict[str, Any]:
    out = {}
    for name in SCHEDULES:
        t = Trainer(config(schedule=name), record=False)
        for _ in range(2):
            t.train_step()
        out[name] = {"losses": t.gather_losses(), "state": t.layer_state()}
    return out


def _migrate(drop: bool) -> dict[str, Any]:
    t = Trainer(config(), record=False)
    t.test_drop_optimizer_state = drop
    script = dict(SCRIPT)
    for step in range(MIGRATION_STEPS):
        if step in script:
            t.apply(script[step])
        t.train_step()
    return {"losses": t.gather_losses(), "state": t.layer_state(), "actions": t.actions,
            "partition": t.plan.partition}


def migrate() -> dict[str, Any]:
    return _migrate(drop=False)


def migrate_drop_optimizer_state() -> dict[str, Any]:
    return _migrate(drop=True)


def rollback() -> dict[str, Any]:
    """Faults on one rank in each migration phase: every rank must stay on the old plan."""
    t = Trainer(config(), record=False)
    for _ in range(3):
        t.train_step()
    trials = []
    for phase, bad_rank in (("recv", 1), ("send", 0), ("build", 0)):
        before, plan = t.layer_state(), t.plan

        def fault(p: str, layer: int | None, phase: str = phase, bad: int = bad_rank) -> None:
            if p == phase and t.rank == bad:
                raise RuntimeError(f"injected fault in {phase}")

        t.fault_hook = fault
        rec = t.apply(Repartition((3, 5)))
        after = t.layer_state()
        same = before.keys() == after.keys() and all(
            torch.equal(before[i][k], after[i][k]) for i in before for k in before[i])
        trials.append({"phase": phase, "ok": rec["ok"], "error": rec["error"],
                       "plan_kept": t.plan == plan, "state_unchanged": same})
        t.train_step()  # training goes on, on the old partition
    t.fault_hook = None
    recovered = t.apply(Repartition((3, 5)))
    t.train_step()
    return {"trials": trials, "recovered": recovered["ok"], "partition": t.plan.partition,
            "losses": t.gather_losses(), "state": t.layer_state()}


def checkpoint(out: Path) -> dict[str, Any]:
    """Save at 4|4 after 3 steps; resume at 3|5; both continue 3 steps."""
    ckpt = str(out / "ckpt")
    a = Trainer(config(partition=(4, 4)), record=False)
    for step in range(6):
        if step == 3:
            a.save_checkpoint(ckpt)
        a.train_step()
    b = Trainer(config(partition=(3, 5)), resume=ckpt, record=False)
    start = b.step
    for _ in range(3):
        b.train_step()
    return {"straight": a.gather_losses(), "resumed": b.gather_losses(), "start": start,
            "state_straight": a.layer_state(), "state_resumed": b.layer_state()}


def main(out_dir: str) -> int:
    out = Path(out_dir)
    init_distributed("gloo")
    torch.set_num_threads(1)
    rank = dist.get_rank()
    scenarios = {"schedules": schedules, "migrate": migrate,
                 "migrate_drop_optimizer_state": migrate_drop_optimizer_state,
                 "rollback": rollback, "checkpoint": lambda: checkpoint(out)}
    for name, fn in scenarios.items():
        try:
            result = fn()
        except Exception:  # record it, then fail the job: the ranks may be out of step now
            torch.save({"error": traceback.format_exc()}, out / f"{name}-rank{rank}.pt")
            raise
        torch.save(result, out / f"{name}-rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    exit_process(main(sys.argv[1]))  # no finalization: see runtime.shutdown
