"""Op orders of the V-shape schedules: rank ``r`` holds virtual stages ``r`` (chunk 0) and
``2P - 1 - r`` (chunk 1), so the model goes down the ranks and back up.

- :func:`zbv`: the zero-bubble paper's handcrafted ZB-V (Qi et al. 2023, section 6), as
  torch.distributed.pipelining's ScheduleZBVZeroBubble generates it (torch 2.13).
- :func:`dualpipev`: DeepSeek's DualPipe in its V form, as torch's ScheduleDualPipeV
  generates it: overlapped forward/backward pairs (run as F then B here, as torch runs them
  without a custom overlap function), some backwards fused (B with no separate W).

Pure-Python ports (no torch import); ``tests/sim/test_torch_orders.py`` checks them against
the orders torch itself generates.
"""

from __future__ import annotations

from bubblecast.sim.orders import Op


def zbv(p: int, m: int) -> list[list[Op]]:
    """torch's ScheduleZBVZeroBubble order (its ``_calculate_single_rank_operations``)."""
    n = max(2 * p - 1, m)  # torch pads to 2P - 1 microbatches and drops the extra ops
    out = []
    for r in range(p):
        lane: list[Op] = []

        def put(kind: str, mb: int, chunk: int, lane: list[Op] = lane) -> None:
            if mb < m:
                lane.append(Op(kind, mb, chunk))

        f0 = f1 = b0 = b1 = 0
        for _ in range(2 * (p - r) - 1):
            put("F", f0, 0)
            f0 += 1
        for _ in range(r):
            put("F", f1, 1)
            put("F", f0, 0)
            f0, f1 = f0 + 1, f1 + 1
        for _ in range(p - r):
            put("F", f1, 1)
            put("B", b1, 1)
            put("W", b1, 1)
            f1, b1 = f1 + 1, b1 + 1
        while f1 < f0 or f0 < n:
            if f0 < n:
                put("F", f0, 0)
                f0 += 1
            put("B", b0, 0)
            put("W", b0, 0)
            put("F", f1, 1)
            put("B", b1, 1)
            put("W", b1, 1)
            f1, b0, b1 = f1 + 1, b0 + 1, b1 + 1
        w0, w1 = b0, b1
        for _ in range(r):
            put("B", b0, 0)
            put("B", b1, 1)
            b0, b1 = b0 + 1, b1 + 1
        for _ in range(p - r):
            put("B", b0, 0)
            put("W", w0, 0)
            b0, w0 = b0 + 1, w0 + 1
        for i in range(w1, b1):
            put("W", i, 1)
        for i in range(w0, b0):
            put("W", i, 0)
        out.append(lane)
    return out


def dualpipev(p: int, m: int) -> list[list[Op]]:
    """torch's ScheduleDualPipeV order; an overlapped F/B pair is its F then its B."""
    return [_dualpipev_rank(p, m, r) for r in range(p)]


def _dualpipev_rank(p: int, m: int, r: int) -> list[Op]:
    lane: list[Op] = []
    count = {("F", 0): 0, ("F", 1): 0, ("B", 0): 0, ("B", 1): 0}
    pending: list[tuple[int, int]] = []  # (chunk, microbatch) of input backwards without W

    def add(kind: str, chunk: int, split: bool = False) -> None:
        mb = count[kind, chunk]
        count[kind, chunk] = mb + 1
        lane.append(Op(kind, mb, chunk))
        if split:
            pending.append((chunk, mb))

    def weight() -> None:
        if pending:
            chunk, mb = pending.pop(0)
            lane.append(Op("W", mb, chunk))

    for _ in range(2 * (p - r - 1)):
        add("F", 0)
    for _ in range(r + 1):
        add("F", 0)
        add("F", 1)
    for _ in range(p - r - 1):
        add("B", 1, split=True)
        weight()
        add("F", 1)
    for _ in range(m - 2 * p + r + 1):
        add("F", 0)  # overlapped F0/B1 (not overlapped at i = 0 on the last rank: same order)
        add("B", 1)
        add("F", 1)  # overlapped F1/B0
        add("B", 0)
    for _ in range(p - r - 1):
        add("B", 1)
        add("F", 1)
        add("B", 0)
    steps6, zb = r + 1, False
    for i in range(steps6):
        if i == steps6 // 2 and r % 2 == 1:
            zb = True
        add("B", 1, split=zb)
        if i == steps6 // 2 and r % 2 == 0:
            zb = True
        add("B", 0, split=zb)
    for _ in range(p - r - 1):
        weight()
        add("B", 0, split=zb)
    for _ in range(r + 1):
        weight()
    return lane
