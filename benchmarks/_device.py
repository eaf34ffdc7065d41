"""What the GPU check's sections share: the device's dtype and backend, one rank's process
group, and timestamped progress lines (``device_check.py``, ``device_check_packed.py``)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def dtype_for(device: Any) -> Any:
    """bf16 on CUDA, float32 on CPU (the dry run)."""
    import torch

    return torch.bfloat16 if device.type == "cuda" else torch.float32


def backend_for(device: Any) -> str:
    """NCCL on CUDA (the virtual stages of one rank exchange shapes and activations through
    point-to-point sends to itself, which torch 2.11's gloo refuses), gloo on CPU."""
    return "nccl" if device.type == "cuda" else "gloo"


@contextlib.contextmanager
def one_rank_group(device: Any, store_path: Path) -> Iterator[None]:
    """A one-rank default process group for ``device`` (a file store at ``store_path``),
    destroyed on exit."""
    import torch.distributed as dist

    store = dist.FileStore(str(store_path), 1)
    dist.init_process_group(backend_for(device), store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def progress(what: str) -> None:
    """One timestamped progress line, flushed (a launch cut short shows how far it got)."""
    print(f"[{time.strftime('%H:%M:%S')}] {what}", flush=True)
