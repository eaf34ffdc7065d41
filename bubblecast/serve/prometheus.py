"""Prometheus metrics of the service, rendered in the text exposition format (version 0.0.4).

Written by hand (``prometheus_client`` is not a dependency): request counts by route and
status, a latency histogram by route, reload counts, and the served model as an info-style
gauge. Route labels come from a fixed set, so no request can grow the label space. While the app
runs, cyclic garbage collections are counted and timed by generation (``gc.callbacks``): a
full collection is a pause every request queued behind it sees, so it belongs on a dashboard.
"""

from __future__ import annotations

import bisect
import gc
import threading
import time
from collections import defaultdict

BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(x: float) -> str:
    return repr(float(x)) if x != int(x) else f"{int(x)}"


class Metrics:
    """Thread-safe counters and histograms; :meth:`render` gives the Prometheus text."""

    def __init__(self, routes: tuple[str, ...]) -> None:
        self.routes = frozenset(routes)
        self._lock = threading.Lock()
        self._requests: dict[tuple[str, str, int], int] = defaultdict(int)
        self._buckets: dict[str, list[int]] = defaultdict(lambda: [0] * (len(BUCKETS) + 1))
        self._sum: dict[str, float] = defaultdict(float)
        self._reloads: dict[str, int] = defaultdict(int)
        self._model: tuple[str, str, str] = ("", "", "")
        self._model_loaded_at = 0.0
        self._started = time.time()
        self._gc_count = [0, 0, 0]
        self._gc_seconds = [0.0, 0.0, 0.0]
        self._gc_max = [0.0, 0.0, 0.0]
        self._gc_t0 = 0.0

    def _on_gc(self, phase: str, info: dict) -> None:
        """``gc.callbacks`` hook. No lock: a collection can start while this thread holds
        ``_lock`` (an allocation in :meth:`render`), and the GIL keeps these updates whole."""
        if phase == "start":
            self._gc_t0 = time.perf_counter()
            return
        g = min(int(info.get("generation", 2)), 2)
        dt = time.perf_counter() - self._gc_t0
        self._gc_count[g] += 1
        self._gc_seconds[g] += dt
        self._gc_max[g] = max(self._gc_max[g], dt)

    def track_gc(self) -> None:
        """Start counting and timing garbage collections (the app's start-up)."""
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)

    def untrack_gc(self) -> None:
        """Stop (the app's shut-down), so apps made and dropped in one process do not pile up."""
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def route(self, path: str) -> str:
        """The label for ``path``: itself when it is a known route, else ``other``."""
        return path if path in self.routes else "other"

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        i = bisect.bisect_left(BUCKETS, seconds)
        with self._lock:
            self._requests[(method, route, status)] += 1
            self._buckets[route][i] += 1
            self._sum[route] += seconds

    def reload(self, outcome: str) -> None:
        with self._lock:
            self._reloads[outcome] += 1

    def set_model(self, name: str, version: str, alias: str | None, loaded_at: float) -> None:
        with self._lock:
            self._model = (name, version, alias or "")
            self._model_loaded_at = loaded_at

    def count(self, route: str, status: int | None = None) -> int:
        """Requests seen on ``route`` (with ``status`` when given); for tests and logs."""
        with self._lock:
            return sum(n for (_, r, s), n in self._requests.items()
                       if r == route and (status is None or s == status))

    def render(self) -> str:
        with self._lock:
            lines = [
                "# HELP bubblecast_requests_total HTTP requests by method, route and status.",
                "# TYPE bubblecast_requests_total counter",
            ]
            for (method, route, status), n in sorted(self._requests.items()):
                lines.append(f'bubblecast_requests_total{{method="{method}",route="{route}",'
                             f'status="{status}"}} {n}')
            lines += [
                "# HELP bubblecast_request_duration_seconds Request latency by route.",
                "# TYPE bubblecast_request_duration_seconds histogram",
            ]
            for route in sorted(self._buckets):
                counts, acc = self._buckets[route], 0
                for bound, n in zip(BUCKETS + (float("inf"),), counts, strict=True):
                    acc += n
                    le = "+Inf" if bound == float("inf") else _num(bound)
                    lines.append(f'bubblecast_request_duration_seconds_bucket{{route="{route}",'
                                 f'le="{le}"}} {acc}')
                lines.append(f'bubblecast_request_duration_seconds_sum{{route="{route}"}} '
                             f"{self._sum[route]!r}")
                lines.append(f'bubblecast_request_duration_seconds_count{{route="{route}"}} {acc}')
            lines += ["# HELP bubblecast_model_reloads_total Model reloads by outcome.",
                      "# TYPE bubblecast_model_reloads_total counter"]
            for outcome, n in sorted(self._reloads.items()):
                lines.append(f'bubblecast_model_reloads_total{{outcome="{outcome}"}} {n}')
            name, version, alias = (_escape(x) for x in self._model)
            lines += [
                "# HELP bubblecast_model_info The model being served (value 1).",
                "# TYPE bubblecast_model_info gauge",
                f'bubblecast_model_info{{name="{name}",version="{version}",alias="{alias}"}} 1',
                "# HELP bubblecast_model_loaded_timestamp_seconds When the model was loaded.",
                "# TYPE bubblecast_model_loaded_timestamp_seconds gauge",
                f"bubblecast_model_loaded_timestamp_seconds {self._model_loaded_at!r}",
                "# HELP bubblecast_start_time_seconds When the service started.",
                "# TYPE bubblecast_start_time_seconds gauge",
                f"bubblecast_start_time_seconds {self._started!r}",
            ]
        lines += _gc_lines(self._gc_count, self._gc_seconds, self._gc_max)
        return "\n".join(lines) + "\n"


def _gc_lines(count: list[int], seconds: list[float], longest: list[float]) -> list[str]:
    """Garbage-collection counters and the longest pause, by generation."""
    lines = ["# HELP bubblecast_gc_collections_total Cyclic garbage collections by generation.",
             "# TYPE bubblecast_gc_collections_total counter"]
    lines += [f'bubblecast_gc_collections_total{{generation="{g}"}} {n}'
              for g, n in enumerate(count)]
    lines += ["# HELP bubblecast_gc_pause_seconds_total Time spent in garbage collections.",
              "# TYPE bubblecast_gc_pause_seconds_total counter"]
    lines += [f'bubblecast_gc_pause_seconds_total{{generation="{g}"}} {x!r}'
              for g, x in enumerate(seconds)]
    lines += ["# HELP bubblecast_gc_pause_max_seconds Longest garbage collection so far.",
              "# TYPE bubblecast_gc_pause_max_seconds gauge"]
    lines += [f'bubblecast_gc_pause_max_seconds{{generation="{g}"}} {x!r}'
              for g, x in enumerate(longest)]
    return lines
