"""Events of any runs written from numpy columns (``EventArrays``, what ``simulate`` writes)
without pandas: the same bytes as the DataFrame path for good tables, the same error (column,
row, message) for bad ones, and no file left behind."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bubblecast.errors import BubblecastError
from bubblecast.telemetry.events import Events
from bubblecast.telemetry.fastwrite import EventArrays, Periodic, code_dtype, write_event_arrays
from bubblecast.telemetry.io import write_events
from bubblecast.telemetry.schema import OPS, RunMeta
from bubblecast.telemetry.validate import SchemaError, normalize_frame


def _arrays(runs: int = 2, steps: int = 3, *, tokens: bool = True, extra: bool = True
            ) -> EventArrays:
    """``runs`` runs of 2 stages x 2 micro-batches (F, B, W each) plus an OPTIMIZER op per
    rank and step; run ``k`` has ``k + 2`` stages in its metadata; nullable tokens and
    documents, a NaN tokens_sq (a null), speed and an extra float column."""
    rows = []
    for k in range(runs):
        for s in range(steps):
            t = 0.0
            for stage in range(2):
                for mb in range(2):
                    for code in (0, 1, 2):
                        rows.append((k, s, stage, mb, code, t, 0.001 * (1 + mb + code)))
                        t += 0.002
                rows.append((k, s, stage, -1, OPS.index("OPTIMIZER"), t, 0.0005))
    cols = np.array(rows, dtype=np.float64).T
    n = cols.shape[1]
    columns = {
        "run_id": cols[0].astype(code_dtype(runs)), "step": cols[1].astype(np.int64),
        "rank": cols[2].astype(np.int32), "stage": cols[2].astype(np.int32),
        "replica": np.zeros(n, np.int32), "chunk": np.zeros(n, np.int32),
        "microbatch": cols[3].astype(np.int32), "op": cols[4].astype(np.int8),
        "start_s": cols[5], "duration_s": cols[6], "layers": np.full(n, 3, np.int32),
    }
    nulls = {}
    if tokens:
        columns["tokens"] = np.arange(n, dtype=np.int64) * 7
        columns["tokens_sq"] = np.where(np.arange(n) % 5 == 1, np.nan, np.arange(n) * 49.0)
        columns["documents"] = (np.arange(n) % 4).astype(np.int32)
        nulls = {"tokens": np.arange(n) % 3 == 0, "documents": np.zeros(n, bool)}
    columns["speed"] = np.linspace(1.0, 1.5, n)
    if extra:
        columns["mine"] = np.arange(n, dtype=np.float32)
    metas = {f"r{k}": RunMeta(schedule="1f1b", stages=k + 2, microbatches=2,
                              extra={"k": k}) for k in range(runs)}
    return EventArrays(columns, metas, nulls)


def _events(a: EventArrays) -> Events:
    return Events(normalize_frame(a.to_frame()), dict(a.runs))


@pytest.mark.parametrize(("runs", "tokens", "extra"), [(1, False, False), (2, True, True),
                                                       (130, True, False)])
def test_the_same_bytes_as_write_events(tmp_path: Path, runs, tokens, extra):
    """130 runs: run codes past int8 (pandas stores them as int16, part of the schema)."""
    a = _arrays(runs, tokens=tokens, extra=extra)
    write_event_arrays(a, tmp_path / "fast.parquet")
    write_events(_events(a), tmp_path / "frame.parquet")
    assert (tmp_path / "fast.parquet").read_bytes() == (tmp_path / "frame.parquet").read_bytes()


def test_a_fleet_directory_gets_the_same_run(tmp_path: Path):
    a = _arrays(1)
    write_event_arrays(a, f"{tmp_path / 'fast'}/")
    write_events(_events(a), f"{tmp_path / 'frame'}/")
    part = Path("run_id=r0") / "part-00000.parquet"
    assert (tmp_path / "fast" / part).read_bytes() == (tmp_path / "frame" / part).read_bytes()
    assert sorted(p.name for p in (tmp_path / "fast").rglob("*")) == sorted(
        p.name for p in (tmp_path / "frame").rglob("*"))
    with pytest.raises(BubblecastError, match="already in the fleet"):
        write_event_arrays(a, f"{tmp_path / 'fast'}/")
    with pytest.raises(BubblecastError, match="one run"):  # a fleet is written run by run
        write_event_arrays(_arrays(2), f"{tmp_path / 'two'}/")


def test_to_frame_holds_the_columns_as_a_frame_would():
    a = _arrays(2)
    frame = a.to_frame()
    assert list(frame.columns) == list(a.columns)
    assert list(frame["run_id"].cat.categories) == ["r0", "r1"]
    assert list(frame["op"].cat.categories) == list(OPS)
    assert str(frame["tokens"].dtype) == "Int64" and str(frame["documents"].dtype) == "Int32"
    assert frame["tokens"].isna().sum() == a.nulls["tokens"].sum()
    assert np.shares_memory(frame["start_s"].to_numpy(), a.columns["start_s"])


def _set(a: EventArrays, col: str, row: int, value: object) -> EventArrays:
    values = a.columns[col].copy()
    values[row] = value
    return dataclasses.replace(a, columns={**a.columns, col: values})


def _duplicate(a: EventArrays) -> EventArrays:
    """Row 10 (a compute op of run 0, step 0) made a copy of row 3."""
    for col in ("run_id", "step", "rank", "chunk", "microbatch", "op"):
        a = _set(a, col, 10, a.columns[col][3])
    return a


#: Bad tables: (change, ) applied to a good one.
BAD = {
    "nan start": lambda a: _set(a, "start_s", 7, np.nan),
    "inf duration": lambda a: _set(a, "duration_s", 4, np.inf),
    "negative duration": lambda a: _set(a, "duration_s", 9, -0.5),
    "negative step": lambda a: _set(a, "step", 2, -1),
    "microbatch -2": lambda a: _set(a, "microbatch", 5, -2),
    "microbatch at its run's limit": lambda a: _set(a, "microbatch", 6, 2),
    "stage 2 in run 0 (2 stages)": lambda a: _set(a, "stage", 3, 2),
    "negative layers": lambda a: _set(a, "layers", 1, -1),
    "negative tokens": lambda a: _set(a, "tokens", 4, -3),
    "infinite tokens_sq": lambda a: _set(a, "tokens_sq", 8, np.inf),
    "negative documents": lambda a: _set(a, "documents", 12, -1),
    "duplicate compute op": _duplicate,
    "two problems: the first rule wins": lambda a: _set(_duplicate(a), "layers", 30, -1),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_rows_are_refused_as_write_events_refuses_them(tmp_path: Path, case):
    a = BAD[case](_arrays(2))
    errors = []
    for name, write in (("fast", lambda p: write_event_arrays(a, p)),
                        ("frame", lambda p: write_events(_events(a), p))):
        path = tmp_path / f"{name}.parquet"
        with pytest.raises(SchemaError) as info:
            write(path)
        errors.append((info.value.column, info.value.row,
                       str(info.value).replace(str(path), "X")))
        assert not list(tmp_path.iterdir())  # no file, no temporary
    assert errors[0] == errors[1]


def test_a_null_row_is_not_checked(tmp_path: Path):
    a = _set(_arrays(2), "tokens", 3, -5)  # row 3 is null: its value is ignored
    assert a.nulls["tokens"][3]
    write_event_arrays(a, tmp_path / "e.parquet")


@pytest.mark.parametrize(("change", "column", "problem"), [
    (lambda c: c.pop("op"), "op", "missing required column"),
    (lambda c: c.update(step=c["step"].astype(np.int32)), "step", "expected int64"),
    (lambda c: c.update(layers=c["layers"][:-1]), "layers", "rows"),
    (lambda c: c.update(op=np.where(np.arange(len(c["op"])) == 4, 11, c["op"])
                        .astype(np.int8)), "op", "code 11"),
    (lambda c: c.update(run_id=np.where(np.arange(len(c["op"])) == 6, 2, c["run_id"])
                        .astype(np.int8)), "run_id", "code 2"),
])
def test_bad_columns_are_refused_before_writing(tmp_path: Path, change, column, problem):
    a = _arrays(2)
    columns = dict(a.columns)
    change(columns)
    with pytest.raises(SchemaError, match=problem) as info:
        write_event_arrays(dataclasses.replace(a, columns=columns), tmp_path / "e.parquet")
    assert info.value.column == column
    assert not list(tmp_path.iterdir())


def test_writing_arrays_imports_no_pandas(tmp_path: Path):
    """The writer, its checks and the telemetry package load pandas only to raise an error."""
    code = ("import sys, numpy as np\n"
            "from bubblecast.telemetry.fastwrite import EventArrays, write_event_arrays\n"
            "from bubblecast.telemetry.schema import RunMeta\n"
            "n = 6\n"
            "cols = {'run_id': np.zeros(n, np.int8), 'step': np.arange(n, dtype=np.int64),\n"
            "        **{c: np.zeros(n, np.int32) for c in ('rank', 'stage', 'replica',\n"
            "                                              'chunk')},\n"
            "        'microbatch': np.arange(n, dtype=np.int32) % 3,\n"
            "        'op': (np.arange(n) // 3).astype(np.int8), 'start_s': np.zeros(n),\n"
            "        'duration_s': np.ones(n)}\n"
            "write_event_arrays(EventArrays(cols, {'r': RunMeta(microbatches=3)}), sys.argv[1])\n"
            "assert 'pandas' not in sys.modules, 'pandas loaded'\n"
            "from bubblecast.telemetry import read_events\n"
            "assert len(read_events(sys.argv[1])) == n\n")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "e.parquet")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


# -- periodic columns (a simulation's rows repeat every step) -----------------------------------
def _blocks(steps: int, per_step: int = 12, runs: int = 1, *, periodic: bool = True
            ) -> EventArrays:
    """``steps`` steps of ``per_step`` ops (2 stages, micro-batches, F/B/W, an OPTIMIZER op
    per stage) per run; rank ... op periodic (one step), step and speed arrays."""
    ops = [(stage, mb, code) for stage in range(2) for mb in range((per_step - 2) // 6)
           for code in (0, 1, 2)] + [(0, -1, 7), (1, -1, 7)]
    top = len(ops) + 1  # more W ops to fill a step, micro-batches above the others
    ops += [(1, top + i, 2) for i in range(per_step - len(ops))]
    stage, mb, code = (np.array(x) for x in zip(*ops[:per_step], strict=True))
    n = runs * steps * per_step

    def col(pattern: np.ndarray, dtype: type) -> object:
        pattern = pattern.astype(dtype)
        return Periodic(pattern, n) if periodic else np.tile(pattern, n // len(pattern))

    columns = {
        "run_id": np.repeat(np.arange(runs), steps * per_step).astype(code_dtype(runs)),
        "step": np.tile(np.repeat(np.arange(steps, dtype=np.int64), per_step), runs),
        "rank": col(stage, np.int32), "stage": col(stage, np.int32),
        "replica": col(np.zeros(per_step), np.int32), "chunk": col(np.zeros(per_step), np.int32),
        "microbatch": col(mb, np.int32), "op": col(code, np.int8),
        "start_s": np.linspace(0.0, 1.0, n), "duration_s": np.full(n, 0.001),
        "layers": col(stage + 2, np.int32), "speed": col(1.0 + stage / 4, np.float64),
    }
    metas = {f"r{k}": RunMeta(stages=2, microbatches=2 * per_step + 2) for k in range(runs)}
    return EventArrays(columns, metas)


def _materialized(a: EventArrays) -> EventArrays:
    return dataclasses.replace(a, columns={c: v.full() if isinstance(v, Periodic) else v
                                           for c, v in a.columns.items()})


@pytest.mark.parametrize(("steps", "per_step", "runs"), [
    (3, 12, 1), (7000, 12, 1), (1, 70_000, 1), (2, 70_002, 1), (88_000, 12, 1), (5, 12, 2),
])
def test_periodic_columns_write_the_bytes_of_whole_ones(tmp_path: Path, steps, per_step, runs):
    """Chunks of a write batch over one buffer: one row group or two (1Mi rows), a period
    longer than a batch, several runs."""
    a = _blocks(steps, per_step, runs)
    write_event_arrays(a, tmp_path / "periodic.parquet")
    write_event_arrays(_materialized(a), tmp_path / "whole.parquet")
    assert (tmp_path / "periodic.parquet").read_bytes() == \
        (tmp_path / "whole.parquet").read_bytes()
    frame = a.to_frame()
    assert len(frame) == len(a) and frame["stage"].dtype == np.int32


def _set_pattern(a: EventArrays, col: str, i: int, value: object) -> EventArrays:
    pattern = a.columns[col].pattern.copy()
    pattern[i] = value
    return dataclasses.replace(a, columns={**a.columns, col: Periodic(pattern, len(a))})


PERIODIC_BAD = {
    "negative chunk": lambda a: _set_pattern(a, "chunk", 4, -1),
    "stage at the limit": lambda a: _set_pattern(a, "stage", 5, 2),
    "duplicate within a step": lambda a: _set_pattern(
        _set_pattern(a, "microbatch", 3, 0), "stage", 3, 0),
    "two steps numbered alike": lambda a: dataclasses.replace(a, columns={
        **a.columns, "step": np.where(a.columns["step"] == 3, 1, a.columns["step"])}),
    "a step split across blocks": lambda a: _set(a, "step", 13, 0),  # the general check
    "nan speed": lambda a: _set_pattern(a, "speed", 2, np.nan),  # a null: fine
}


@pytest.mark.parametrize("case", list(PERIODIC_BAD))
@pytest.mark.parametrize("runs", [1, 2])
def test_periodic_columns_are_checked_as_whole_ones(tmp_path: Path, case, runs):
    a = PERIODIC_BAD[case](_blocks(6, 12, runs))
    outcomes = []
    for name, arrays in (("periodic", a), ("whole", _materialized(a))):
        path = tmp_path / f"{name}.parquet"
        try:
            write_event_arrays(arrays, path)
            outcomes.append(("written", path.read_bytes()))
        except SchemaError as err:
            outcomes.append((err.column, err.row, str(err).replace(str(path), "X")))
    assert outcomes[0] == outcomes[1]
    path = tmp_path / "frame.parquet"
    try:
        write_events(_events(_materialized(a)), path)
        assert outcomes[0] == ("written", path.read_bytes())
    except SchemaError as err:
        assert outcomes[0] == (err.column, err.row, str(err).replace(str(path), "X"))
