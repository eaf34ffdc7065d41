"""Moving layers between ranks: per-layer state (parameters, buffers, optimizer state) over
torch.distributed point-to-point messages.

Every rank walks the same ordered list of moves; in each move the old owner sends and the new
owner receives, so blocking sends and receives cannot deadlock. A rank that fails to pack a
layer still sends a header carrying the error, and a rank that fails to unpack one still
receives its bytes, so one rank's failure never leaves a peer waiting: every rank finishes
the walk and the caller's vote decides commit or rollback. Received layers are new module
objects; the senders' layers are only read, so a rollback only has to drop the new objects.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

#: ``fault_hook(phase, layer)``: test hook called at "send" (before packing a layer), "recv"
#: (after receiving one) and "build" (after building the new runtime, before the vote).
FaultHook = Callable[[str, "int | None"], None]


@dataclass
class Move:
    layer: int
    src: int
    dst: int


@dataclass
class Received:
    """What a rank received in a migration: new layer modules and their optimizer state."""

    layers: dict[int, nn.Module] = field(default_factory=dict)
    optim: dict[int, dict[str, dict[str, Any]]] = field(default_factory=dict)
    bytes_sent: int = 0
    bytes_received: int = 0
    error: str | None = None


def plan_moves(old_owner: list[int], new_owner: list[int]) -> list[Move]:
    """Layers whose owner changes, in global layer order."""
    pairs = enumerate(zip(old_owner, new_owner, strict=True))
    return [Move(i, a, b) for i, (a, b) in pairs if a != b]


def pack_layer(layer: nn.Module, optimizer: torch.optim.Optimizer | None,
               drop_optimizer_state: bool = False) -> tuple[dict[str, Any], list[torch.Tensor]]:
    """A layer's state as (header, tensors): module state_dict and per-parameter optimizer state.

    Names are ``m|<state_dict key>`` and ``o|<parameter name>|<state key>``; non-tensor state
    values travel in the header. ``drop_optimizer_state`` exists only for negative-control
    tests (it loses the optimizer state, which a correct migration must never do).
    """
    names, tensors, values = [], [], {}
    for key, t in layer.state_dict().items():
        names.append(f"m|{key}")
        tensors.append(t.detach())
    if optimizer is not None and not drop_optimizer_state:
        for pname, p in layer.named_parameters():
            for key, val in optimizer.state.get(p, {}).items():
                name = f"o|{pname}|{key}"
                if isinstance(val, torch.Tensor):
                    names.append(name)
                    tensors.append(val.detach())
                else:
                    values[name] = val
    header = {"names": names, "dtypes": [str(t.dtype).removeprefix("torch.") for t in tensors],
              "shapes": [tuple(t.shape) for t in tensors],
              "on_cpu": [t.device.type == "cpu" for t in tensors], "values": values}
    return header, tensors


def unpack_layer(layer: nn.Module, header: dict[str, Any],
                 tensors: list[torch.Tensor]) -> dict[str, dict[str, Any]]:
    """Load module state into ``layer``; return optimizer state keyed by parameter name."""
    module_state: dict[str, torch.Tensor] = {}
    optim: dict[str, dict[str, Any]] = {}
    for name, t in zip(header["names"], tensors, strict=True):
        kind, rest = name.split("|", 1)
        if kind == "m":
            module_state[rest] = t
        else:
            pname, key = rest.split("|", 1)
            optim.setdefault(pname, {})[key] = t
    for name, val in header["values"].items():
        _, pname, key = name.split("|", 2)
        optim.setdefault(pname, {})[key] = val
    layer.load_state_dict(module_state, strict=True)
    return optim


def _groups(header: dict[str, Any]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for i, dtype in enumerate(header.get("dtypes", [])):
        out.setdefault(dtype, []).append(i)
    return out


def send_layer(header: dict[str, Any], tensors: list[torch.Tensor], dst: int,
               device: torch.device, group: Any = None) -> int:
    """Send a packed layer (header as an object, then one flat buffer per dtype); bytes sent."""
    dist.send_object_list([header], dst=dst, group=group, device=device)
    sent = 0
    for idx in _groups(header).values():
        flat = torch.cat([tensors[i].reshape(-1).to(device) for i in idx])
        dist.send(flat, dst=dst, group=group)
        sent += flat.numel() * flat.element_size()
    return sent


def recv_layer(src: int, device: torch.device,
               group: Any = None) -> tuple[dict[str, Any], list[torch.Tensor], int]:
    """Receive what :func:`send_layer` sent; tensors land on ``device`` (or CPU if they were)."""
    box: list[Any] = [None]
    dist.recv_object_list(box, src=src, group=group, device=device)
    header = box[0]
    tensors: list[torch.Tensor | None] = [None] * len(header.get("names", []))
    got = 0
    for dtype, idx in _groups(header).items():
        sizes = [int(torch.Size(header["shapes"][i]).numel()) for i in idx]
        flat = torch.empty(sum(sizes), dtype=getattr(torch, dtype), device=device)
        dist.recv(flat, src=src, group=group)
        got += flat.numel() * flat.element_size()
        for i, part in zip(idx, flat.split(sizes), strict=True):
            t = part.view(header["shapes"][i]).clone()
            tensors[i] = t.cpu() if header["on_cpu"][i] else t
    return header, tensors, got  # type: ignore[return-value]


def transfer(moves: list[Move], rank: int, layers: dict[int, nn.Module],
             optimizer: torch.optim.Optimizer | None, build: Callable[[int], nn.Module],
             device: torch.device, group: Any = None, fault_hook: FaultHook | None = None,
             drop_optimizer_state: bool = False) -> Received:
    """Walk ``moves``; this rank sends the layers it gives away and receives those it gets.

    Never raises for a local fault (it is recorded in ``Received.error``); communication
    errors (a dead peer) propagate.
    """
    out = Received()
    for move in moves:
        if rank == move.src:
            try:
                if fault_hook is not None:
                    fault_hook("send", move.layer)
                header, tensors = pack_layer(layers[move.layer], optimizer, drop_optimizer_state)
            except Exception as exc:
                out.error = out.error or f"rank {rank}: packing layer {move.layer}: {exc!r}"
                header, tensors = {"error": out.error, "names": []}, []
            out.bytes_sent += send_layer(header, tensors, move.dst, device, group)
        elif rank == move.dst:
            header, tensors, got = recv_layer(move.src, device, group)
            out.bytes_received += got
            if "error" in header:
                out.error = out.error or f"peer failed: {header['error']}"
                continue
            try:
                layer = build(move.layer)
                out.optim[move.layer] = unpack_layer(layer, header, tensors)
                out.layers[move.layer] = layer
                if fault_hook is not None:
                    fault_hook("recv", move.layer)
            except Exception as exc:
                out.error = out.error or f"rank {rank}: unpacking layer {move.layer}: {exc!r}"
    return out


def install_state(optimizer: torch.optim.Optimizer, param: torch.Tensor,
                  state: dict[str, Any]) -> None:
    """Set ``optimizer``'s state for ``param``: tensors shaped like it go to its device."""
    if not state:
        return
    optimizer.state[param] = {
        k: (v.to(param.device) if isinstance(v, torch.Tensor) and v.shape == param.shape else v)
        for k, v in state.items()
    }
