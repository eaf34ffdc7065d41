"""Parquet I/O: directories, metadata, refusing non-events files, atomic writes."""

from __future__ import annotations

import json

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bubblecast.errors import BubblecastError
from bubblecast.telemetry import EventsBuilder, RunMeta, read_events, write_events
from bubblecast.telemetry.io import atomic_write


def _events(run_id: str, stages: int = 2):
    b = EventsBuilder().add_run(run_id, RunMeta(schedule="gpipe", stages=stages, microbatches=2,
                                                partition=[2] * stages, source="test"))
    for stage in range(stages):
        for mb in range(2):
            b.add(run_id, step=0, rank=stage, stage=stage, op="F", microbatch=mb,
                  start_s=0.1 * (mb + stage), duration_s=0.1, layers=2, tokens=128)
    return b.build()


def test_metadata_round_trips_in_parquet_key_value_store(tmp_path):
    path = write_events(_events("a"), tmp_path / "a.parquet")
    raw = pq.read_schema(path).metadata[b"bubblecast"]
    payload = json.loads(raw)
    assert payload["schema_version"] == 1
    assert payload["runs"]["a"]["stages"] == 2
    assert payload["runs"]["a"]["partition"] == [2, 2]
    back = read_events(path)
    assert back.frame["layers"].tolist() == [2, 2, 2, 2]
    assert str(back.frame["tokens"].dtype) == "int64"


def test_a_directory_of_files_reads_as_one_table(tmp_path):
    write_events(_events("a"), tmp_path / "d" / "part-0.parquet")
    write_events(_events("b", stages=3), tmp_path / "d" / "part-1.parquet")
    events = read_events(tmp_path / "d")
    assert sorted(events.run_ids) == ["a", "b"]
    assert events.runs["b"].stages == 3
    assert len(events) == 4 + 6


def test_missing_and_non_parquet_inputs_give_one_line_errors(tmp_path):
    with pytest.raises(BubblecastError, match="no such file"):
        read_events(tmp_path / "nope.parquet")
    junk = tmp_path / "junk.parquet"
    junk.write_text("not parquet")
    with pytest.raises(BubblecastError, match="junk.parquet: not a readable Parquet file"):
        read_events(junk)
    (tmp_path / "empty").mkdir()
    with pytest.raises(BubblecastError, match="holds no .parquet"):
        read_events(tmp_path / "empty")


def test_bad_metadata_version_is_refused(tmp_path):
    table = pa.table({"x": [1]})
    meta = {b"bubblecast": json.dumps({"schema_version": 99, "runs": {}}).encode()}
    pq.write_table(table.replace_schema_metadata(meta), tmp_path / "v.parquet")
    with pytest.raises(BubblecastError, match="schema_version"):
        read_events(tmp_path / "v.parquet")


def test_atomic_write_leaves_nothing_when_the_writer_fails(tmp_path):
    target = tmp_path / "out.bin"
    target.write_text("old")

    def failing(tmp: str) -> None:
        with open(tmp, "w") as fh:
            fh.write("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        atomic_write(target, failing)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]


def test_builder_fills_missing_optional_values():
    b = EventsBuilder()
    b.add("r", step=0, rank=0, stage=0, op="F", microbatch=0, start_s=0.0, duration_s=1.0)
    b.add("r", step=0, rank=0, stage=0, op="B", microbatch=0, start_s=1.0, duration_s=1.0,
          tokens=64)
    frame = b.build().frame
    assert pd.isna(frame["tokens"].iloc[0]) and frame["tokens"].iloc[1] == 64


def test_optional_integer_columns_with_nulls_round_trip(tmp_path):
    b = EventsBuilder()
    b.add("r", step=0, rank=0, stage=0, op="F", microbatch=0, start_s=0.0, duration_s=1.0)
    b.add("r", step=0, rank=0, stage=0, op="B", microbatch=0, start_s=1.0, duration_s=1.0,
          tokens=64, layers=3)
    back = read_events(write_events(b.build(), tmp_path / "n.parquet"))
    assert str(back.frame["tokens"].dtype) == "Int64"
    assert back.frame["tokens"].isna().tolist() == [True, False]
    assert back.frame["layers"].iloc[1] == 3


def test_concat_of_runs_with_and_without_tokens_round_trips(tmp_path):
    from bubblecast.telemetry.events import Events

    with_tokens = _events("a")
    b = EventsBuilder()
    b.add("b", step=0, rank=0, stage=0, op="F", microbatch=0, start_s=0.0, duration_s=1.0)
    both = Events.concat([with_tokens, b.build()])
    assert str(both.frame["tokens"].dtype) == "Int64"
    back = read_events(write_events(both, tmp_path / "mixed.parquet"))
    assert back.frame["tokens"].isna().sum() == 1
