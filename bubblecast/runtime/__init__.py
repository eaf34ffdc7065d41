"""Pipeline-parallel runtime on torch.distributed.pipelining: trainer, telemetry recorder,
live layer migration, partition-independent checkpoints and slowdown emulation.

Nothing here imports torch at module import time except the modules that only run inside a
worker (``trainer``, ``networks``, ``migration``, ``checkpoint``, ``rank_recorder`` import it inside
their functions), so ``bubblecast --help`` stays fast.
"""

from bubblecast.runtime.inject import Injection, parse_inject
from bubblecast.runtime.plan import Plan, check_plan, even_partition, resolve_schedule
from bubblecast.runtime.train_config import ModelSpec, TrainConfig

__all__ = [
    "Injection", "ModelSpec", "Plan", "TrainConfig", "check_plan", "even_partition",
    "parse_inject", "resolve_schedule",
]  # fmt: skip
