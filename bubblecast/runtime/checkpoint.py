"""Partition-independent checkpoints: one file per global layer, plus ``meta.json``.

``layer_00007.pt`` holds layer 7's module state and its optimizer state keyed by parameter
name, whoever owned it; ``meta.json`` (written last, by rank 0, after every rank has written
its layers) holds the step to resume at and the model and optimizer settings. A run saved
under one partition resumes under any other: each rank loads the layers it now owns.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from bubblecast.errors import BubblecastError
from bubblecast.telemetry.io import atomic_write, atomic_write_text

META = "meta.json"


def layer_file(path: str | Path, index: int) -> Path:
    return Path(path) / f"layer_{index:05d}.pt"


def optimizer_state(layer: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, dict]:
    """Optimizer state of ``layer``'s parameters, keyed by parameter name (CPU copies)."""
    out: dict[str, dict[str, Any]] = {}
    for pname, p in layer.named_parameters():
        state = optimizer.state.get(p)
        if state:
            out[pname] = {k: v.detach().cpu().clone() if isinstance(v, torch.Tensor) else v
                          for k, v in state.items()}
    return out


def save(path: str | Path, layers: dict[int, nn.Module], optimizer: torch.optim.Optimizer,
         meta: dict[str, Any], group: Any = None) -> Path:
    """Collective: every rank writes its layers, then rank 0 writes ``meta.json``."""
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    for index, layer in layers.items():
        payload = {"module": {k: v.detach().cpu().clone() for k, v in layer.state_dict().items()},
                   "optim": optimizer_state(layer, optimizer)}
        atomic_write(layer_file(root, index), lambda tmp, p=payload: torch.save(p, tmp))
    dist.barrier(group=group)
    if dist.get_rank(group) == 0:
        atomic_write_text(root / META, json.dumps(meta, indent=1, sort_keys=True))
    dist.barrier(group=group)
    return root


def read_meta(path: str | Path) -> dict[str, Any]:
    file = Path(path) / META
    if not file.exists():
        raise BubblecastError(f"{path}: not a complete bubblecast checkpoint (no {META})")
    try:
        return json.loads(file.read_text())
    except ValueError as exc:
        raise BubblecastError(f"{file}: unreadable checkpoint metadata ({exc})") from None


def load_layer(path: str | Path, index: int) -> tuple[dict[str, torch.Tensor], dict[str, dict]]:
    """(module state, optimizer state by parameter name) of layer ``index``."""
    file = layer_file(path, index)
    if not file.exists():
        raise BubblecastError(f"{file}: missing from the checkpoint")
    payload = torch.load(file, map_location="cpu", weights_only=True)
    return payload["module"], payload["optim"]
