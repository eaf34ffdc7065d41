"""Parquet I/O: directories, metadata, refusing non-events files, atomic writes."""

from __future__ import annotations

import json
from pathlib import Path

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


@pytest.mark.parametrize(("write_fails", "check_fails", "raised"), [
    (False, True, ValueError), (True, False, RuntimeError), (True, True, ValueError),
])
def test_a_check_alongside_the_write_keeps_the_old_file_when_either_fails(
        tmp_path, write_fails, check_fails, raised):
    target = tmp_path / "out.bin"
    target.write_text("old")

    def write(tmp: str) -> None:
        with open(tmp, "w") as fh:
            fh.write("new")
        if write_fails:
            raise RuntimeError("disk full")

    def check() -> None:
        if check_fails:
            raise ValueError("bad row")

    with pytest.raises(raised):
        atomic_write(target, write, alongside=check)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]
    atomic_write(target, lambda tmp: Path(tmp).write_text("new"), alongside=lambda: None)
    assert target.read_text() == "new"


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


def test_concat_orders_runs_by_name_whatever_the_file_order():
    """Run order (and so features files and their fingerprints) does not depend on the order
    the files are given in, as before run_id was joined as categoricals."""
    from bubblecast.telemetry.events import Events

    for parts in ([_events("zeta"), _events("alpha")], [_events("alpha"), _events("zeta")]):
        joined = Events.concat(parts).frame["run_id"]
        assert list(joined.cat.categories) == ["alpha", "zeta"]
    assert list(joined.astype(str)) == ["alpha"] * (len(joined) // 2) + ["zeta"] * (
        len(joined) // 2)


def _simulated(tmp_path, name="e.parquet"):
    from bubblecast.sim.simulator import SimConfig, simulate_events

    config = SimConfig(schedule="1f1b", stages=4, microbatches=8, steps=50, scenario="jitter")
    return write_events(simulate_events(config), tmp_path / name)


def test_events_keep_their_types_and_dictionary_columns_in_parquet(tmp_path):
    path = _simulated(tmp_path)
    schema = pq.read_schema(path)
    assert pa.types.is_dictionary(schema.field("op").type)
    assert pa.types.is_dictionary(schema.field("run_id").type)
    assert schema.field("rank").type == pa.int32() and schema.field("step").type == pa.int64()
    assert schema.field("speed").type == pa.float64()
    column = pq.read_metadata(path).row_group(0).column(schema.names.index("op"))
    assert column.has_dictionary_page and column.compression == "LZ4"
    back = read_events(path)
    assert isinstance(back.frame["op"].dtype, pd.CategoricalDtype)
    assert set(back.frame["op"].unique()) == {"F", "B"}


def _corrupt_page(path, column: str = "start_s") -> None:
    """Flip 64 bytes in the middle of ``column``'s first data page."""
    meta = pq.read_metadata(path)
    chunk = meta.row_group(0).column(meta.schema.names.index(column))
    data = bytearray(path.read_bytes())
    middle = chunk.data_page_offset + chunk.total_compressed_size // 2
    for i in range(middle, middle + 64):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_corrupted_page_is_an_error_naming_the_file(tmp_path, capsys):
    from bubblecast.cli import main

    path = _simulated(tmp_path)
    before = pq.read_table(path).column("start_s").to_numpy()
    _corrupt_page(path)
    # Without verification the damage reads back as different numbers, silently...
    after = pq.read_table(path).column("start_s").to_numpy()
    assert (before != after).any()
    # ...with it (read_events verifies the page checksums written) it is refused.
    with pytest.raises(BubblecastError, match=r"e\.parquet: corrupted Parquet file \(page "
                                              r"checksum mismatch"):
        read_events(path)
    capsys.readouterr()
    assert main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bubblecast: error: ") and str(path) in err
    assert err.count("\n") == 1


def test_stale_temporaries_of_killed_writers_are_removed_on_the_next_write(tmp_path):
    import fcntl
    import os

    from bubblecast.telemetry.io import process_start_time, remove_stale_temporaries

    old = process_start_time() - 60
    stale = tmp_path / ".e.parquet.k1ll3d_x.tmp"  # what atomic_write leaves when killed
    live = tmp_path / ".e.parquet.w0rk1ng_.tmp"  # another writer's, newer than this process
    keep = [tmp_path / ".e.parquet.notes", tmp_path / "e.parquet.k1ll3d_x.tmp",
            tmp_path / ".other.parquet.k1ll3d_x.tmp", tmp_path / ".e.parquet.toolong12.tmp.tmp"]
    stale_dir = tmp_path / ".e.parquet.k1ll3d_d"
    stale_dir.mkdir()
    (stale_dir / "part-0.parquet").write_text("x")
    locked = tmp_path / ".e.parquet.l0ck3d__.tmp"  # old, but its writer is alive
    for f in [stale, live, locked, *keep]:
        f.write_text("x" * 100)
    for f in [stale, locked, *keep, stale_dir]:
        os.utime(f, (old, old))
    with open(locked) as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        _simulated(tmp_path)
        assert locked.exists()
    os.unlink(locked)
    assert not stale.exists()
    assert live.exists() and all(f.exists() for f in keep)
    assert stale_dir.exists()  # directories only when asked for (they may hold telemetry)
    assert remove_stale_temporaries(tmp_path / "e.parquet", dirs=True) == [stale_dir]
    assert not stale_dir.exists() and live.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["e.parquet", live.name, *(f.name for f in keep)])


def _mistyped(tmp_path, column: str, name: str = "bad.parquet"):
    """A simulated events file whose ``column`` holds strings."""
    path = _simulated(tmp_path, "good.parquet")
    table = pq.read_table(path)
    if column not in table.column_names:  # wait_s: a Kineto importer column
        table = table.append_column(column, pa.array(["0.001"] * table.num_rows))
    else:
        values = table.column(column).to_pandas().astype(str)
        table = table.set_column(table.column_names.index(column), column, pa.array(values))
    out = tmp_path / name
    pq.write_table(table, out)
    return out


@pytest.mark.parametrize("column", ["speed", "wait_s", "duration_s", "step", "layers"])
def test_a_string_column_is_a_schema_error_naming_it(tmp_path, column):
    from bubblecast.telemetry import SchemaError

    with pytest.raises(SchemaError, match=rf"bad\.parquet: column '{column}': expected"):
        read_events(_mistyped(tmp_path, column))


@pytest.mark.parametrize("command", [["inspect"], ["whatif"], ["dataset", "--out", "{out}"],
                                     ["policy-eval"]])
def test_every_command_exits_2_on_a_string_speed_column(tmp_path, capsys, command):
    from bubblecast.cli import main

    path = _mistyped(tmp_path, "speed")
    argv = [command[0], str(path)] + [a.format(out=tmp_path / "f.parquet") for a in command[1:]]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "column 'speed': expected float" in err and err.count("\n") == 1


def test_a_numeric_device_column_is_kept_as_a_number(tmp_path):
    b = EventsBuilder()
    b.add("r", step=0, rank=0, stage=0, op="F", microbatch=0, start_s=0.0, duration_s=1.0,
          device=3, host="node-1")
    back = read_events(write_events(b.build(), tmp_path / "d.parquet"))
    assert back.frame["device"].tolist() == [3] and back.frame["host"].tolist() == ["node-1"]


def test_a_killed_writer_leaves_a_temporary_that_the_next_command_removes(tmp_path):
    """SIGKILL in the middle of a write, then ``simulate`` to the same path at once."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "e.parquet"
    hang = ("import sys, time; from bubblecast.telemetry.io import atomic_write; "
            "atomic_write(sys.argv[1], lambda tmp: (open(tmp, 'w').write('half'), "
            "time.sleep(120)))")
    proc = subprocess.Popen([sys.executable, "-c", hang, str(out)])
    deadline = time.monotonic() + 60
    while not any(p.suffix == ".tmp" for p in tmp_path.iterdir()) and proc.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert [p.suffix for p in tmp_path.iterdir()] == [".tmp"]
    subprocess.run([sys.executable, "-c", "from bubblecast.cli import main; main()", "simulate",
                    "--schedule", "1f1b", "--stages", "2", "--microbatches", "2", "--out",
                    str(out)], check=True, stdout=subprocess.DEVNULL)
    assert [p.name for p in tmp_path.iterdir()] == ["e.parquet"]
