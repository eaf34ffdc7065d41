"""Reading is cheap (issue 14 item 6): row group by row group into one array per column,
string columns as categoricals, ``columns=`` to skip what a command does not use; the frame
equals what a plain ``pyarrow`` read gives."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bubblecast.telemetry import RunMeta, read_events
from bubblecast.telemetry.events import Events
from bubblecast.telemetry.io import write_events
from bubblecast.telemetry.schema import METADATA_KEY, REQUIRED, encode_metadata


def _frame(n: int = 3000) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    step = np.arange(n) // 4
    tokens = pd.array(np.where(np.arange(n) % 5 == 0, -1, 128), dtype="Int64")
    tokens[np.arange(n) % 5 == 0] = pd.NA  # nulls in an optional integer column
    return pd.DataFrame({
        "run_id": np.where(step < n // 8, "a", "b"), "step": step,
        "rank": np.arange(n) % 2, "stage": np.arange(n) % 2, "replica": 0, "chunk": 0,
        "microbatch": (np.arange(n) // 2) % 2, "op": "F", "start_s": np.arange(n) * 0.01,
        "duration_s": rng.uniform(0.01, 0.02, n), "layers": 4, "tokens": tokens,
        # a different host per row group once row groups are small: dictionaries differ
        "host": np.where(np.arange(n) < n // 3, "node-b", np.where(np.arange(n) < n // 2,
                                                                     "node-a", "node-c")),
        "device": "cpu", "speed": rng.uniform(1, 2, n),
    })


def _write(tmp_path: Path, frame: pd.DataFrame, row_group_size: int = 500) -> Path:
    """Write with small row groups (each with its own string dictionary) and metadata."""
    runs = {r: RunMeta(schedule="gpipe", stages=2, microbatches=2, source="test")
            for r in ("a", "b")}
    table = pa.Table.from_pandas(frame, preserve_index=False)
    table = table.replace_schema_metadata({METADATA_KEY: encode_metadata(runs)})
    path = tmp_path / "e.parquet"
    pq.write_table(table, path, row_group_size=row_group_size, write_page_checksum=True)
    return path


def test_row_groups_read_into_the_same_frame_as_a_plain_read(tmp_path: Path) -> None:
    frame = _frame()
    path = _write(tmp_path, frame)
    assert pq.ParquetFile(path).num_row_groups == 6
    got = read_events(path).frame
    for col in ("run_id", "op", "host", "device"):  # strings stay dictionary-encoded
        assert isinstance(got[col].dtype, pd.CategoricalDtype), col
        assert got[col].astype(str).tolist() == frame[col].tolist(), col
    assert str(got["tokens"].dtype) == "Int64"
    assert got["tokens"].isna().tolist() == frame["tokens"].isna().tolist()
    assert got["tokens"].dropna().tolist() == frame["tokens"].dropna().tolist()
    assert got["layers"].dtype == np.int32 and (got["layers"] == 4).all()
    for col in ("step", "rank", "microbatch", "start_s", "duration_s", "speed"):
        assert np.array_equal(got[col].to_numpy(), frame[col].to_numpy()), col
    plain = pq.read_table(path).to_pandas()
    assert np.array_equal(got["duration_s"].to_numpy(), plain["duration_s"].to_numpy())


def test_columns_reads_the_required_ones_and_only_the_optional_ones_asked(tmp_path: Path
                                                                          ) -> None:
    path = _write(tmp_path, _frame())
    got = read_events(path, columns=["layers", "tokens", "not-there"]).frame
    assert set(got.columns) == set(REQUIRED) | {"layers", "tokens"}
    assert "host" not in got.columns and "speed" not in got.columns
    assert list(read_events(path).frame.columns) == list(_frame().columns)


def test_other_column_types_take_the_general_path(tmp_path: Path) -> None:
    frame = _frame().assign(flag=lambda f: f["step"] % 2 == 0)  # a bool extra column
    got = read_events(_write(tmp_path, frame)).frame
    assert got["flag"].tolist() == frame["flag"].tolist()
    assert isinstance(got["host"].dtype, pd.CategoricalDtype)
    assert got["tokens"].isna().sum() == frame["tokens"].isna().sum()


def test_a_corrupted_page_is_still_an_error_naming_the_file(tmp_path: Path) -> None:
    from bubblecast.errors import BubblecastError

    path = _write(tmp_path, _frame())
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0xFF  # inside a data page
    path.write_bytes(bytes(data))
    with pytest.raises(BubblecastError, match=str(path)):
        read_events(path)


def test_write_read_round_trip_keeps_categoricals_and_metadata(tmp_path: Path) -> None:
    frame = _frame()
    runs = {r: RunMeta(schedule="gpipe", stages=2, microbatches=2, source="test")
            for r in ("a", "b")}
    path = write_events(Events(frame, runs), tmp_path / "w.parquet")
    back = read_events(path)
    assert json.loads(pq.read_schema(path).metadata[METADATA_KEY])["runs"].keys() == {"a", "b"}
    again = write_events(back, tmp_path / "w2.parquet")
    assert read_events(again).frame.equals(back.frame)


@pytest.mark.parametrize("col", ["speed", "layers"])
def test_a_mistyped_optional_column_is_refused_even_when_not_read(tmp_path: Path, col: str
                                                                  ) -> None:
    from bubblecast.errors import BubblecastError

    frame = _frame().assign(**{col: "fast"})  # a string where a number belongs
    path = _write(tmp_path, frame)
    with pytest.raises(BubblecastError, match=f"{path}: column '{col}': expected"):
        read_events(path, columns=["tokens"])  # col is not among the columns read
    read_events(_write(tmp_path, _frame()), columns=["tokens"])  # well-typed: accepted
