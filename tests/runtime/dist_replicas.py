"""Four-rank scenarios for tests/runtime/test_replicas.py: 2 replicas x 2 stages under
torchrun (gloo, CPU), tiny float64 models.

``python -m torch.distributed.run --standalone --nproc-per-node 4 dist_replicas.py OUT_DIR``
runs each scenario once and writes ``OUT_DIR/<scenario>-rank<r>.pt`` (losses, layer states,
micro-batch counts); the test compares them with the single-process reference.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from bubblecast.policy import work_plan
from bubblecast.runtime.shutdown import exit_process
from bubblecast.runtime.train_config import ModelSpec, TrainConfig
from bubblecast.runtime.trainer import Trainer, init_distributed

PACKED = ModelSpec(kind="packed", layers=4, hidden=8, seq_len=64, vocab=29, heads=2,
                   dtype="float64")
MLP = ModelSpec(kind="mlp", layers=4, hidden=8, dtype="float64")
COMMON = {"stages": 2, "replicas": 2, "microbatches": 4, "schedule": "1f1b",
          "optimizer": "sgd", "lr": 0.5, "momentum": 0.9, "layer_cost_every": 0, "seed": 5}
STEPS = 3
#: Per-replica speeds of the fixed planner (replica 0 twice as slow: it runs fewer).
SPEEDS = (2.0, 1.0)


def packed_config() -> TrainConfig:
    return TrainConfig(model=PACKED, **COMMON)


def mlp_config() -> TrainConfig:
    return TrainConfig(model=MLP, batch_size=16, **COMMON)


class FixedSpeeds:
    """A planner for the test: token balancing at fixed replica speeds on even steps, the
    loader's own packing on odd ones (so the schedule objects switch back and forth)."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def plan(self, step: int) -> Any:
        if step % 2:
            return self.loader.static_plan(step)
        return work_plan.plan_batch(self.loader.lengths(step), self.loader.config,
                                    work_plan.TOKENS, SPEEDS)

    def observe(self, step: int, seconds: float) -> None:
        pass

    def close(self) -> None:
        pass


def packed() -> dict[str, Any]:
    t = Trainer(packed_config(), record=False)
    t.packed.planner = FixedSpeeds(t.packed.loader)
    for _ in range(STEPS):
        t.train_step()
    return {"losses": t.gather_losses(), "state": t.layer_state(), "rank": t.rank,
            "replica": t.replica, "counts": dict(t.packed.counts)}


def mlp() -> dict[str, Any]:
    t = Trainer(mlp_config(), record=False)
    for _ in range(STEPS):
        t.train_step()
    return {"losses": t.gather_losses(), "state": t.layer_state(), "rank": t.rank,
            "replica": t.replica}


def main(out_dir: str) -> int:
    out = Path(out_dir)
    init_distributed("gloo")
    torch.set_num_threads(1)
    rank = dist.get_rank()
    for name, fn in {"packed": packed, "mlp": mlp}.items():
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
