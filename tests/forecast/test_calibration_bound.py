"""``benchmarks/calibration_bound.py`` rescores a model's raw intervals under calibrations fitted
on resampled runs. Its figures mean something only if that rescoring is the model's own: with
the model's fitted shifts it must put exactly the rows inside that ``predict_signal``'s
intervals hold, and a calibration fitted on a pool's rows must cover those rows as
:func:`~bubblecast.forecast.conformal.regime_shifts` promises (at least 0.80, by at most the
conformal rounding of its smallest group above it)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import calibration_bound as cb  # noqa: E402
from calibration_spread import HORIZONS, runs_frame  # noqa: E402

from bubblecast.forecast.conformal import MIN_GROUP_ROWS  # noqa: E402
from bubblecast.forecast.lgbm import LGBMForecaster  # noqa: E402
from bubblecast.forecast.seq import SeqForecaster  # noqa: E402


@pytest.fixture(scope="module")
def frames() -> tuple:
    return runs_frame({"mixed": 8}, 1, 160), runs_frame({"mixed": 6}, 2, 160)


@pytest.mark.parametrize("make", [lambda: LGBMForecaster(seed=0, n_estimators=60),
                                  lambda: SeqForecaster(epochs=2, seed=0)],
                         ids=["lgbm", "gru"])
def test_raw_pool_reproduces_the_models_intervals(frames: tuple, make) -> None:
    train, held = frames
    model = make().fit(train)
    pool = cb.RawPool(model, held)
    pred = model.predict_signal(held, list(HORIZONS))
    rows = np.ones(len(held), dtype=bool)
    for h in HORIZONS:
        y = held[f"y_h{h}"].to_numpy(np.float64)
        ok = np.isfinite(y)
        expected = (y >= pred[h][:, 0]) & (y <= pred[h][:, 2])
        got = pool.inside(h, model.shifts_[h], rows)
        assert np.array_equal(np.isnan(got), ~ok)
        # exp/log round trips may move a bound by an ulp: allow a handful of ties, no more
        assert np.mean(got[ok] != expected[ok]) < 1e-3, h
        shifts = pool.fit(h, rows)
        covered = float(np.nanmean(pool.inside(h, shifts, rows)))
        # each group's tail holds >= 90% of its >= MIN_GROUP_ROWS rows, by at most (0.9 + 1) / n
        assert 0.80 <= covered <= 0.80 + 2 * 1.9 / MIN_GROUP_ROWS, (h, covered)


def test_resample_draws_disjoint_test_and_calibration_runs(frames: tuple) -> None:
    _, held = frames
    model = LGBMForecaster(seed=0, n_estimators=30).fit(frames[0])
    pool = cb.RawPool(model, held)
    rng = np.random.default_rng(0)
    test, cals = cb.draw(pool, ("mixed",), 2, {"own": 3, "rest": None}, rng)
    assert len(test) == 2 and len(cals["own"]) == 3 and len(cals["rest"]) == 4
    assert not set(test) & set(cals["rest"])
    assert set(cals["own"]) <= set(cals["rest"])
