"""The device_metrics side table: round trip, validation, checksums, where it lives."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from bubblecast.errors import BubblecastError
from bubblecast.telemetry.metrics import (
    is_known_future,
    metrics_path,
    read_metrics,
    write_metrics,
)


def _frame(n: int = 6) -> pd.DataFrame:
    return pd.DataFrame({"run_id": "r", "step": np.arange(n), "rank": 0,
                         "metric": "temperature_c", "value": np.linspace(70, 80, n)})


def test_round_trip_beside_an_events_file(tmp_path):
    events = tmp_path / "runs.parquet"
    assert metrics_path(events) == tmp_path / "runs.metrics"
    write_metrics(_frame(), metrics_path(events))
    back = read_metrics(events)
    assert back["value"].tolist() == _frame()["value"].tolist()
    assert str(back["step"].dtype) == "int64" and str(back["rank"].dtype) == "int32"
    assert read_metrics(tmp_path / "other.parquet").empty  # none: empty, not an error


def test_directory_collects_every_metrics_file(tmp_path):
    write_metrics(_frame(3).assign(run_id="a"), tmp_path / "run_id=a" / "rank0000.metrics")
    write_metrics(_frame(4).assign(run_id="b"), tmp_path / "run_id=b" / "rank0001.metrics")
    back = read_metrics(tmp_path)
    assert sorted(back["run_id"].unique()) == ["a", "b"] and len(back) == 7


@pytest.mark.parametrize("column,bad,word", [("value", np.inf, "non-finite"),
                                             ("step", -1, "negatives"),
                                             ("step", 1.5, "integer")])
def test_refuses_bad_rows_naming_the_column(tmp_path, column, bad, word):
    frame = _frame()
    frame[column] = frame[column].astype(float)
    frame.loc[2, column] = bad
    with pytest.raises(BubblecastError, match=f"'{column}'.*{word}"):
        write_metrics(frame, tmp_path / "x.metrics")
    assert not (tmp_path / "x.metrics").exists()  # atomic: nothing left


def test_corrupted_page_is_named(tmp_path):
    path = write_metrics(_frame(2000), tmp_path / "x.metrics")
    raw = bytearray(path.read_bytes())
    middle = len(raw) // 3
    raw[middle:middle + 8] = b"\xff" * 8
    path.write_bytes(bytes(raw))
    with pytest.raises(BubblecastError, match="x.metrics"):
        read_metrics(path)


def test_known_future_names():
    assert is_known_future("tokens") and is_known_future("planned_eval")
    assert not is_known_future("temperature_c")
