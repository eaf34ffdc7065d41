"""One origin's covariates from dense arrays (``series_covariates``, what the controller and the
service compute) and from metric rows (``origin_covariates``) equal the dataset builder's
(``covariate_features``) exactly, on random metric series with gaps, NaN samples, several
samples at one step, a known-future metric and a calendar."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from bubblecast.dataset import DatasetConfig
from bubblecast.dataset.covariates import (
    covariate_features,
    origin_covariates,
    series_covariates,
)

CONFIG = DatasetConfig(horizons=(1, 3, 7), windows=(2, 5, 9), lags=2, max_period=4,
                       covariates="auto")
METRICS = ("temperature_c", "power_w", "planned_tokens")  # the last is known-future
META = SimpleNamespace(extra={"calendar": {"checkpoint_every": 4, "eval_every": 3,
                                           "eval_first": 1}})


def _expected(rows: pd.DataFrame, ranks: list[int], origin: int) -> dict[str, np.ndarray]:
    """The dataset builder's covariates of one replica's stages at ``origin``."""
    stages = np.arange(len(ranks))
    keys = pd.DataFrame({"run_id": "live", "replica": 0, "stage": stages, "step": origin})
    table = keys[["run_id", "replica", "stage"]].assign(rank=ranks)
    return covariate_features(keys, rows.assign(run_id="live"), table, {"live": META}, CONFIG)


@st.composite
def series(draw: st.DrawFn) -> tuple[pd.DataFrame, list[int], int]:
    """Metric rows of P stages' ranks (a rank of another replica too), and an origin."""
    p = draw(st.integers(1, 4))
    steps = draw(st.integers(1, 30))
    ranks = draw(st.permutations(list(range(p + 1))))[:p]
    value = st.one_of(st.integers(-500, 1500).map(lambda x: x / 10), st.just(float("nan")))
    rows = []
    for metric in draw(st.lists(st.sampled_from(METRICS), min_size=1, max_size=3,
                                unique=True)):
        for rank in range(p + 1):
            for step in range(steps):
                for _ in range(draw(st.sampled_from([0, 0, 1, 1, 1, 2]))):  # gaps, repeats
                    rows.append((step, rank, metric, draw(value)))
    frame = pd.DataFrame(rows, columns=["step", "rank", "metric", "value"])
    return frame.astype({"step": np.int64, "rank": np.int64}), ranks, \
        draw(st.integers(0, steps + 8))


@settings(max_examples=80, deadline=None)
@given(series())
def test_origin_covariates_equal_the_datasets(case: tuple[pd.DataFrame, list[int], int]) -> None:
    rows, ranks, origin = case
    want = _expected(rows, ranks, origin)
    got = origin_covariates(rows, ranks, origin, CONFIG, META)
    assert sorted(got) == sorted(want)
    for col in want:
        np.testing.assert_array_equal(got[col], want[col], err_msg=col)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(1, 30), st.integers(0, 40), st.data())
def test_dense_arrays_equal_the_datasets(p: int, steps: int, origin: int,
                                         data: st.DataObject) -> None:
    """The controller's form: one finite value or NaN (no sample) per step and stage."""
    cells = st.one_of(st.integers(0, 1200).map(lambda x: x / 10), st.just(float("nan")))
    arrays = {m: np.array(data.draw(st.lists(st.lists(cells, min_size=p, max_size=p),
                                             min_size=steps, max_size=steps)))
              for m in METRICS[:2]}
    parts = [pd.DataFrame({"step": r, "rank": c, "metric": m, "value": v[r, c]})
             for m, v in arrays.items() for r, c in [np.nonzero(np.isfinite(v))]]
    rows = pd.concat(parts, ignore_index=True).astype({"step": np.int64, "rank": np.int64})
    want = _expected(rows, list(range(p)), origin)
    got = series_covariates(arrays, origin, CONFIG, META)
    assert set(want) <= set(got)
    for c in want:
        np.testing.assert_array_equal(got[c], want[c], err_msg=c)
    for c in set(got) - set(want):  # a metric never sampled: the dataset has no rows of it
        assert np.isnan(got[c]).all(), c
