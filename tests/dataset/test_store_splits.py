"""Features file versioning and run-grouped splits / rolling-origin backtests."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from bubblecast.dataset import (
    FEATURES_VERSION,
    DatasetConfig,
    build_dataset,
    read_features,
    rolling_origin,
    run_folds,
    split_runs,
    write_features,
)
from bubblecast.dataset.store import METADATA_KEY
from bubblecast.errors import BubblecastError
from tests.dataset.synth import make_events

CONFIG = DatasetConfig(horizons=(1, 4), windows=(4, 10, 24), lags=8, max_period=10)


@pytest.fixture(scope="module")
def frame_meta():
    events = make_events(runs=6, steps=50, seed=11)
    return build_dataset(events, CONFIG)


def test_features_file_round_trips_with_its_version(frame_meta, tmp_path):
    frame, meta = frame_meta
    path = write_features(frame, meta, tmp_path / "f.parquet")
    back, back_meta = read_features(path)
    assert back_meta.version == FEATURES_VERSION
    assert back_meta.config == CONFIG and back_meta.fingerprint == meta.fingerprint
    assert list(back.columns) == list(frame.columns)
    np.testing.assert_allclose(back["f_u_mean_w10"], frame["f_u_mean_w10"])
    assert not list(tmp_path.glob(".*tmp"))  # written atomically


def test_a_file_from_another_version_is_refused_in_one_line(frame_meta, tmp_path):
    frame, meta = frame_meta
    path = write_features(frame, meta, tmp_path / "f.parquet")
    table = pq.read_table(path)
    obj = json.loads(table.schema.metadata[METADATA_KEY])
    obj["features_version"] = FEATURES_VERSION + 1
    md = dict(table.schema.metadata)
    md[METADATA_KEY] = json.dumps(obj).encode()
    pq.write_table(table.replace_schema_metadata(md), tmp_path / "old.parquet")
    with pytest.raises(BubblecastError, match=f"features version {FEATURES_VERSION + 1}") as exc:
        read_features(tmp_path / "old.parquet")
    assert "\n" not in str(exc.value)
    pq.write_table(table.replace_schema_metadata({}), tmp_path / "plain.parquet")
    with pytest.raises(BubblecastError, match="not a bubblecast features file"):
        read_features(tmp_path / "plain.parquet")


def test_a_damaged_page_is_caught_by_its_checksum(frame_meta, tmp_path):
    frame, meta = frame_meta
    path = write_features(frame, meta, tmp_path / "f.parquet")
    col = pq.ParquetFile(path).metadata.row_group(0).column(frame.columns.get_loc("level"))
    data = bytearray(path.read_bytes())
    data[col.data_page_offset + col.total_compressed_size - 8] ^= 0xFF  # inside the page data
    path.write_bytes(bytes(data))
    with pytest.raises(BubblecastError, match="not a readable Parquet file.*CRC") as exc:
        read_features(path)
    assert str(exc.value).startswith(str(path)) and "\n" not in str(exc.value)


def test_fingerprint_changes_with_the_data(frame_meta):
    frame, meta = frame_meta
    other = make_events(runs=6, steps=50, seed=12)
    assert build_dataset(other, CONFIG)[1].fingerprint != meta.fingerprint
    assert build_dataset(make_events(runs=6, steps=50, seed=11), CONFIG)[1].fingerprint == \
        meta.fingerprint


def test_split_runs_never_splits_a_run(frame_meta):
    frame, _ = frame_meta
    masks = split_runs(frame, {"train": 0.6, "val": 0.2, "cal": 0.2}, seed=3)
    runs = {k: set(frame.loc[m, "run_id"].astype(str)) for k, m in masks.items()}
    assert all(runs.values())
    assert not (runs["train"] & runs["val"]) and not (runs["train"] & runs["cal"])
    assert not (runs["val"] & runs["cal"])
    assert sum(m.sum() for m in masks.values()) == len(frame)
    assert split_runs(frame, {"a": 0.5, "b": 0.5}, seed=3)["a"].tolist() == \
        split_runs(frame, {"a": 0.5, "b": 0.5}, seed=3)["a"].tolist()


def test_run_folds_cover_each_run_once(frame_meta):
    frame, _ = frame_meta
    folds = run_folds(frame, 3, seed=0)
    tested = np.zeros(len(frame), dtype=int)
    for train, test in folds:
        assert not (set(frame.loc[train, "run_id"]) & set(frame.loc[test, "run_id"]))
        tested += test
    assert (tested == 1).all()


def test_rolling_origin_trains_only_on_targets_known_before_the_cutoff(frame_meta):
    frame, _ = frame_meta
    test_runs = ["run0", "run1"]
    folds = rolling_origin(frame, n_folds=3, test_runs=test_runs)
    assert len(folds) == 3
    for train, test in folds:
        assert train.any() and test.any()
        assert set(frame.loc[test, "run_id"].astype(str)) <= set(test_runs)
        assert not set(frame.loc[train, "run_id"].astype(str)) & set(test_runs)
        assert frame.loc[train, "step"].max() + 4 < frame.loc[test, "step"].min()
