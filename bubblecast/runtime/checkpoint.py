"""Partition-independent checkpoints: one file per global layer, plus ``meta.json``.

``layer_00007.pt`` holds layer 7's module state and its optimizer state keyed by parameter
name, whoever owned it; ``meta.json`` (written last, by rank 0, after every rank has written
its layers) holds the step to resume at and the model and optimizer settings. A run saved
under one partition resumes under any other: each rank loads the layers it now owns.
The command line keeps one folder per checkpoint (``step-{K:08d}``) and resumes from the
latest complete one. torch is imported inside the functions that need it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bubblecast.errors import BubblecastError
from bubblecast.telemetry.io import atomic_write, atomic_write_text

if TYPE_CHECKING:
    import torch
    from torch import nn

META = "meta.json"
_STEP = re.compile(r"step-(\d+)")


def step_dir(root: str | Path, step: int) -> Path:
    """``ROOT/step-00000020``: the checkpoint taken before step 20 (the CLI's layout)."""
    return Path(root) / f"step-{step:08d}"


def schedule(root: str | Path, every: int, start: int, until: int) -> dict[int, str]:
    """Checkpoints every ``every`` steps after ``start`` up to ``until``: step -> folder."""
    first = (start // every + 1) * every
    return {s: str(step_dir(root, s)) for s in range(first, until + 1, every)}


def latest(root: str | Path) -> Path | None:
    """The complete checkpoint (its ``meta.json`` written) of the highest step under ``root``."""
    found = [(int(m.group(1)), p) for p in Path(root).glob("step-*")
             if (m := _STEP.fullmatch(p.name)) and (p / META).is_file()]
    return max(found)[1] if found else None


def layer_file(path: str | Path, index: int) -> Path:
    return Path(path) / f"layer_{index:05d}.pt"


def optimizer_state(layer: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, dict]:
    """Optimizer state of ``layer``'s parameters, keyed by parameter name (CPU copies)."""
    import torch

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
    import torch
    import torch.distributed as dist

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
    import torch

    file = layer_file(path, index)
    if not file.exists():
        raise BubblecastError(f"{file}: missing from the checkpoint")
    payload = torch.load(file, map_location="cpu", weights_only=True)
    return payload["module"], payload["optim"]


@dataclass(frozen=True)
class CheckpointOptions:
    """``--checkpoint-dir``, ``--checkpoint-every`` and ``--resume`` of ``collect`` and ``run``.

    Checkpoints go to ``directory/step-{K:08d}`` every ``every`` steps; ``resume`` starts
    from the latest complete one there and runs up to the configured step count.
    """

    directory: str | None = None
    every: int | None = None
    resume: bool = False

    def __post_init__(self) -> None:
        if self.every is not None and (isinstance(self.every, bool) or self.every < 1):
            raise BubblecastError(f"--checkpoint-every: must be a positive integer, got "
                                  f"{self.every}")
        if self.directory is None:
            if self.every is not None or self.resume:
                option = "--resume" if self.resume else "--checkpoint-every"
                raise BubblecastError(f"{option}: needs --checkpoint-dir")
        elif self.every is None and not self.resume:
            raise BubblecastError("--checkpoint-dir: give --checkpoint-every N (to save) "
                                  "or --resume (to continue)")
        elif Path(self.directory).exists() and not Path(self.directory).is_dir():
            raise BubblecastError(f"--checkpoint-dir: {self.directory} is not a directory")

    def resolve(self, model: dict[str, Any], steps: int) -> tuple[str | None, int,
                                                                   dict[int, str]]:
        """(checkpoint to resume from or None, first step, step -> checkpoint folder to save)
        for a run of ``steps`` steps of ``model`` (its settings as a dict); BubblecastError
        (one line) when there is nothing to resume from or the checkpoint does not fit."""
        resume, start = None, 0
        if self.resume:
            assert self.directory is not None
            found = latest(self.directory)
            if found is None:
                raise BubblecastError(f"--resume: no complete checkpoint in {self.directory}")
            meta = read_meta(found)
            if meta.get("model") != model:
                raise BubblecastError(f"--resume: checkpoint {found} is of model "
                                      f"{meta.get('model')}, this run's is {model}")
            resume, start = str(found), int(meta["step"])
            if start >= steps:
                raise BubblecastError(f"--resume: checkpoint {found} is at step {start}; "
                                      f"--steps {steps} leaves nothing to run")
        at = schedule(self.directory, self.every, start, steps) if self.every else {}
        return resume, start, at
