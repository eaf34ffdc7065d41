"""Small features frames shared by the forecast tests (built once per session)."""

from __future__ import annotations

import pytest

from bubblecast.dataset import DatasetConfig, build_dataset, write_features
from tests.dataset.synth import make_events

#: Short windows so that short runs (fast tests) still give many rows.
SMALL = DatasetConfig(horizons=(1, 5), windows=(4, 10, 24), lags=12, max_period=12)


@pytest.fixture(scope="session")
def train_frame():
    events = make_events(runs=8, steps=110, stages=4, replicas=1, kind="mixed", seed=21)
    return build_dataset(events, SMALL)[0]


@pytest.fixture(scope="session")
def test_frame():
    events = make_events(runs=3, steps=110, stages=4, replicas=1, kind="mixed", seed=77,
                         prefix="held")
    return build_dataset(events, SMALL)[0]


@pytest.fixture(scope="session")
def features_file(tmp_path_factory):
    events = make_events(runs=8, steps=110, stages=4, replicas=1, kind="mixed", seed=21)
    frame, meta = build_dataset(events, SMALL)
    return write_features(frame, meta, tmp_path_factory.mktemp("feat") / "features.parquet")
