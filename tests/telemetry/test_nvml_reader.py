"""The NVML reader against a stand-in ``pynvml`` module: the slowdown temperature a GPU reports,
the margin-derived one where it reports none (never silently), and the GPU check's probe."""

from __future__ import annotations

import sys
import types
import warnings

import pytest

from bubblecast.runtime.sampler import MARGIN_METRIC, SLOWDOWN_METRIC, nvml_reader, nvml_thermal


class NVMLError(Exception):
    pass


def fake_pynvml(threshold: bool, margin: bool, temps: list[float]) -> types.ModuleType:
    """A ``pynvml`` whose device runs at ``temps`` (one per reading, then the last) with
    slowdown threshold 89 C when ``threshold``, margin ``87 - temperature`` when ``margin``
    (a binding without the margin call when False)."""
    m = types.ModuleType("pynvml")
    m.NVML_TEMPERATURE_GPU, m.NVML_CLOCK_SM, m.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 0, 1, 2
    it = iter(temps)
    now = {"t": temps[0]}

    def temperature(handle, sensor):
        now["t"] = next(it, now["t"])
        return now["t"]

    def threshold_of(handle, kind):
        if not threshold:
            raise NVMLError("Not Supported")
        return 89

    m.nvmlInit = lambda: None
    m.nvmlDeviceGetHandleByIndex = lambda i: f"gpu{i}"
    m.nvmlDeviceGetTemperature = temperature
    m.nvmlDeviceGetTemperatureThreshold = threshold_of
    m.nvmlDeviceGetClockInfo = lambda h, c: 1980
    m.nvmlDeviceGetPowerUsage = lambda h: 350_000
    if margin:
        m.nvmlDeviceGetMarginTemperature = lambda h: 87 - now["t"]
    return m


@pytest.fixture
def install(monkeypatch):
    def put(module: types.ModuleType) -> None:
        monkeypatch.setitem(sys.modules, "pynvml", module)
    return put


def test_a_reported_threshold_is_recorded_as_is_beside_the_margin(install):
    install(fake_pynvml(threshold=True, margin=True, temps=[40, 40, 50]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing derived: no warning
        read = nvml_reader(0)
    assert read is not None
    row = read()
    assert row[SLOWDOWN_METRIC] == 89.0 and row[MARGIN_METRIC] == 87.0 - row["temperature_c"]
    assert row["power_w"] == 350.0 and row["sm_clock_mhz"] == 1980.0


def test_without_a_threshold_the_margin_gives_it_and_says_so(install):
    install(fake_pynvml(threshold=False, margin=True, temps=[40, 40, 61]))
    with pytest.warns(RuntimeWarning, match="GPU 0 reports no slowdown temperature.*margin"):
        read = nvml_reader(0)
    first, second = read(), read()
    assert first["temperature_c"] == 40.0 and second["temperature_c"] == 61.0
    assert first[MARGIN_METRIC] == 47.0 and second[MARGIN_METRIC] == 26.0
    assert first[SLOWDOWN_METRIC] == second[SLOWDOWN_METRIC] == 87.0


def test_neither_threshold_nor_margin_gives_no_slowdown_row(install):
    install(fake_pynvml(threshold=False, margin=False, temps=[40]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        row = nvml_reader(0)()
    assert SLOWDOWN_METRIC not in row and MARGIN_METRIC not in row
    assert row["temperature_c"] == 40.0


def test_the_gpu_checks_probe_keeps_each_failure_with_its_reason():
    m = fake_pynvml(threshold=False, margin=False, temps=[39])
    limits = nvml_thermal(m, "gpu0")
    assert limits["temperature_c"] == 39.0
    assert limits["slowdown_c"] is None and "Not Supported" in limits["slowdown_c_error"]
    assert limits["margin_c"] is None and "AttributeError" in limits["margin_c_error"]
    ok = nvml_thermal(fake_pynvml(threshold=True, margin=True, temps=[39]), "gpu0")
    assert ok == {"temperature_c": 39.0, "slowdown_c": 89.0, "margin_c": 48.0}
