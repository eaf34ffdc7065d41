"""Device (GPU) times of ``PP:`` compute ranges in Kineto traces, on one clock per run.

Two sources, tried in order for each compute range (F, B/I, W):

1. **Kernels it launched.** Every ``cuda_runtime``/``cuda_driver`` launch whose host timestamp
   falls inside the range is followed to its device activity (``kernel``, ``gpu_memcpy``,
   ``gpu_memset``) through Kineto's ``correlation`` id, or through the ``ac2g`` flow events
   (``s`` at the launch, ``f`` at the kernel) when a kernel carries no correlation. The op's
   device interval runs from the first such kernel's start to the last one's end, whatever the
   stream. Backward kernels launched from autograd's device thread count too: containment is in
   time, on any thread of the process.
2. **``gpu_user_annotation`` copies.** Kineto writes one copy of a range per (device, stream)
   that ran its kernels. Copies are joined to their host range by ``External id``; without
   one, the k-th copy on each stream pairs with the k-th host range of that name only when
   every stream holds exactly one copy per host range. All copies of one range merge (earliest
   start to latest end).

A range with neither gets no device time. The caller then uses host time for every op of the
run (never a mix of clocks) and says so on stderr.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

_LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
_DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


@dataclass
class GpuEvents:
    """What a trace holds on the device side, indexed for range lookups."""

    launch_ts: np.ndarray = field(default_factory=lambda: np.zeros(0))  # sorted host times
    launch_corr: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    kernels: dict[int, tuple[float, float]] = field(default_factory=dict)  # corr -> (start, end)
    annotations: list[tuple[str, Any, Any, float, float]] = field(default_factory=list)
    n_kernels: int = 0

    @property
    def any(self) -> bool:
        """True when the trace holds device activity or device annotations."""
        return bool(self.n_kernels or self.annotations)


def _merge(spans: dict[int, tuple[float, float]], key: int, ts: float, end: float) -> None:
    old = spans.get(key)
    spans[key] = (ts, end) if old is None else (min(old[0], ts), max(old[1], end))


def collect(events: list[Any]) -> GpuEvents:
    """Index launches, device activity (by correlation), flows and device annotations."""
    launches: list[tuple[float, int]] = []
    kernels: dict[int, tuple[float, float]] = {}
    loose: list[tuple[Any, Any, float, float]] = []  # kernels without a correlation id
    flow_start: dict[Any, float] = {}  # flow id -> host time of its 's' (the launch)
    flow_end: dict[tuple[Any, Any, float], Any] = {}  # (pid, tid, ts) of an 'f' -> flow id
    out = GpuEvents()
    for ev in events:
        if not isinstance(ev, dict):
            continue
        ph, cat = ev.get("ph"), str(ev.get("cat", ""))
        if cat == "ac2g" and ph in ("s", "f"):
            if ph == "s":
                flow_start[ev.get("id")] = float(ev.get("ts", 0.0))
            else:
                flow_end[(ev.get("pid"), ev.get("tid"), float(ev.get("ts", 0.0)))] = ev.get("id")
            continue
        if ph != "X":
            continue
        args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
        try:
            ts, dur = float(ev["ts"]), float(ev.get("dur", 0.0))
        except (KeyError, TypeError, ValueError):
            continue
        corr = args.get("correlation")
        if cat in _LAUNCH_CATS and isinstance(corr, int):
            launches.append((ts, corr))
        elif cat in _DEVICE_CATS:
            out.n_kernels += 1
            if isinstance(corr, int):
                _merge(kernels, corr, ts, ts + dur)
            else:
                loose.append((ev.get("pid"), ev.get("tid"), ts, ts + dur))
        elif cat == "gpu_user_annotation" and str(ev.get("name", "")).startswith("PP:"):
            out.annotations.append((str(ev["name"]), args.get("External id"),
                                    (ev.get("pid"), ev.get("tid")), ts, ts + dur))
    _link_flows(loose, flow_start, flow_end, launches, kernels)
    launches.sort()
    out.launch_ts = np.array([t for t, _ in launches], dtype=np.float64)
    out.launch_corr = np.array([c for _, c in launches], dtype=np.int64)
    out.kernels = kernels
    return out


def _link_flows(loose: list[tuple[Any, Any, float, float]], flow_start: dict[Any, float],
                flow_end: dict[tuple[Any, Any, float], Any], launches: list[tuple[float, int]],
                kernels: dict[int, tuple[float, float]]) -> None:
    """Kernels without a correlation id: follow their ``ac2g`` flow back to the launch.

    Kineto puts the flow's ``s`` at the launch (host time) and its ``f`` at the kernel; such a
    kernel and its launch share a negative pseudo-correlation.
    """
    for number, (pid, tid, ts, stop) in enumerate(loose):
        fid = flow_end.get((pid, tid, ts))
        if fid is None or fid not in flow_start:
            continue
        key = -1 - number
        _merge(kernels, key, ts, stop)
        launches.append((flow_start[fid], key))


def device_spans(ranges: pd.DataFrame, gpu: GpuEvents) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) on the device of each host range (columns ``start_us``, ``end_us``,
    ``name``, ``ext_id``); NaN where no kernel or annotation covers it."""
    n = len(ranges)
    start, end = np.full(n, np.nan), np.full(n, np.nan)
    if n == 0 or not gpu.any:
        return start, end
    lo = np.searchsorted(gpu.launch_ts, ranges["start_us"].to_numpy(), side="left")
    hi = np.searchsorted(gpu.launch_ts, ranges["end_us"].to_numpy(), side="right")
    for i in range(n):
        spans = [gpu.kernels[c] for c in gpu.launch_corr[lo[i]:hi[i]] if int(c) in gpu.kernels]
        if spans:
            start[i], end[i] = min(s for s, _ in spans), max(e for _, e in spans)
    todo = np.isnan(start)
    if todo.any() and gpu.annotations:
        a_start, a_end = _annotation_spans(ranges, gpu.annotations)
        start = np.where(todo, a_start, start)
        end = np.where(todo, a_end, end)
    return start, end


def _annotation_spans(ranges: pd.DataFrame, annotations: list[tuple[str, Any, Any, float,
                                                                      float]]
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Merge ``gpu_user_annotation`` copies per host range (External id, else per stream)."""
    n = len(ranges)
    start, end = np.full(n, np.nan), np.full(n, np.nan)
    by_ext: dict[Any, tuple[float, float]] = {}
    for _name, ext, _stream, ts, stop in annotations:
        if ext is not None:
            old = by_ext.get(ext)
            by_ext[ext] = (ts, stop) if old is None else (min(old[0], ts), max(old[1], stop))
    ext_ids = ranges["ext_id"].to_numpy(dtype=object)
    for i, ext in enumerate(ext_ids):
        if ext is not None and ext in by_ext:
            start[i], end[i] = by_ext[ext]
    loose = [a for a in annotations if a[1] is None]
    if loose:
        _pair_per_stream(ranges, loose, start, end)
    return start, end


def _pair_per_stream(ranges: pd.DataFrame, loose: list[tuple[str, Any, Any, float, float]],
                     start: np.ndarray, end: np.ndarray) -> None:
    """k-th copy on each stream <-> k-th host range of that name, when every count matches."""
    copies: dict[str, dict[Any, list[tuple[float, float]]]] = {}
    for name, _ext, stream, ts, stop in loose:
        copies.setdefault(name, {}).setdefault(stream, []).append((ts, stop))
    names = ranges["name"].to_numpy(dtype=object)
    order = np.argsort(ranges["start_us"].to_numpy(), kind="stable")
    for name, streams in copies.items():
        idx = [i for i in order if names[i] == name and np.isnan(start[i])]
        if not idx or any(len(c) != len(idx) for c in streams.values()):
            continue  # a stream with missing or extra copies: cannot pair, no device time
        for stream_copies in streams.values():
            for i, (ts, stop) in zip(idx, sorted(stream_copies), strict=True):
                start[i] = ts if np.isnan(start[i]) else min(start[i], ts)
                end[i] = stop if np.isnan(end[i]) else max(end[i], stop)


__all__ = ["GpuEvents", "collect", "device_spans"]
