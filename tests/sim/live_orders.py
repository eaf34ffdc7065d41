"""Record one step of every runnable schedule on two ranks (torchrun, gloo, CPU).

``python -m torch.distributed.run --standalone --nproc-per-node 2 live_orders.py OUT_DIR``
trains one recorded step per schedule of :data:`bubblecast.runtime.plan.SCHEDULES` and
leaves its events parts in ``OUT_DIR/<schedule>/``, plus ``OUT_DIR/plans.json`` (the shape
each ran at). ``tests/sim/test_torch_orders.py`` compares the recorded per-rank op order with
the simulated one.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from bubblecast.runtime.plan import SCHEDULES
from bubblecast.runtime.shutdown import exit_process
from bubblecast.runtime.train_config import ModelSpec, TrainConfig
from bubblecast.runtime.trainer import Trainer, init_distributed

SPEC = ModelSpec(kind="gpt", layers=8, hidden=8, seq_len=4, vocab=16, heads=2, dtype="float32")
MICROBATCHES = 4


def main(out_dir: str) -> int:
    out = Path(out_dir)
    init_distributed("gloo")
    torch.set_num_threads(1)
    plans = {}
    for name in SCHEDULES:
        config = TrainConfig(model=SPEC, stages=2, microbatches=MICROBATCHES, schedule=name,
                             batch_size=2 * MICROBATCHES, steps=1, layer_cost_every=0,
                             run_id=name, events_dir=str(out / name))
        trainer = Trainer(config)
        trainer.train_step()
        trainer.close()
        plan = trainer.plan
        plans[name] = {"stages": plan.stages, "microbatches": plan.microbatches,
                       "chunks": plan.chunks}
    if dist.get_rank() == 0:
        (out / "plans.json").write_text(json.dumps(plans))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    exit_process(main(sys.argv[1]))  # no finalization: see runtime.shutdown
