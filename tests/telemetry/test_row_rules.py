"""One table of SPEC row rules: the validator (DataFrame path) and the recorder's fast writer
refuse the same bad rows with the same error, and write the same bytes for good ones."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bubblecast.runtime.parts import OPS, event_arrays, event_columns
from bubblecast.telemetry import SchemaError, from_frame, read_events, write_events
from bubblecast.telemetry.events_builder import EventsBuilder
from bubblecast.telemetry.fastwrite import RankArrays, check_rank_arrays, write_rank_arrays
from bubblecast.telemetry.row_rules import ROW_RULES, first_duplicate
from bubblecast.telemetry.schema import OPTIONAL, RunMeta

SRC = "part.parquet"
KW = {"run_id": "run-x", "rank": 1, "stage": 1, "replica": 0, "host": "node-a",
      "device": "cpu", "offset": 3.5}
SETTINGS = settings(max_examples=80, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def _rows(steps: int, microbatches: int, chunks: int, docs: bool) -> list[tuple]:
    """Recorder rows ``(step, chunk, mb, op code, start, duration, layers, tokens, tokens_sq,
    documents)``; every third step has unknown documents (nulls) when ``docs``."""
    out, t = [], 10.0
    for s in range(steps):
        known = docs and s % 3 != 2
        for chunk in range(chunks):
            for code in (0, 1, 2):
                for mb in range(microbatches):
                    work = (100 + mb, float((100 + mb) ** 2), 1) if known else (16, -1.0, -1)
                    out.append((s, chunk, mb, code, t, 0.001 * (1 + mb), 2, *work))
                    t += 0.002
        out.append((s, 0, -1, 3, t, 0.0005, 2 * chunks, *((0, 0.0, 0) if known else
                                                          (0, -1.0, -1))))
        t += 0.001
    return out


def _set(a: RankArrays, col: str, row: int, value: object) -> RankArrays:
    values = getattr(a, col).copy()
    values[row] = value
    return dataclasses.replace(a, **{col: values})


#: (column, bad value) written into one row; None as the column: a duplicate compute op.
CELLS = [("start_s", np.nan), ("start_s", np.inf), ("duration_s", -np.inf),
         ("duration_s", -0.5), ("step", -1), ("microbatch", -2), ("microbatch", "limit"),
         ("chunk", -1), ("chunk", "limit"), ("layers", -1), ("tokens", -1), ("tokens", -7),
         ("tokens_sq", np.inf), ("tokens_sq", -np.inf), ("tokens_sq", -4.0),
         ("tokens_sq", np.nan), ("documents", -1), (None, None)]
#: Scalar columns set for every row.
SCALARS = [("rank", -1), ("stage", -1), ("stage", 2), ("replica", -1), ("replica", 1)]


def _corrupt(a: RankArrays, meta: RunMeta, cell: tuple[str | None, object], row: int
             ) -> RankArrays:
    col, value = cell
    if col is None:  # the compute op of an earlier row again
        compute = np.flatnonzero(a.op < 3)
        later = compute[compute >= row]
        target = int(later[0]) if later.size else int(compute[-1])
        src = int(compute[0]) if target != compute[0] else int(compute[1])
        for c in ("step", "chunk", "microbatch", "op"):
            a = _set(a, c, target, getattr(a, c)[src])
        return a
    if getattr(a, col) is None:
        return a  # a column this part does not have
    if value == "limit":
        value = {"microbatch": meta.microbatches, "chunk": meta.chunks}[col]
    return _set(a, col, row, value)


def _outcome(fn: object) -> tuple[str | None, int | None, str] | None:
    try:
        fn()  # type: ignore[operator]
    except SchemaError as err:
        assert "\n" not in str(err) and str(err).startswith(f"{SRC}: column ")
        return err.column, err.row, str(err)
    return None


@st.composite
def bad_parts(draw: st.DrawFn) -> tuple[RankArrays, RunMeta]:
    steps, mbs, chunks = draw(st.integers(1, 4)), draw(st.integers(2, 4)), draw(st.integers(1, 2))
    docs = draw(st.booleans())
    meta = RunMeta(schedule="1f1b", stages=2, microbatches=mbs, chunks=chunks)
    a = event_arrays(_rows(steps, mbs, chunks, docs), OPS, **KW)
    for _ in range(draw(st.integers(1, 3))):  # several bad cells: the first rule in order wins
        cell = draw(st.sampled_from(CELLS))
        a = _corrupt(a, meta, cell, draw(st.integers(0, len(a) - 1)))
    if draw(st.booleans()):
        col, value = draw(st.sampled_from(SCALARS))
        a = dataclasses.replace(a, **{col: value})
    return a, meta


@SETTINGS
@given(part=bad_parts())
def test_both_writers_refuse_the_same_bad_rows_with_the_same_error(part):
    a, meta = part
    fast = _outcome(lambda: check_rank_arrays(a, meta, SRC))
    frame = pd.DataFrame(event_columns(a))
    slow = _outcome(lambda: from_frame(frame, {"run-x": meta}, SRC))
    assert fast == slow


@SETTINGS
@given(steps=st.integers(1, 5), mbs=st.integers(1, 4), docs=st.booleans(),
       nan_at=st.integers(0, 10**6))
def test_good_parts_are_written_byte_for_byte_by_both_paths(steps, mbs, docs, nan_at,
                                                            tmp_path_factory):
    meta = RunMeta(schedule="1f1b", stages=2, microbatches=mbs, chunks=1)
    a = event_arrays(_rows(steps, mbs, 1, docs), OPS, **KW)
    if docs:  # a NaN tokens_sq is a null on both paths
        a = _set(a, "tokens_sq", nan_at % len(a), np.nan)
    out = tmp_path_factory.mktemp("w")
    write_rank_arrays(a, meta, out / "fast.parquet")
    slow = from_frame(pd.DataFrame(event_columns(a)), {"run-x": meta}, SRC)
    write_events(slow, out / "slow.parquet", validate=False)
    assert (out / "fast.parquet").read_bytes() == (out / "slow.parquet").read_bytes()
    back = read_events(out / "fast.parquet").frame
    assert ("tokens_sq" in back.columns) == docs and ("documents" in back.columns) == docs


def test_negative_tokens_are_refused_on_both_paths_naming_column_and_row(tmp_path: Path):
    meta = RunMeta(schedule="1f1b", stages=2, microbatches=2)
    a = _set(event_arrays(_rows(2, 2, 1, False), OPS, **KW), "tokens", 5, -1)
    message = f"{SRC}: column 'tokens', row 5: value -1 is below 0"
    with pytest.raises(SchemaError) as fast:
        write_rank_arrays(a, meta, tmp_path / SRC)
    with pytest.raises(SchemaError) as slow:
        from_frame(pd.DataFrame(event_columns(a)), {"run-x": meta}, SRC)
    assert str(fast.value).endswith(message) and str(slow.value) == message
    assert not list(tmp_path.iterdir())
    # unknown tokens are nulls, given as such (the recorder's -1 becomes a null mask)
    masked = dataclasses.replace(a, nulls={"tokens": a.tokens < 0})
    write_rank_arrays(masked, meta, tmp_path / "ok.parquet")
    tokens = read_events(tmp_path / "ok.parquet").frame["tokens"]
    assert tokens.isna().sum() == 1 and str(tokens.dtype) == "Int64"


def test_every_optional_rule_column_is_a_known_optional_column():
    columns = {r.column for r in ROW_RULES}
    assert {"layers", "tokens", "tokens_sq", "documents"} <= columns
    assert columns - {"layers", "tokens", "tokens_sq", "documents"} <= {
        "start_s", "duration_s", "step", "rank", "stage", "replica", "chunk", "microbatch"}
    assert all(c in OPTIONAL for c in ("layers", "tokens", "tokens_sq", "documents"))


def test_first_duplicate_is_the_later_row_of_the_earliest_pair():
    keys = [np.array([0, 1, 0, 2, 1, 0]), np.array([5, 5, 5, 5, 5, 5])]
    assert first_duplicate(keys) == 2
    assert first_duplicate([np.array([3, 1, 2])]) is None
    assert first_duplicate([np.array([2**62, 0, 2**62])]) == 2  # sparse keys: sorted


# -- the new optional columns: tokens_sq (float64) and documents (int32) ----------------------
def _built(**cols: list) -> pd.DataFrame:
    b = EventsBuilder().add_run("r", RunMeta(schedule="gpipe", stages=1, microbatches=3))
    for mb in range(3):
        b.add("r", step=0, rank=0, stage=0, op="F", start_s=float(mb), duration_s=1.0,
              microbatch=mb, **{c: v[mb] for c, v in cols.items()})
    return b.build("mem").frame


def test_tokens_sq_and_documents_round_trip_with_nulls(tmp_path: Path):
    frame = _built(tokens=[10, None, 30], tokens_sq=[50.0, None, 900.0],
                   documents=[2, None, 1])
    assert str(frame["documents"].dtype) == "Int32" and frame["tokens_sq"].dtype == "float64"
    full = _built(tokens_sq=[1.0, 4.0, 9.0], documents=[1, 1, 1])
    assert full["documents"].dtype == "int32"
    for name, f in (("nulls", frame), ("full", full)):
        path = tmp_path / f"{name}.parquet"
        write_events(from_frame(f, {"r": RunMeta(schedule="gpipe", microbatches=3)}), path)
        back = read_events(path).frame
        pd.testing.assert_series_equal(back["documents"], f["documents"])
        pd.testing.assert_series_equal(back["tokens_sq"], f["tokens_sq"])
        import pyarrow.parquet as pq

        schema = pq.read_schema(path)
        assert schema.field("tokens_sq").type == OPTIONAL["tokens_sq"]
        assert schema.field("documents").type == OPTIONAL["documents"]


@pytest.mark.parametrize(("col", "values", "problem"), [
    ("tokens_sq", [1.0, np.inf, 2.0], "row 1: value inf is not finite"),
    ("tokens_sq", [1.0, 2.0, -3.0], "row 2: value -3.0 is below 0"),
    ("documents", [1, -2, None], "row 1: value -2 is below 0"),
    ("documents", ["a", "b", "c"], "expected integer"),
    ("tokens_sq", ["a", "b", "c"], "expected float"),
])
def test_bad_tokens_sq_and_documents_are_refused(col: str, values: list, problem: str):
    with pytest.raises(SchemaError, match=f"column '{col}'") as err:
        _built(**{col: values})
    assert problem in str(err.value)


def test_a_fleet_group_without_the_columns_in_one_run_reads_them_as_nulls(tmp_path: Path):
    from bubblecast.telemetry.fleet_read import read_group

    meta = RunMeta(schedule="1f1b", stages=2, microbatches=2)
    dirs = []
    for run, docs in (("a", True), ("b", False)):
        a = dataclasses.replace(event_arrays(_rows(3, 2, 1, docs), OPS, **KW), run_id=run)
        d = tmp_path / f"run_id={run}"
        d.mkdir()
        write_rank_arrays(a, meta, d / "rank0001-000000.parquet")
        dirs.append(d)
    group = read_group(dirs, columns=["tokens", "tokens_sq", "documents"])
    assert group is not None
    f = group.frame
    one = pd.concat([read_events(d).frame for d in dirs], ignore_index=True)
    assert f["documents"].isna().sum() == one["documents"].isna().sum() > 0
    assert str(f["documents"].dtype) == "Int32"
    assert (f.loc[(f["run_id"] == "a") & (f["step"] == 0) & (f["microbatch"] == 1),
                  "tokens_sq"] == 101.0**2).all()
