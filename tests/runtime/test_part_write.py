"""The recorder's part writer (numpy arrays -> Parquet) against the DataFrame write path."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bubblecast.runtime.parts import OPS, event_arrays, event_columns
from bubblecast.telemetry import SchemaError, from_frame, read_events, write_events
from bubblecast.telemetry.fastwrite import RankArrays, write_rank_arrays
from bubblecast.telemetry.schema import RunMeta

META = RunMeta(schedule="1f1b", stages=2, microbatches=4, chunks=2, extra={"timing": "host"})
KW = {"run_id": "run-x", "rank": 1, "stage": 1, "replica": 0, "host": "node-a",
      "device": "cpu", "offset": 3.5}


def _rows(steps: int = 30, tokens: int = 16) -> list[tuple]:
    """Recorder rows ``(step, chunk, mb, op code, start, duration, layers, tokens)``."""
    out, t = [], 100.0
    for s in range(steps):
        for chunk in (0, 1):
            for code in (0, 1, 2):
                for mb in range(4):
                    out.append((s, chunk, mb, code, t, 0.001 * (1 + mb), 3, tokens))
                    t += 0.0025
        out.append((s, 0, -1, 3, t, 0.0004, 6, 0))  # as record_optimizer
        t += 0.001
    return out


def _old_path(rows: list[tuple], path: Path) -> None:
    """What PartWriter wrote before: a DataFrame, from_frame (validates), write_events."""
    frame = pd.DataFrame(event_columns(event_arrays(rows, OPS, **KW)))
    write_events(from_frame(frame, {"run-x": META}, str(path)), path, validate=False)


@pytest.mark.parametrize("tokens", [16, -1])
def test_part_is_byte_for_byte_the_dataframe_paths_and_reads_back_valid(tmp_path: Path,
                                                                       tokens: int) -> None:
    rows = _rows(tokens=tokens)
    old, new = tmp_path / "old.parquet", tmp_path / "new.parquet"
    _old_path(rows, old)
    write_rank_arrays(event_arrays(rows, OPS, **KW), META, new)
    assert new.read_bytes() == old.read_bytes()
    got = read_events(new)  # validates on read
    pd.testing.assert_frame_equal(got.frame, read_events(old).frame)
    assert got.runs["run-x"].extra["timing"] == "host"
    assert len(got) == len(rows)
    assert got.frame["tokens"].isna().sum() == (30 * 24 if tokens < 0 else 0)
    assert list(got.frame["op"].unique()) == ["F", "B", "W", "OPTIMIZER"]
    assert not list(tmp_path.glob(".*"))  # no temporary left


def _arrays(**change: object) -> RankArrays:
    return dataclasses.replace(event_arrays(_rows(steps=3), OPS, **KW), **change)


def _bad(a: RankArrays, i: int, value: object, col: str) -> RankArrays:
    values = getattr(a, col).copy()
    values[i] = value
    return dataclasses.replace(a, **{col: values})


@pytest.mark.parametrize(("col", "value", "problem"), [
    ("start_s", np.nan, "not finite"),
    ("duration_s", np.inf, "not finite"),
    ("duration_s", -0.5, "negative duration"),
    ("step", -1, "below 0"),
    ("microbatch", -2, "below -1"),
    ("microbatch", 4, "out of range for run 'run-x' (microbatches=4)"),
    ("chunk", 2, "out of range for run 'run-x' (chunks=2)"),
    ("layers", -1, "below 0"),
    ("op", 10, "unknown op code"),
])
def test_bad_rows_are_refused_naming_column_and_row_and_leave_no_file(
        tmp_path: Path, col: str, value: object, problem: str) -> None:
    path = tmp_path / "part.parquet"
    with pytest.raises(SchemaError) as err:
        write_rank_arrays(_bad(_arrays(), 7, value, col), META, path)
    assert err.value.column == col and err.value.row == 7
    assert problem in str(err.value)
    assert not path.exists() and not list(tmp_path.iterdir())


def test_duplicate_compute_op_is_refused_at_the_later_row(tmp_path: Path) -> None:
    a = _arrays()
    a = _bad(_bad(a, 9, a.microbatch[8], "microbatch"), 9, a.chunk[8], "chunk")
    with pytest.raises(SchemaError, match=r"row 9: duplicate compute op \(run_id=run-x, "
                                          r"step=0, rank=1, chunk=0, microbatch=0, op=W\)"):
        write_rank_arrays(a, META, tmp_path / "p.parquet")


def test_scalar_columns_and_dtypes_are_checked(tmp_path: Path) -> None:
    with pytest.raises(SchemaError, match="column 'stage', row 0: value 2 out of range"):
        write_rank_arrays(_arrays(stage=2), META, tmp_path / "p.parquet")
    with pytest.raises(SchemaError, match="column 'rank', row 0: value -1 is below 0"):
        write_rank_arrays(_arrays(rank=-1), META, tmp_path / "p.parquet")  # as validate says
    with pytest.raises(SchemaError, match="column 'rank': value 2147483648 is not an int32"):
        write_rank_arrays(_arrays(rank=2**31), META, tmp_path / "p.parquet")
    a = _arrays()
    with pytest.raises(SchemaError, match="column 'step': expected a 1-d int64 array, got "
                                          "float64"):
        write_rank_arrays(dataclasses.replace(a, step=a.step.astype(float)), META,
                          tmp_path / "p.parquet")
    with pytest.raises(SchemaError, match="column 'tokens': has 2 rows"):
        write_rank_arrays(dataclasses.replace(a, tokens=a.tokens[:2]), META,
                          tmp_path / "p.parquet")
    assert not list(tmp_path.iterdir())


def test_rows_with_unknown_documents_write_the_same_bytes_as_rows_without(tmp_path: Path
                                                                          ) -> None:
    rows = _rows(steps=4)
    unknown = [(*r, -1.0, -1) for r in rows]  # the recorder's rows on steps without documents
    write_rank_arrays(event_arrays(rows, OPS, **KW), META, tmp_path / "a.parquet")
    write_rank_arrays(event_arrays(unknown, OPS, **KW), META, tmp_path / "b.parquet")
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
    known = [(*r, 9.0, 2) if r[0] == 1 else (*r, -1.0, -1) for r in rows]
    a = event_arrays(known, OPS, **KW)
    assert a.tokens_sq is not None and a.nulls["documents"].sum() == len(rows) * 3 // 4
    _old_path(known, tmp_path / "old.parquet")
    write_rank_arrays(a, META, tmp_path / "new.parquet")
    assert (tmp_path / "new.parquet").read_bytes() == (tmp_path / "old.parquet").read_bytes()
    f = read_events(tmp_path / "new.parquet").frame
    assert f.loc[f["step"] == 1, "documents"].tolist() == [2] * (len(rows) // 4)
