"""The one launcher of the torchrun scenario scripts the dist tests share: run a script on N
gloo ranks, then read back every ``<scenario>-rank<r>.pt`` it saved (failing on a launch error,
with the log's tail, or on a rank that recorded an error)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def launch_scenarios(out: Path, ranks: int, script: Path) -> dict[str, list[dict[str, Any]]]:
    """``{scenario: [each rank's saved dict]}`` of ``script`` run on ``ranks`` processes."""
    from bubblecast.runtime.launch import failure_message, launch

    code = launch(out, ranks, script=str(script), timeout=300)
    assert code == 0, failure_message(out) + "\n" + (out / "torchrun.log").read_text()[-3000:]
    found: dict[str, list[dict[str, Any]]] = {}
    for file in sorted(out.glob("*-rank*.pt")):
        name, _ = file.stem.rsplit("-rank", 1)
        found.setdefault(name, []).append(torch.load(file, weights_only=False))
    for name, per_rank in found.items():
        for r in per_rank:
            assert "error" not in r, f"{name}: {r.get('error')}"
    return found
