"""Every SPEC §1 corruption is refused with the right message, whole, naming the row."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bubblecast.telemetry import SchemaError, from_frame, read_events, write_events
from bubblecast.telemetry.events import Events
from tests.telemetry.strategies import valid_events

SETTINGS = settings(max_examples=30, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def _corrupt(frame: pd.DataFrame, runs: dict, kind: str, row: int) -> tuple[pd.DataFrame, str, str]:
    """Apply one corruption at ``row``; return the frame, the column and a message fragment."""
    f = frame.copy()
    if kind == "missing":
        return f.drop(columns=["duration_s"]), "duration_s", "missing required column"
    if kind == "mistyped":
        f["step"] = f["step"].astype(str)
        return f, "step", "expected integer"
    if kind == "nan":
        f.loc[row, "start_s"] = np.nan
        return f, "start_s", "not finite"
    if kind == "negative":
        f.loc[row, "duration_s"] = -1.0
        return f, "duration_s", "negative duration"
    if kind == "unknown_op":
        f.loc[row, "op"] = "FWD"
        return f, "op", "unknown op 'FWD'"
    if kind == "stage_range":
        f.loc[row, "stage"] = runs["r0"].stages
        return f, "stage", "out of range"
    if kind == "microbatch_range":
        f.loc[row, "microbatch"] = runs["r0"].microbatches
        return f, "microbatch", "out of range"
    if kind == "microbatch_low":
        f.loc[row, "microbatch"] = -2
        return f, "microbatch", "below -1"
    if kind == "duplicate":
        compute = f.index[f["op"].isin(["F", "B"])]
        src = compute[0]
        dup = f.loc[[src]].copy()
        f = pd.concat([f.iloc[:row], dup, f.iloc[row:]], ignore_index=True)
        return f, "op", "duplicate compute op"
    raise AssertionError(kind)


KINDS = ["missing", "mistyped", "nan", "negative", "unknown_op", "stage_range",
         "microbatch_range", "microbatch_low", "duplicate"]


@SETTINGS
@given(data=valid_events(), kind=st.sampled_from(KINDS), pick=st.integers(0, 10**6))
def test_every_corruption_is_refused_with_its_column_and_row(data, kind, pick, tmp_path_factory):
    frame, runs = data
    row = pick % len(frame)
    if kind == "duplicate":
        row = max(row, 1)  # the copy must come after its original
    bad, column, fragment = _corrupt(frame, runs, kind, row)
    with pytest.raises(SchemaError) as info:
        from_frame(bad, runs, source="bad.parquet")
    err = info.value
    assert err.column == column
    assert fragment in str(err)
    assert str(err).startswith("bad.parquet: column ")
    assert "\n" not in str(err)
    if kind not in ("missing", "mistyped"):
        assert err.row == row
    # A refused write leaves no file behind.
    out = tmp_path_factory.mktemp("w") / "events.parquet"
    with pytest.raises(SchemaError):
        write_events(Events(bad, dict(runs)), out)
    assert not out.exists()
    assert list(out.parent.iterdir()) == []


@SETTINGS
@given(data=valid_events())
def test_valid_tables_round_trip_through_parquet(data, tmp_path_factory):
    frame, runs = data
    events = from_frame(frame, runs)
    path = tmp_path_factory.mktemp("rt") / "e.parquet"
    write_events(events, path)
    back = read_events(path)
    assert back.runs == events.runs
    pd.testing.assert_frame_equal(back.frame, events.frame, check_categorical=False)


def test_first_offending_row_is_reported_when_several_rows_are_bad():
    frame, runs = _simple()
    frame.loc[[3, 5], "duration_s"] = -0.5
    with pytest.raises(SchemaError) as info:
        from_frame(frame, runs)
    assert info.value.row == 3


def test_rows_of_runs_without_metadata_get_inferred_metadata():
    frame, _ = _simple()
    events = from_frame(frame, {})
    assert events.runs["r0"].source == "inferred"
    assert events.runs["r0"].stages == 2


def _simple():
    from bubblecast.telemetry.schema import RunMeta

    rows = [("r0", 0, s, s, 0, 0, mb, op, 0.1 * i, 0.05)
            for s in range(2) for i, (mb, op) in enumerate([(0, "F"), (1, "F"), (0, "B"),
                                                             (1, "B")])]
    frame = pd.DataFrame(rows, columns=["run_id", "step", "rank", "stage", "replica", "chunk",
                                        "microbatch", "op", "start_s", "duration_s"])
    return frame, {"r0": RunMeta(schedule="gpipe", stages=2, microbatches=2)}


@pytest.mark.parametrize("step_scale", [1, 10**9, 2**60])
def test_duplicates_are_found_whatever_the_key_range(step_scale):
    """Dense keys are counted, sparse ones sorted, and keys over 63 bits lexsorted: all three
    report the later row of the first duplicate pair."""
    frame, runs = _simple()
    frame["step"] = frame["step"] + step_scale * (np.arange(len(frame)) % 3)
    frame["rank"] = frame["rank"] * (2**20 if step_scale == 2**60 else 1)
    runs["r0"].stages = 2
    assert len(from_frame(frame, dict(runs))) == len(frame)  # distinct keys: valid
    bad = pd.concat([frame.iloc[:6], frame.iloc[[2]], frame.iloc[6:], frame.iloc[[1]]],
                    ignore_index=True)
    with pytest.raises(SchemaError, match="duplicate compute op") as info:
        from_frame(bad, dict(runs))
    assert info.value.row == 6


def test_large_integers_that_do_not_fit_int32_are_refused():
    frame, runs = _simple()
    frame["rank"] = frame["rank"].astype("int64")
    frame.loc[5, "rank"] = 2**31
    with pytest.raises(SchemaError, match="does not fit int32") as info:
        from_frame(frame, runs)
    assert info.value.row == 5
