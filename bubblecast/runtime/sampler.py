"""Device-metric sampling for the recorder: the ``device_metrics`` side table's rows.

:class:`DeviceSampler` reads, every ``every`` steps and on a background thread (never on the
training thread's hot path: :meth:`DeviceSampler.request` only queues the step):

- **NVIDIA GPUs**, through NVML (``nvidia-ml-py``, imported lazily; absent: no GPU rows):
  ``temperature_c`` (GPU core), ``sm_clock_mhz``, ``power_w``, ``throttle`` (the
  clock-event/throttle reasons bitmask, 0 = none), ``temperature_margin_c`` (NVML's thermal
  margin, ``nvmlDeviceGetMarginTemperature``: degrees left to the nearest slowdown threshold,
  where the driver reports it) and ``temperature_slowdown_c`` (the device's slowdown
  temperature, ``NVML_TEMPERATURE_THRESHOLD_SLOWDOWN``: where it starts lowering its clocks;
  a device that reports no such threshold but a margin, as GPUs that state their thermal
  limits relative to T.Limit may, gets ``temperature_c + temperature_margin_c`` instead, and
  the reader says so once in a ``RuntimeWarning``);
- **CPU** (Linux): ``cpu_temp_c`` (the hottest ``/sys/class/thermal/thermal_zone*/temp``),
  ``cpu_mhz`` (mean ``/sys/devices/system/cpu/cpu*/cpufreq/scaling_cur_freq``, else
  ``/proc/cpuinfo``'s ``cpu MHz``) and ``load1`` (1-minute load average); a source the
  machine lacks is skipped;
- **emulated devices** (``--inject ...,lead=L``): the emulated temperature
  (:meth:`bubblecast.runtime.inject.Injection.temperature`) as ``temperature_c``, recorded
  at every step of the rank (it is what a real device would report), and the emulated
  device's slowdown temperature (:data:`bubblecast.runtime.inject.T_THROTTLE`, its
  specification, as NVML reports a GPU's) as ``temperature_slowdown_c`` once, at its first
  step.

Known-future rows (``tokens`` announced by the training loop) are added by the recorder
itself (:meth:`bubblecast.runtime.rank_recorder.Recorder.announce_tokens`).
"""

from __future__ import annotations

import contextlib
import glob
import os
import queue
import threading
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

Row = tuple[int, str, float]  # (step, metric, value)
#: Seconds :meth:`DeviceSampler.close` waits for a reading in progress.
CLOSE_TIMEOUT_S = 5.0
#: The device metric of the slowdown (throttle) temperature: NVML's, or the emulated device's.
SLOWDOWN_METRIC = "temperature_slowdown_c"
#: The device metric of NVML's thermal margin: degrees left to the nearest slowdown threshold.
MARGIN_METRIC = "temperature_margin_c"


def _read_float(path: str) -> float | None:
    try:
        with open(path) as fh:
            return float(fh.read().strip())
    except (OSError, ValueError):
        return None


def cpu_readings() -> dict[str, float]:
    """What this machine's OS offers (see the module doc); missing sources are skipped."""
    out: dict[str, float] = {}
    temps = [t for t in (_read_float(p) for p in glob.glob(
        "/sys/class/thermal/thermal_zone*/temp")) if t is not None and t > 0]
    if temps:
        out["cpu_temp_c"] = max(temps) / 1000.0
    freqs = [f for f in (_read_float(p) for p in glob.glob(
        "/sys/devices/system/cpu/cpu*/cpufreq/scaling_cur_freq")) if f]
    if freqs:
        out["cpu_mhz"] = sum(freqs) / len(freqs) / 1000.0
    else:
        try:
            with open("/proc/cpuinfo") as fh:
                mhz = [float(line.split(":")[1]) for line in fh if line.startswith("cpu MHz")]
            if mhz:
                out["cpu_mhz"] = sum(mhz) / len(mhz)
        except (OSError, ValueError, IndexError):
            pass
    with contextlib.suppress(OSError):
        out["load1"] = os.getloadavg()[0]
    return out


def nvml_thermal(pynvml: Any, handle: Any) -> dict[str, Any]:
    """What NVML says of a device's thermal limits (read by :func:`nvml_reader` once, and by
    the GPU check): ``temperature_c``, ``slowdown_c`` (``NVML_TEMPERATURE_THRESHOLD_SLOWDOWN``)
    and ``margin_c`` (``nvmlDeviceGetMarginTemperature``), each the value or, where the call
    failed or this nvidia-ml-py lacks it, ``None`` with the reason under ``<key>_error``."""
    calls = {"temperature_c": lambda: pynvml.nvmlDeviceGetTemperature(
                 handle, pynvml.NVML_TEMPERATURE_GPU),
             "slowdown_c": lambda: pynvml.nvmlDeviceGetTemperatureThreshold(
                 handle, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
             "margin_c": lambda: pynvml.nvmlDeviceGetMarginTemperature(handle)}
    out: dict[str, Any] = {}
    for key, call in calls.items():
        try:
            out[key] = float(call())
        except Exception as exc:  # noqa: BLE001 - NVMLError, or an older binding's AttributeError
            out[key] = None
            out[f"{key}_error"] = f"{type(exc).__name__}: {exc}"
    return out


def nvml_reader(index: int) -> Callable[[], dict[str, float]] | None:
    """A reader of GPU ``index`` through NVML, or None without nvidia-ml-py or a driver."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    except Exception:  # no driver, no such device: no GPU rows
        return None
    reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        getattr(pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
    limits = nvml_thermal(pynvml, handle)  # the slowdown threshold is a specification: once
    slowdown, with_margin = limits["slowdown_c"], limits["margin_c"] is not None
    if slowdown is None and with_margin:
        warnings.warn(f"GPU {index} reports no slowdown temperature "
                      f"({limits.get('slowdown_c_error')}); recording {SLOWDOWN_METRIC} as "
                      "temperature_c + NVML's margin temperature", RuntimeWarning, stacklevel=2)

    def read() -> dict[str, float]:
        out = {"temperature_c": float(pynvml.nvmlDeviceGetTemperature(
                   handle, pynvml.NVML_TEMPERATURE_GPU)),
               "sm_clock_mhz": float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)),
               "power_w": pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0}
        if reasons is not None:
            out["throttle"] = float(reasons(handle))
        margin = None
        if with_margin:
            with contextlib.suppress(Exception):  # a reading that fails this once: no row
                margin = float(pynvml.nvmlDeviceGetMarginTemperature(handle))
                out[MARGIN_METRIC] = margin
        if slowdown is not None:
            out[SLOWDOWN_METRIC] = slowdown
        elif margin is not None:
            out[SLOWDOWN_METRIC] = out["temperature_c"] + margin
        return out

    return read


class DeviceSampler:
    """Samples ``device`` (``cuda:N`` or ``cpu``) every ``every`` steps on a thread; the rows
    collect in :attr:`rows` (``(step, metric, value)``)."""

    def __init__(self, device: str, every: int = 10) -> None:
        self.every, self.rows = max(1, int(every)), []
        self._read: Callable[[], dict[str, float]] | None = None
        if device.startswith("cuda"):
            self._read = nvml_reader(int(device.partition(":")[2] or 0))
        if self._read is None:
            self._read = cpu_readings
        self._lock = threading.Lock()
        self._queue: queue.Queue[int | None] = queue.Queue()
        self._thread: threading.Thread | None = threading.Thread(
            target=self._run, name="bubblecast-sampler", daemon=True)
        self._thread.start()

    def request(self, step: int) -> None:
        """Queue a sample for ``step`` when it is due (cheap: no reading here)."""
        if step % self.every == 0 and self._thread is not None:
            self._queue.put(step)

    def _run(self) -> None:
        while True:
            step = self._queue.get()
            if step is None:
                return
            try:
                values = self._read() if self._read is not None else {}
            except Exception:  # a failing sensor must not stop training
                values = {}
            with self._lock:
                self.rows.extend((step, k, float(v)) for k, v in values.items())

    def take(self) -> list[Row]:
        """The rows sampled so far (removed from the sampler)."""
        with self._lock:
            rows, self.rows = self.rows, []
        return rows

    def close(self) -> None:
        """Stop the thread after the readings queued so far. One that has not finished
        within :data:`CLOSE_TIMEOUT_S` (a reading stuck in the driver, or a backlog) is left
        behind (a daemon thread) with a warning: closing never hangs the job."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(CLOSE_TIMEOUT_S)
            if self._thread.is_alive():
                warnings.warn(f"device sampler: its queued readings did not finish within "
                              f"{CLOSE_TIMEOUT_S:g} s (a reading stuck in the driver, or a "
                              f"backlog); its thread is left behind and what it reads from "
                              f"now on is not recorded", RuntimeWarning, stacklevel=2)
            self._thread = None


class MetricLog:
    """One rank's device-metric rows: sampled (:class:`DeviceSampler`, when ``every`` > 0),
    emulated temperatures (injections with a ``lead``) and announced tokens; nothing at all
    when not ``enabled`` (a recorder that does not record)."""

    def __init__(self, run_id: str, rank: int, device: str, every: int = 0,
                 injections: list[Any] | None = None, enabled: bool = True) -> None:
        self.run_id, self.rank, self.enabled = run_id, rank, enabled
        self.injections = [i for i in (injections or []) if getattr(i, "lead", 0)] \
            if enabled else []
        self.sampler = DeviceSampler(device, every) if every > 0 and enabled else None
        self.rows: list[Row] = []
        self._spec_sent = False

    def begin_step(self, step: int) -> None:
        """At a step's start: the emulated temperature now; a sample when one is due."""
        if self.injections:
            from bubblecast.runtime.inject import T_THROTTLE, temperatures

            temp = temperatures(self.injections, self.rank, step)
            if temp is not None:
                if not self._spec_sent:  # the emulated device's specification, once
                    self.rows.append((step, SLOWDOWN_METRIC, T_THROTTLE))
                    self._spec_sent = True
                self.rows.append((step, "temperature_c", temp))
        if self.sampler is not None:
            self.sampler.request(step)

    def latest(self, metric: str) -> float | None:
        """The latest value of ``metric`` recorded or sampled so far (None: none)."""
        if self.sampler is not None:
            self.rows.extend(self.sampler.take())
        for _step, name, value in reversed(self.rows):
            if name == metric:
                return value
        return None

    def asof(self, metric: str, steps: list[int]) -> np.ndarray:
        """Per step of ``steps``: the last value of ``metric`` recorded at or before it (NaN:
        none yet)."""
        if self.sampler is not None:
            self.rows.extend(self.sampler.take())
        pairs = sorted((s, v) for s, name, v in self.rows if name == metric)
        out = np.full(len(steps), np.nan)
        if not pairs:
            return out
        at = np.array([s for s, _ in pairs])
        idx = np.searchsorted(at, np.asarray(steps, dtype=np.int64), side="right") - 1
        ok = idx >= 0
        out[ok] = np.array([v for _, v in pairs])[idx[ok]]
        return out

    def announce_tokens(self, step: int, tokens_per_microbatch: float) -> None:
        if self.enabled:
            self.rows.append((int(step), "tokens", float(tokens_per_microbatch)))

    def frame(self) -> Any:
        """Every row so far as a device-metrics frame (sorted by step)."""
        if self.sampler is not None:
            self.rows.extend(self.sampler.take())
        self.rows.sort(key=lambda r: (r[0], r[1]))
        return metric_frame(self.run_id, self.rank, self.rows)

    def close(self, events_dir: Any = None) -> None:
        """Stop sampling; write ``rank{r:04d}.metrics`` in ``events_dir`` when there are rows."""
        if self.sampler is not None:
            self.sampler.close()
        frame = self.frame()
        if events_dir is not None and len(frame):
            from pathlib import Path

            from bubblecast.telemetry.metrics import write_metrics

            write_metrics(frame, Path(events_dir) / f"rank{self.rank:04d}.metrics")


def metric_frame(run_id: str, rank: int, rows: list[Row]) -> Any:
    """``(step, metric, value)`` rows as a device-metrics frame."""
    import pandas as pd

    from bubblecast.telemetry.metrics import empty

    if not rows:
        return empty()
    step, metric, value = zip(*rows, strict=True)
    return pd.DataFrame({"run_id": run_id, "step": list(step), "rank": rank,
                         "metric": list(metric), "value": list(value)})
