"""Device-true op timing on CUDA: ``torch.cuda.Event`` pairs, resolved in batches.

On a GPU, ``perf_counter`` around a stage method measures how long the host took to *launch*
its kernels, not how long they ran. :class:`EventTimer` instead records an event on the
stage's current stream before and after each op; nothing waits on the device per op. The
recorder asks for the durations in batches (at a flush, or at a step end when a step hook or
per-layer cost sampling needs them): one ``synchronize`` per pending event, which returns at
once for events long done.

Device timestamps are mapped onto the host ``perf_counter`` clock through an *anchor*: an
event recorded and synchronised right before ``perf_counter`` is read, so its device time
equals that host time to within the wake-up latency (microseconds). Every batch resolution
re-anchors, which keeps the offsets that ``elapsed_time`` (float32 milliseconds) returns
short and exact to a microsecond.

The CUDA calls go through a small backend (:class:`CudaBackend`); tests pass a fake one with
a simulated device clock, so this logic is checked on machines without a GPU.
"""

from __future__ import annotations

import time
from typing import Any, Protocol


class Backend(Protocol):
    """What :class:`EventTimer` needs from CUDA (a fake one in tests)."""

    def new_event(self) -> Any:
        """An event with ``record(stream)``, ``synchronize()``, ``query()`` and
        ``elapsed_time(later) -> ms``."""

    def current_stream(self) -> Any:
        """The stream work is being queued on now."""

    def sleep(self, cycles: int) -> None:
        """Queue a kernel spinning ``cycles`` device clock cycles on the current stream."""


class CudaBackend:
    """:class:`Backend` on ``torch.cuda`` for one device."""

    def __init__(self, device: Any) -> None:
        import torch

        self._cuda = torch.cuda
        self.device = torch.device(device)

    def new_event(self) -> Any:
        return self._cuda.Event(enable_timing=True)

    def current_stream(self) -> Any:
        return self._cuda.current_stream(self.device)

    def sleep(self, cycles: int) -> None:
        with self._cuda.device(self.device):
            self._cuda._sleep(int(cycles))


class EventTimer:
    """Marks (events) on the current stream, turned into ``(start, duration)`` in batches.

    ``mark()`` is the whole per-op cost: take an event from the pool and record it.
    ``resolve(pairs)`` blocks until the pairs' events are done and returns each pair's start
    on the host ``perf_counter`` clock and its duration, both in seconds; their events go back
    to the pool. ``syncs`` counts the host waits (tests assert they are per batch).
    """

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._pool: list[Any] = []
        self.syncs = 0
        self._anchor: Any = None
        self._anchor_host = 0.0
        self.reanchor()

    @classmethod
    def for_device(cls, device: Any) -> EventTimer:
        """A timer on CUDA ``device``."""
        return cls(CudaBackend(device))

    def mark(self) -> Any:
        """Record an event on the current stream (no wait)."""
        event = self._pool.pop() if self._pool else self.backend.new_event()
        event.record(self.backend.current_stream())
        return event

    def _wait(self, event: Any) -> None:
        self.syncs += 1
        event.synchronize()

    def reanchor(self) -> None:
        """Pin device time to host time: an event, waited for, then ``perf_counter``."""
        event = self.backend.new_event()
        event.record(self.backend.current_stream())
        self._wait(event)
        self._anchor, self._anchor_host = event, time.perf_counter()

    def elapsed(self, start: Any, end: Any) -> float:
        """Seconds from mark ``start`` to mark ``end`` (waits for ``end``)."""
        self._wait(end)
        return start.elapsed_time(end) / 1e3

    def done(self, event: Any) -> bool:
        """Whether the device has passed ``event`` (no wait)."""
        return bool(event.query())

    def resolve(self, pairs: list[tuple[Any, Any]]) -> list[tuple[float, float]]:
        """``(start on the perf_counter clock, duration)`` of each ``(start, end)`` mark pair,
        in seconds; waits once per pair (instant for finished ones), then re-anchors."""
        if not pairs:
            return []
        anchor, host = self._anchor, self._anchor_host
        out = []
        for start, end in pairs:
            self._wait(end)
            out.append((host + anchor.elapsed_time(start) / 1e3, start.elapsed_time(end) / 1e3))
        self.recycle(e for pair in pairs for e in pair)
        self.reanchor()
        return out

    def recycle(self, events: Any) -> None:
        """Give finished events back for reuse."""
        self._pool.extend(events)


class DeviceDelay:
    """Emulated slowdowns on the device: spin kernels queued on the current stream.

    ``stretch`` makes an op that ran from mark ``start`` take ``factor`` times as long by
    queueing ``(factor - 1) x`` its expected device time of spinning right after it (before
    its end mark, so the delay is part of the recorded duration). The expected time of each
    ``key`` (chunk, op) is its latest measured device time without the delay: the first one
    is waited for once, later ones are read when done (:meth:`refresh`, no wait). The spin
    kernel's cycles per second are calibrated once.
    """

    def __init__(self, timer: EventTimer, *, calibrate_cycles: int = 1_000_000) -> None:
        self.timer = timer
        self._estimate: dict[Any, float] = {}
        self._probes: list[tuple[Any, Any, Any]] = []
        self.cycles_per_s = self._calibrate(calibrate_cycles)

    def _calibrate(self, cycles: int) -> float:
        """Device clock cycles per second of the spin kernel (median of 3)."""
        runs = []
        for _ in range(3):
            start = self.timer.mark()
            self.timer.backend.sleep(cycles)
            runs.append(self.timer.elapsed(start, self.timer.mark()))
        seconds = sorted(runs)[1]
        if seconds <= 0:
            raise RuntimeError("device delay calibration measured no time")
        return cycles / seconds

    def sleep_s(self, seconds: float) -> None:
        """Queue ``seconds`` of spinning on the current stream."""
        if seconds > 0:
            self.timer.backend.sleep(max(1, round(seconds * self.cycles_per_s)))

    def stretch(self, start: Any, key: Any, factor: float) -> None:
        """Delay the stream so the op begun at ``start`` lasts ``factor`` times as long."""
        mid = self.timer.mark()
        expected = self._estimate.get(key)
        if expected is None:  # first time: wait once for this op's own time
            expected = self._estimate[key] = self.timer.elapsed(start, mid)
            self.timer.recycle((mid,))
        else:
            self._probes.append((key, start, mid))
        self.sleep_s((factor - 1.0) * expected)

    def refresh(self, *, block: bool = False) -> None:
        """Update the expected times from finished probes (all of them when ``block``)."""
        keep = []
        for key, start, mid in self._probes:
            if block or self.timer.done(mid):
                seconds = self.timer.elapsed(start, mid) if block else \
                    start.elapsed_time(mid) / 1e3
                self._estimate[key] = seconds
                self.timer.recycle((mid,))
            else:
                keep.append((key, start, mid))
        self._probes = keep
