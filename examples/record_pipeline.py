"""Record a torch.distributed.pipelining training loop with bubblecast (CPU, gloo).

    torchrun --nproc-per-node 2 examples/record_pipeline.py [OUT] [--schedule 1f1b]
    bubblecast inspect telemetry/run_id=example

Each rank holds half of a small MLP; ``bubblecast.record`` wraps the schedule, and every
``schedule.step(...)`` becomes one recorded step in ``OUT/run_id=example/`` (default OUT:
telemetry/).
"""

import argparse

import torch
import torch.distributed as dist
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)

import bubblecast

SCHEDULES = {"1f1b": Schedule1F1B, "gpipe": ScheduleGPipe, "interleaved": ScheduleInterleaved1F1B}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default="telemetry/")
    ap.add_argument("--schedule", choices=sorted(SCHEDULES), default="1f1b")
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = 2 if args.schedule == "interleaved" else 1
    torch.manual_seed(0)  # every rank builds the same full model, then keeps its layers
    layers = [torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Tanh())
              for _ in range(4 * world)]
    per = len(layers) // (world * chunks)
    stages = [PipelineStage(torch.nn.Sequential(*layers[v * per:(v + 1) * per]), v,
                            world * chunks, torch.device("cpu"))
              for v in range(rank, world * chunks, world)]  # virtual stages of this rank
    schedule_cls = SCHEDULES[args.schedule]
    schedule = schedule_cls(stages if chunks > 1 else stages[0], n_microbatches=4,
                            loss_fn=torch.nn.functional.mse_loss)
    params = [p for s in stages for p in s.submod.parameters()]
    opt = torch.optim.SGD(params, lr=0.05)

    with bubblecast.record(schedule, out=args.out, run_id="example", optimizer=opt) as rec:
        for step in range(args.steps):
            g = torch.Generator().manual_seed(step)
            x, y = torch.randn(16, 32, generator=g), torch.randn(16, 32, generator=g)
            # a loader that packs documents into micro-batches knows their lengths: one list
            # per micro-batch (made up here, this MLP has no sequence); they fill the tokens,
            # tokens_sq and documents columns
            rec.set_documents([torch.randint(1, 64, (3,), generator=g).tolist()
                               for _ in range(4)])
            if rank == 0:
                schedule.step(x, target=y if world == 1 else None)
            elif rank == world - 1:
                schedule.step(target=y)
            else:
                schedule.step()
            opt.step()
            opt.zero_grad()
    if rank == 0:
        print(f"recorded {rec.step} steps ({rec.timing} timing) in {rec.events_dir}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
