"""The one model-to-speed adapter: horizon interpolation, the delay -> speed unit, refusals."""

from __future__ import annotations

import numpy as np
import pytest

from bubblecast.dataset.window import Window
from bubblecast.errors import BubblecastError
from bubblecast.policy.speeds import (
    ForecastUnavailable,
    ModelSpeeds,
    UnusableForecast,
    interpolate_horizons,
)


class Linear:
    """Delay quantiles equal to the horizon (p10/p50/p90 = h - 1, h, h + 1) on every rank."""

    min_window = 3

    def __init__(self, horizons: tuple[int, ...] | None = (1, 5, 10)) -> None:
        self.horizons = horizons
        self.asked: list[list[int]] = []

    def predict_window(self, window: Window, horizons: list[int]) -> np.ndarray:
        self.asked.append(list(horizons))
        h = np.asarray(horizons, dtype=np.float64)
        q = np.stack([h - 1, h, h + 1], axis=-1)
        return np.repeat(q[None], window.stages, axis=0)


def window(steps: int = 4, tokens: bool = False) -> Window:
    compute = np.ones((steps, 2))
    tok = np.full((steps, 2), 8.0) if tokens else None
    return Window(compute=compute, cost=np.ones((steps, 2)), microbatches=4, tokens=tok)


def test_interpolation_is_linear_between_known_horizons_and_flat_outside():
    q = np.array([1.0, 5.0, 10.0])[:, None]
    got = interpolate_horizons(q, [1, 5, 10], [0, 1, 3, 5, 7, 10, 64])[:, 0]
    np.testing.assert_array_equal(got, [1.0, 1.0, 3.0, 5.0, 7.0, 10.0, 10.0])
    one = interpolate_horizons(np.array([[2.0]]), [5], [1, 5, 9])[:, 0]
    np.testing.assert_array_equal(one, [2.0, 2.0, 2.0])


def test_live_speeds_ask_the_known_horizons_and_convert_delay_to_speed():
    model = Linear()
    fc = ModelSpeeds(model, window=window())
    q = fc.forecast(None, np.array([1, 3, 10]))
    assert model.asked == [[1, 5, 10]]
    # no tokens: load is the microbatch count, so speed = delay x M / M = delay
    np.testing.assert_allclose(q[:, 0, 1], [1.0, 3.0, 10.0])
    assert q.shape == (3, 2, 3) and np.all(np.diff(q, axis=2) >= 0)
    np.testing.assert_array_equal(fc.asked, [1, 3, 10])
    assert fc.last is q
    tok = ModelSpeeds(Linear(horizons=None), window=window(tokens=True)).forecast(None, [2])
    np.testing.assert_allclose(tok[0, :, 1], [2.0 * 8.0 / 4, 2.0 * 8.0 / 4])


def test_live_speeds_refuse_a_short_window_and_a_non_finite_forecast():
    fc = ModelSpeeds(Linear(), name="m")
    with pytest.raises(ForecastUnavailable, match="model 'm' needs 3 steps of history, has 0"):
        fc.forecast(None, [1])
    fc.window = window(steps=2)
    with pytest.raises(ForecastUnavailable, match="has 2"):
        fc.forecast(None, [1])

    class Nan(Linear):
        def predict_window(self, window: Window, horizons: list[int]) -> np.ndarray:
            return np.full((window.stages, len(horizons), 3), np.nan)

    with pytest.raises(UnusableForecast) as err:
        ModelSpeeds(Nan(), window=window()).forecast(None, [1])
    assert err.value.field == "ranks"


def test_offline_speeds_look_up_the_origin_and_fall_back_where_there_is_none():
    class Fallback:
        name = "fallback"

        def forecast(self, state, horizons):
            return np.full((len(horizons), 1, 3), -1.0)

    table = np.full((3, 2, 1, 3), np.nan)
    table[1] = np.array([[[1.0, 2.0, 3.0]], [[3.0, 4.0, 5.0]]])
    fc = ModelSpeeds(table=table, table_horizons=[1, 3], fallback=Fallback())
    state = type("S", (), {"t": 1})()
    np.testing.assert_array_equal(fc.forecast(state, [2])[0, 0], [2.0, 3.0, 4.0])
    assert fc.forecast(type("S", (), {"t": 0})(), [2])[0, 0, 1] == -1.0
    assert fc.forecast(type("S", (), {"t": 9})(), [2])[0, 0, 1] == -1.0
    with pytest.raises(BubblecastError):
        ModelSpeeds(Linear(), table=table, table_horizons=[1, 3], fallback=Fallback())
    with pytest.raises(BubblecastError):
        ModelSpeeds(table=table)
