"""A features dataset partitioned by run opens in every common reader as the single file does.

The readers and what may differ between a directory and a file (``run_id``'s type as a hive
key, dictionary index widths) are those of ``tests/telemetry/test_readers.py``.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bubblecast.cli import main
from bubblecast.dataset.store import COMMON_METADATA, read_features, read_features_meta
from bubblecast.telemetry.fleet import sidecar_dir
from tests.telemetry.test_readers import READERS, assert_same_data

SIM = ["simulate", "--schedule", "1f1b", "--stages", "2", "--microbatches", "4", "--steps",
       "40", "--runs", "4", "--scenario", "mixed", "--seed", "2"]
DATA = ["--windows", "5,20", "--horizons", "1,5", "--lags", "8"]
KEYS = ["run_id", "replica", "stage", "step"]


@pytest.fixture(scope="module")
def features(tmp_path_factory) -> dict[str, Path]:
    """The features of a fleet as one file and as a dataset partitioned by run."""
    root = tmp_path_factory.mktemp("feature-readers")
    fleet = str(root / "fleet") + "/"
    assert main([*SIM, "--out", fleet]) == 0
    assert main(["dataset", fleet, *DATA, "--out", str(root / "one.parquet")]) == 0
    assert main(["dataset", fleet, *DATA, "--out", str(root / "feat") + "/"]) == 0
    return {"one": root / "one.parquet", "dir": root / "feat"}


@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_reader_opens_a_features_dataset_as_the_single_file(features, reader):
    assert_same_data(reader, features["one"], features["dir"], KEYS, set())


def test_the_dataset_holds_parts_only_in_one_schema_and_its_metadata_beside_it(features):
    files = [p for p in features["dir"].rglob("*") if p.is_file()]
    assert len(files) == 4 and all(p.suffix == ".parquet" for p in files)
    schemas = {pq.read_schema(p).remove_metadata() for p in files}
    assert len(schemas) == 1 and "run_id" not in schemas.pop().names
    side = sidecar_dir(features["dir"])
    assert side == features["dir"].parent / "_feat.sidecars"
    assert [p.name for p in side.iterdir()] == [COMMON_METADATA]
    assert read_features_meta(features["dir"]).runs == read_features_meta(features["one"]).runs


def test_bubblecast_reads_the_dataset_as_the_single_file(features):
    one, one_meta = read_features(features["one"])
    many, many_meta = read_features(features["dir"])
    assert many_meta.fingerprint == one_meta.fingerprint
    pd.testing.assert_frame_equal(many, one)


def test_parts_of_differing_columns_get_one_schema(tmp_path):
    """Groups of runs that give different columns (say covariates one group lacks) end as
    parts of one schema, the missing columns typed nulls."""
    from bubblecast.dataset.config import DatasetConfig
    from bubblecast.dataset.store import FeaturesMeta, finish_partitioned

    tmp = tmp_path / ".build"
    for run, extra in (("a", {"x_temp": pa.array([1.5, 2.5], pa.float32())}), ("b", {})):
        (tmp / f"run_id={run}").mkdir(parents=True)
        table = pa.table({"step": pa.array([0, 1], pa.int64()), **extra})
        pq.write_table(table, tmp / f"run_id={run}" / "part-00000.parquet")
    meta = FeaturesMeta(config=DatasetConfig(), fingerprint="f", runs=["a", "b"])
    out = finish_partitioned(tmp, tmp_path / "ds", meta)
    schemas = {pq.read_schema(p).remove_metadata() for p in out.rglob("*.parquet")}
    assert len(schemas) == 1
    assert schemas.pop().field("x_temp").type == pa.float32()
    frame, _ = read_features(out)
    assert frame["x_temp"].isna().tolist() == [False, False, True, True]
    assert frame["run_id"].astype(str).tolist() == ["a", "a", "b", "b"]


def test_a_dataset_of_the_previous_layout_is_still_read(features, tmp_path):
    """Written by hand as bubblecast wrote datasets before: ``run_id`` inside each part and
    ``_common_metadata`` inside the dataset directory."""
    one, _ = read_features(features["one"])
    legacy = tmp_path / "old"
    table = pq.read_table(features["one"])
    for run in sorted(one["run_id"].astype(str).unique()):
        rows = pa.array((one["run_id"].astype(str) == run).to_numpy())
        (legacy / f"run_id={run}").mkdir(parents=True)
        pq.write_table(table.filter(rows), legacy / f"run_id={run}" / "part-00000.parquet")
    pq.write_metadata(table.schema, legacy / COMMON_METADATA)
    frame, meta = read_features(legacy)
    assert meta.runs == read_features_meta(features["one"]).runs
    pd.testing.assert_frame_equal(frame, one)
