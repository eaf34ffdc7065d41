"""Clock offsets between ranks: NTP-style round trips against rank 0 over the process group.

On several hosts the ranks' wall clocks differ (by milliseconds with NTP, by seconds
without), so start times stamped on one clock per rank cannot be compared directly.
:func:`estimate_offsets` measures each rank's offset against the pipeline group's rank 0:
the rank sends its time ``t0``, rank 0 stamps ``t1`` when it receives it and replies with
it, the rank stamps ``t2`` on the reply. Then

    offset = ((t1 - t0) + (t1 - t2)) / 2        (rank 0's clock minus this rank's)

is exact when both legs take the same time, and wrong by at most half the round trip
(``t2 - t0``) otherwise; of several samples the one with the smallest round trip is kept,
its RTT/2 being the uncertainty. ``local time + offset`` is rank 0's time.

:func:`wall_clock` is the wall clock the recorder reads: ``time.time()`` plus
``BUBBLECAST_CLOCK_SKEW_S`` seconds when that variable is set (a fake skew for tests of a
multi-host job on one machine). No torch import at module level.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bubblecast.errors import BubblecastError

#: Environment variable adding a fake skew (seconds) to :func:`wall_clock` (tests).
SKEW_ENV = "BUBBLECAST_CLOCK_SKEW_S"
#: Round trips per rank of one estimate (the minimum-RTT one is kept).
SAMPLES = 8

Clock = Callable[[], float]


def wall_clock() -> float:
    """Epoch seconds on this host's clock (plus the fake skew of ``BUBBLECAST_CLOCK_SKEW_S``)."""
    skew = os.environ.get(SKEW_ENV)
    if not skew:
        return time.time()
    try:
        return time.time() + float(skew)
    except ValueError:
        raise BubblecastError(f"{SKEW_ENV}: expected seconds, got {skew!r}") from None


@dataclass(frozen=True)
class ClockEstimate:
    """One rank's offset against rank 0: ``offset_s`` (add it to local times to get rank 0's
    time), ``uncertainty_s`` (half the round trip it came from: the most the offset can be
    wrong by), ``rtt_s``, ``samples`` taken and the ``step`` it was measured at."""

    rank: int
    offset_s: float
    uncertainty_s: float
    rtt_s: float
    samples: int
    step: int = 0

    def __post_init__(self) -> None:
        if self.uncertainty_s < 0 or self.rtt_s < 0:
            raise BubblecastError(f"clock estimate: negative round trip ({self.rtt_s})")

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "step": self.step, "offset_s": self.offset_s,
                "uncertainty_s": self.uncertainty_s, "rtt_s": self.rtt_s,
                "samples": self.samples}


def best_sample(samples: list[tuple[float, float, float]]) -> tuple[float, float]:
    """``(offset, rtt)`` of the minimum-RTT sample among ``(t0, t1, t2)`` round trips."""
    if not samples:
        raise BubblecastError("clock estimate: no round trips")
    t0, t1, t2 = min(samples, key=lambda s: s[2] - s[0])
    return ((t1 - t0) + (t1 - t2)) / 2.0, max(t2 - t0, 0.0)


def _device(group: Any) -> Any:
    import torch
    import torch.distributed as dist

    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def estimate_offsets(group: Any = None, *, samples: int = SAMPLES, clock: Clock = wall_clock,
                     step: int = 0) -> ClockEstimate:
    """Collective over ``group`` (every rank calls it): this rank's :class:`ClockEstimate`.

    Rank 0 answers each other rank's ``samples`` round trips in turn (point-to-point sends
    of one float64; on NCCL a CUDA tensor, so the device copy is part of the round trip and
    the uncertainty says so). Rank 0 itself gets offset 0, uncertainty 0. A first round trip
    per rank warms the connection up and is not counted.
    """
    import torch
    import torch.distributed as dist

    if samples < 1:
        raise BubblecastError(f"clock estimate: samples must be >= 1, got {samples}")
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if world == 1 or rank < 0:
        return ClockEstimate(max(rank, 0), 0.0, 0.0, 0.0, 0, step)
    device = _device(group)
    buf = torch.zeros(1, dtype=torch.float64, device=device)
    root = dist.get_global_rank(group, 0) if group is not None else 0
    if rank == 0:
        for peer in range(1, world):
            src = dist.get_global_rank(group, peer) if group is not None else peer
            for _ in range(samples + 1):
                dist.recv(buf, src=src, group=group)
                buf.fill_(clock())
                dist.send(buf, dst=src, group=group)
        return ClockEstimate(0, 0.0, 0.0, 0.0, 0, step)
    trips = []
    for k in range(samples + 1):
        t0 = clock()
        buf.fill_(t0)
        dist.send(buf, dst=root, group=group)
        dist.recv(buf, src=root, group=group)
        t1 = float(buf.item())  # .item() waits for the reply (a device sync on CUDA)
        t2 = clock()
        if k:
            trips.append((t0, t1, t2))
    offset, rtt = best_sample(trips)
    return ClockEstimate(rank, offset, rtt / 2.0, rtt, samples, step)


def corrected(local_s: float, estimate: ClockEstimate | None) -> float:
    """``local_s`` (this rank's epoch seconds) on rank 0's clock."""
    return local_s + (estimate.offset_s if estimate is not None else 0.0)


def summarize(estimates: list[ClockEstimate], every: int) -> dict[str, Any]:
    """Run metadata ``clock``: each rank's latest offset and uncertainty, and every estimate."""
    latest: dict[int, ClockEstimate] = {}
    for e in sorted(estimates, key=lambda e: (e.step, e.rank)):
        latest[e.rank] = e
    return {"reference_rank": 0, "method": "ntp-min-rtt", "every": every,
            "offset_s": {str(r): e.offset_s for r, e in sorted(latest.items())},
            "uncertainty_s": {str(r): e.uncertainty_s for r, e in sorted(latest.items())},
            "estimates": [e.to_json() for e in sorted(estimates, key=lambda e: (e.step,
                                                                                e.rank))]}


def offsets_by_step(segments: tuple[tuple[int, float], ...], rows: list[tuple]) -> Any:
    """The offset of each recorder row (``row[0]`` its step) from ``(first step, offset)``
    segments, oldest first: a float when there is one segment, else an array per row."""
    if len(segments) == 1 or not rows:
        return segments[0][1]
    import numpy as np

    firsts = np.array([s[0] for s in segments])
    shift = np.array([s[1] for s in segments])
    steps = np.fromiter((r[0] for r in rows), np.int64, len(rows))
    return shift[np.maximum(np.searchsorted(firsts, steps, "right") - 1, 0)]
