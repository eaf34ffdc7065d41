"""The live loop's thermal lead (runtime/control/lead.py): from the temperatures of the emulated
device (--inject ...,lead=L) it predicts when the rank throttles and how much, before it does."""

from __future__ import annotations

import numpy as np

from bubblecast.runtime.control.lead import ThermalLead
from bubblecast.runtime.control.observe import (
    RawHistoryForecaster,
    pack,
    unpack,
    unpack_temperatures,
)
from bubblecast.runtime.inject import parse_inject


def _feed(lead: ThermalLead, spec: str, until: int, every: int = 10) -> None:
    """The healthy rank 0 at 75 C, rank 1 the emulated device; both report an 85 C slowdown
    temperature (as NVML would)."""
    inj = parse_inject(spec)[0]
    for b in range(every - 1, until, every):
        steps = list(range(b - every + 1, b + 1))
        lead.note_speeds(np.array([1.0, 1.0]))
        lead.add(steps, np.array([[75.0, inj.temperature(s)] for s in steps]),
                 np.array([85.0, 85.0]))


def test_predicts_the_crossing_and_the_slowdown_before_it_happens():
    lead = ThermalLead()
    _feed(lead, "rank=1,factor=2,start=100,ramp=60,lead=30", until=90)  # 10 steps ahead
    assert set(lead.active) == {1}
    assert abs(lead.active[1] - 2.0) < 0.2
    assert abs(lead._cross[1] - 100) <= 5
    q = np.ones((3, 2, 3))
    out = lead.adjust(q, np.array([1, 5, 30]), now=89)
    assert np.all(out[:2] == 1.0)  # before the crossing: the forecast as it was
    assert np.all(out[2, 1] >= 1.8) and np.all(out[2, 0] == 1.0)


def test_healthy_or_missing_temperatures_change_nothing():
    lead = ThermalLead()
    for step in range(9, 200, 10):
        lead.note_speeds(np.array([1.0, 1.0]))
        lead.add([step], np.array([[75.0, 75.0 + (step % 20 == 9)]]),  # sensor flicker
                 np.array([85.0, 85.0]))
        lead.add([step], np.array([[np.nan, np.nan]]))
    assert lead.active == {}
    q = np.random.default_rng(0).uniform(1, 2, (4, 2, 3))
    np.testing.assert_array_equal(lead.adjust(q, np.arange(1, 5), now=200), q)


def test_temperature_travels_with_the_gathered_compute():
    rows = np.stack([pack([1.0, 2.0], 2, [], 3),
                     pack([3.0, 4.0], 2, [], 3, [80.5, 81.5], 85.0)])
    compute, _, _ = unpack(rows, 2, 3)
    assert compute.tolist() == [[1.0, 3.0], [2.0, 4.0]]
    temps, slowdown = unpack_temperatures(rows, 2, 3)
    assert np.isnan(temps[:, 0]).all() and temps[:, 1].tolist() == [80.5, 81.5]
    assert np.isnan(slowdown[0]) and slowdown[1] == 85.0


class _Flat:
    def forecast_history(self, history: np.ndarray, horizons: np.ndarray) -> np.ndarray:
        return np.ones((len(horizons), history.shape[1], 3))


def test_built_in_forecaster_takes_the_lead_in():
    fc = RawHistoryForecaster(_Flat())
    fc.history = np.ones((40, 2))
    lead = ThermalLead()
    _feed(lead, "rank=1,factor=2,start=100,ramp=60,lead=30", until=90)
    fc.lead, fc.now = lead, 89
    q = fc.forecast(None, np.array([1, 50]))
    assert q[0, 1, 1] == 1.0 and q[1, 1, 1] > 1.8


def test_leading_until_the_predicted_slowdown_shows():
    lead = ThermalLead()
    assert not lead.leading(np.array([1.0, 1.0]))  # nothing predicted
    _feed(lead, "rank=1,factor=2,start=100,ramp=60,lead=30", until=90)
    assert lead.leading(np.array([1.0, 1.0]))  # announced, not yet seen
    assert lead.leading(np.array([1.0, 1.5]))  # half way
    assert not lead.leading(np.array([1.0, 1.9]))  # shown: the speed history takes over
