"""torch.distributed.pipelining action lists as bubblecast op orders, and back.

torch writes a schedule as, per rank, a list of actions ``{stage}{type}{microbatch}``:
``F`` forward, ``I`` input backward, ``W`` weight backward, ``B`` full backward, plus
``(a;b)OVERLAP_F_B`` pairs and communication actions (``SEND_F``, ``RECV_B``, ``UNSHARD``,
``REDUCE_GRAD``, ...). Its CSV format (``PipelineScheduleMulti._dump_csv`` /
``_load_csv``, compute-only or with comms) is one row per rank, one action per cell, an empty
cell for an idle slot.

- :func:`lanes_from_actions` keeps the compute actions in order (an overlapped pair as its
  sub-actions in order; communication and idle slots dropped) and maps them to
  :class:`~bubblecast.sim.orders.Op` (``I`` -> ``B``; a ``B`` in a schedule with ``W`` ops
  and no ``W`` of its own is a full backward);
- :func:`torch_lanes` asks torch itself for the order of one of its multi-stage schedule
  classes (``--schedule torch:<ClassName>``), built with stand-in stages (no process group);
- :func:`csv_lanes` reads torch's CSV format (``--schedule csv:FILE``).
"""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Any

from bubblecast.errors import BubblecastError
from bubblecast.sim.orders import Op

_ACTION = re.compile(r"^(\d+)([A-Z_]+?)(\d*)$")
_COMPUTE = {"F": "F", "I": "B", "B": "B", "W": "W"}
_COMM = {"UNSHARD", "RESHARD", "REDUCE_GRAD", "SEND_F", "RECV_F", "SEND_B", "RECV_B"}
#: torch's multi-stage schedule classes ``torch:<ClassName>`` accepts, and their placement.
TORCH_MULTI = {"ScheduleLoopedBFS": "loop", "ScheduleInterleaved1F1B": "loop",
               "ScheduleInterleavedZeroBubble": "loop", "ScheduleZBVZeroBubble": "v",
               "ScheduleDualPipeV": "v"}

Lanes = tuple[list[list[Op]], tuple[tuple[int, ...], ...]]


def parse_action(text: str, where: str = "action") -> list[tuple[int, str, int]]:
    """The compute ops ``(stage, torch type, microbatch)`` of one action string, in order."""
    text = text.strip()
    if not text or text == "None":
        return []
    if text.startswith("(") and ")" in text:
        inner, kind = text[1:].split(")", 1)
        if kind != "OVERLAP_F_B":
            raise BubblecastError(f"{where}: unknown action type '{kind}' in '{text}'")
        return [op for part in inner.split(";") for op in parse_action(part, where)]
    match = _ACTION.match(text)
    if match is None or (match.group(2) not in _COMPUTE and match.group(2) not in _COMM):
        raise BubblecastError(f"{where}: '{text}' is not a torch action "
                              f"(stage, type, microbatch, e.g. 2F0, 1I3, 0W1)")
    stage, kind, mb = match.groups()
    if kind in _COMM:
        return []
    if not mb:
        raise BubblecastError(f"{where}: '{text}' has no microbatch")
    return [(int(stage), kind, int(mb))]


def lanes_from_actions(rows: list[list[str]], where: str) -> Lanes:
    """Per-rank op lists and placement (rank ``r``'s virtual stages, ascending = chunk order)
    from per-rank action strings."""
    parsed = [[op for i, a in enumerate(row) for op in parse_action(a, f"{where}: rank {r} "
                                                                      f"cell {i}")]
              for r, row in enumerate(rows)]
    placement = tuple(tuple(sorted({s for s, _, _ in lane})) for lane in parsed)
    owner: dict[int, int] = {}
    for r, stages in enumerate(placement):
        for s in stages:
            if s in owner:
                raise BubblecastError(f"{where}: stage {s} runs on ranks {owner[s]} and {r}")
            owner[s] = r
    if sorted(owner) != list(range(len(owner))) or len({len(s) for s in placement}) != 1:
        raise BubblecastError(f"{where}: every rank must hold the same number of stages, "
                              f"numbered 0.. without gaps (found {list(placement)})")
    lanes = [[Op(_COMPUTE[k], mb, placement[r].index(s)) for s, k, mb in lane]
             for r, lane in enumerate(parsed)]
    return lanes, placement


def csv_lanes(path: str | Path) -> Lanes:
    """Op lists and placement from torch's schedule CSV (one row per rank)."""
    file = Path(path)
    try:
        with file.open(newline="") as fh:
            rows = [row for row in csv.reader(fh)]
    except OSError as exc:
        raise BubblecastError(f"--schedule csv:{path}: cannot read ({exc.strerror})") from None
    while rows and not any(cell.strip() for cell in rows[-1]):
        rows.pop()
    if not rows:
        raise BubblecastError(f"--schedule csv:{path}: no rows (one row of actions per rank)")
    return lanes_from_actions(rows, f"csv:{path}")


def torch_actions(class_name: str, stages: int, microbatches: int, chunks: int
                  ) -> dict[int, list[str]]:
    """The action strings torch's ``class_name`` generates for every rank (its
    ``pipeline_order``), from stand-in stages: no process group, no model."""
    if class_name not in TORCH_MULTI:
        raise BubblecastError(f"--schedule torch:{class_name}: not one of torch's multi-stage "
                              f"schedule classes ({', '.join(TORCH_MULTI)})")
    import torch
    from torch.distributed.pipelining import schedules

    cls = getattr(schedules, class_name)
    v_style = TORCH_MULTI[class_name] == "v"
    n = stages * chunks
    out: dict[int, list[str]] = {}
    for rank in range(stages):
        ids = [rank, n - 1 - rank] if v_style else [rank + c * stages for c in range(chunks)]
        fake = [_StandIn(stages, rank, n, i, torch.nn.Identity()) for i in ids]
        try:
            order = cls(fake, microbatches).pipeline_order
        except (ValueError, AssertionError, RuntimeError) as exc:
            raise BubblecastError(f"--schedule torch:{class_name}: torch refuses "
                                  f"{stages} stages x {chunks} chunks, {microbatches} "
                                  f"microbatches: {str(exc).splitlines()[0]}") from None
        out[rank] = [str(a) for a in order[rank] if a is not None]
    return out


def torch_lanes(class_name: str, stages: int, microbatches: int, chunks: int) -> Lanes:
    """Op lists and placement of torch's own order for ``class_name``."""
    actions = torch_actions(class_name, stages, microbatches, chunks)
    return lanes_from_actions([actions[r] for r in range(stages)], f"torch:{class_name}")


class _StandIn:
    """The attributes torch's schedule constructors read from a pipeline stage."""

    def __init__(self, group_size: int, rank: int, num_stages: int, index: int,
                 submod: Any) -> None:
        self.group_size, self.group_rank, self.num_stages = group_size, rank, num_stages
        self.stage_index, self.submod = index, submod
        self.is_first, self.is_last = index == 0, index == num_stages - 1
        self.stage_index_to_group_rank: dict[int, int] = {}


def actions_of(ranks: tuple[tuple[Op, ...], ...], placement: tuple[tuple[int, ...], ...],
               ) -> dict[int, list[str]]:
    """Per rank, ops as torch action strings (``I`` for a split input backward)."""
    out = {}
    for r, lane in enumerate(ranks):
        split = {(op.microbatch, op.chunk) for op in lane if op.kind == "W"}
        names = []
        for op in lane:
            kind = "I" if op.kind == "B" and (op.microbatch, op.chunk) in split else op.kind
            names.append(f"{placement[r][op.chunk]}{kind}{op.microbatch}")
        out[r] = names
    return out


def write_csv(path: str | Path, actions: dict[int, list[str]]) -> None:
    """torch's compute-only CSV of ``actions`` (one row per rank)."""
    with Path(path).open("w", newline="") as fh:
        writer = csv.writer(fh)
        for r in sorted(actions):
            writer.writerow(actions[r])
