"""Directory outputs open in every common reader as the data (SPEC's fleet layout).

pandas, ``pyarrow.dataset`` with hive partitioning, polars (``read_parquet`` and
``scan_parquet(hive_partitioning=True)``), duckdb (``read_parquet('DIR/**/*.parquet',
hive_partitioning=true)``) and dask read an events fleet as the rows the single-file output
holds, with the same types. What differs, by design (docs/spec-additions.md):

- the fleet holds every SPEC optional column; those its runs never fill are all null;
- ``run_id`` is the partition key, so each reader types it as it types hive keys: pandas and
  dask ``category`` (as the single file gives), pyarrow ``string`` and polars ``String`` where
  the single file's dictionary column gives ``dictionary<int8, string>`` and ``Categorical``;
  duckdb ``VARCHAR`` either way;
- pyarrow dictionary columns may differ in index width only (``int32`` in a fleet).

The helpers here are shared with ``tests/dataset/test_feature_readers.py``.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bubblecast.cli import main
from bubblecast.telemetry.fleet import fleet_runs, run_sidecar_dir
from bubblecast.telemetry.io import read_events, write_events
from bubblecast.telemetry.schema import OPTIONAL

SIM = ["simulate", "--schedule", "1f1b", "--stages", "2", "--microbatches", "4", "--steps",
       "30", "--runs", "4", "--scenario", "mixed", "--seed", "1"]
KEYS = ["run_id", "step", "rank", "chunk", "microbatch", "op", "start_s"]

Read = tuple[pd.DataFrame, dict[str, str]]


def _strings(frame: pd.DataFrame) -> pd.DataFrame:
    """String-like columns (categorical, Arrow or object strings) as plain object strings."""
    out = frame.copy()
    for col in out.columns:
        dtype = out[col].dtype
        if isinstance(dtype, pd.CategoricalDtype) or pd.api.types.is_string_dtype(dtype):
            out[col] = out[col].astype(object).where(out[col].notna(), None)
            out[col] = out[col].map(lambda v: None if v is None else str(v))
    return out


def read_pandas(path: Path, directory: bool) -> Read:
    frame = pd.read_parquet(path)
    return frame, {c: str(t) for c, t in frame.dtypes.items()}


def read_pyarrow(path: Path, directory: bool) -> Read:
    import pyarrow.dataset as ds

    table = ds.dataset(path, partitioning="hive" if directory else None).to_table()
    return table.to_pandas(), {f.name: str(f.type) for f in table.schema}


def read_polars(path: Path, directory: bool) -> Read:
    import polars as pl

    frame = pl.read_parquet(path)
    return frame.to_pandas(), {c: str(t) for c, t in frame.schema.items()}


def scan_polars(path: Path, directory: bool) -> Read:
    import polars as pl

    frame = pl.scan_parquet(path, hive_partitioning=True).collect()
    return frame.to_pandas(), {c: str(t) for c, t in frame.schema.items()}


def read_duckdb(path: Path, directory: bool) -> Read:
    import duckdb

    where = f"{path}/**/*.parquet" if directory else str(path)
    con = duckdb.connect()
    try:
        rel = con.sql(f"select * from read_parquet('{where}', hive_partitioning=true)")
        return rel.df(), {c: str(t) for c, t in zip(rel.columns, rel.types, strict=True)}
    finally:
        con.close()


def read_dask(path: Path, directory: bool) -> Read:
    import dask
    import dask.dataframe as dd

    with dask.config.set(scheduler="synchronous"):
        frame = dd.read_parquet(path).compute()
    return frame, {c: str(t) for c, t in frame.dtypes.items()}


READERS: dict[str, Callable[[Path, bool], Read]] = {
    "pandas": read_pandas, "pyarrow": read_pyarrow, "polars": read_polars,
    "polars-scan": scan_polars, "duckdb": read_duckdb, "dask": read_dask,
}
#: ``run_id``'s type where the single file has a dictionary column and the directory a hive
#: key: (single file, directory) per reader; readers not listed type both alike.
RUN_ID_TYPES: dict[str, tuple[str, str]] = {
    "pyarrow": ("dictionary<values=string, indices=int8, ordered=0>", "string"),
    "polars": ("Categorical", "String"), "polars-scan": ("Categorical", "String"),
}


def _same_type(reader: str, column: str, single: str, directory: str) -> bool:
    if column == "run_id" and reader in RUN_ID_TYPES:
        return (single, directory) == RUN_ID_TYPES[reader]
    if reader == "pyarrow" and single.startswith("dictionary<") and directory.startswith(
            "dictionary<"):  # index width only
        return single.split(", indices")[0] == directory.split(", indices")[0]
    return single == directory


def assert_same_data(reader: str, single: Path, directory: Path, keys: list[str],
                     padding: set[str]) -> None:
    """``reader`` gives the directory the single file's rows and types; the directory's extra
    columns are in ``padding`` and hold only nulls."""
    one, one_types = READERS[reader](single, False)
    many, many_types = READERS[reader](directory, True)
    extra = set(many.columns) - set(one.columns)
    assert extra <= padding, (reader, extra - padding)
    assert not set(one.columns) - set(many.columns), reader
    assert all(many[c].isna().all() for c in extra), reader
    wrong = {c: (one_types[c], many_types[c]) for c in one.columns
             if not _same_type(reader, c, one_types[c], many_types[c])}
    assert not wrong, (reader, wrong)
    left = _strings(one).sort_values(keys, kind="stable").reset_index(drop=True)
    right = _strings(many[list(one.columns)]).sort_values(keys, kind="stable").reset_index(
        drop=True)
    assert len(left) == len(right) > 0
    pd.testing.assert_frame_equal(left, right, check_dtype=False, check_exact=True)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, Path]:
    """Mixed-scenario runs as one file (``simulate --out FILE``), as the fleet simulate's
    events writer makes of them a run at a time (``simulate_fleet``, the numpy path), and
    written again from the file by ``write_events`` (the pandas path)."""
    from bubblecast.sim.simulator import SimConfig, simulate_fleet

    root = tmp_path_factory.mktemp("readers")
    assert main([*SIM, "--out", str(root / "one.parquet")]) == 0
    simulate_fleet(SimConfig(schedule="1f1b", stages=2, microbatches=4, steps=30, runs=4,
                             scenario="mixed", seed=1), str(root / "fleet") + "/")
    write_events(read_events(root / "one.parquet"), str(root / "again") + "/")
    return {"one": root / "one.parquet", "fleet": root / "fleet", "again": root / "again"}


@pytest.mark.parametrize("reader", sorted(READERS))
@pytest.mark.parametrize("which", ["fleet", "again"])
def test_every_reader_opens_a_fleet_as_the_single_file(outputs, reader, which):
    padding = {c for c in OPTIONAL}
    assert_same_data(reader, outputs["one"], outputs[which], KEYS, padding)


def test_the_fleet_holds_parquet_parts_only_in_one_schema(outputs):
    files = [p for p in outputs["fleet"].rglob("*") if p.is_file()]
    assert files and all(p.suffix == ".parquet" for p in files)
    schemas = {pq.read_schema(p).remove_metadata() for p in files}
    assert len(schemas) == 1
    schema = schemas.pop()
    assert "run_id" not in schema.names
    assert set(OPTIONAL) <= set(schema.names)
    # the mixed scenario gives some runs tokens and others none: the rest hold typed nulls
    tokens = [pq.read_table(p, columns=["tokens"]).column(0) for p in files]
    assert schema.field("tokens").type == pa.int64()
    assert {t.null_count == len(t) for t in tokens} == {True, False}


def test_bubblecast_reads_its_fleet_as_the_single_file(outputs):
    one = read_events(outputs["one"])
    for which in ("fleet", "again"):
        many = read_events(outputs[which])
        assert many.runs == one.runs
        left = one.frame.sort_values(KEYS[:-1]).reset_index(drop=True)
        right = many.frame.sort_values(KEYS[:-1]).reset_index(drop=True)
        assert list(right.columns) == list(left.columns)  # padding reads as absent
        pd.testing.assert_frame_equal(left, right, check_categorical=False)


def test_a_run_read_alone_has_only_its_own_columns(outputs):
    shapes = {}
    for run_id, run_dir in fleet_runs(outputs["fleet"]).items():
        shapes[run_id] = "tokens" in read_events(run_dir).frame.columns
    assert set(shapes.values()) == {True, False}


def test_sidecars_of_a_fleet_live_beside_it(outputs):
    from bubblecast.telemetry.fleet import sidecar_dir

    runs = fleet_runs(outputs["fleet"])
    sidecars = [run_sidecar_dir(d) for d in runs.values()]
    assert [s.name for s in sidecars] == [d.name for d in runs.values()]
    assert {s.parent for s in sidecars} == {outputs["fleet"].parent / "_fleet.sidecars"}
    assert sidecar_dir(str(outputs["fleet"]) + "/") == outputs["fleet"].parent / \
        "_fleet.sidecars"


def _legacy_fleet(root: Path, source: Path) -> Path:
    """A fleet in the layout before this one, written by hand: ``run_id`` inside each part
    (a dictionary column), only the run's own columns, device metrics inside the run."""
    events = read_events(source)
    for run_id, one in events.by_run():
        run_dir = root / f"run_id={run_id}"
        run_dir.mkdir(parents=True)
        frame = one.frame.dropna(axis=1, how="all")
        table = pa.Table.from_pandas(frame, preserve_index=False)
        meta = pq.read_schema(source).metadata
        pq.write_table(table.replace_schema_metadata(meta), run_dir / "part-00000.parquet")
        pq.write_table(pa.table({"run_id": [str(run_id)], "step": [0], "rank": pa.array(
            [0], pa.int32()), "metric": ["power_w"], "value": [1.0]}),
            run_dir / "part-00000.metrics")
    return root


def test_a_fleet_of_the_previous_layout_is_still_read(outputs, tmp_path):
    legacy = _legacy_fleet(tmp_path / "old", outputs["one"])
    assert "run_id" in pq.read_schema(next(legacy.rglob("*.parquet"))).names
    one, old = read_events(outputs["one"]), read_events(legacy)
    assert old.runs == one.runs
    pd.testing.assert_frame_equal(
        one.frame.sort_values(KEYS[:-1]).reset_index(drop=True),
        old.frame.sort_values(KEYS[:-1]).reset_index(drop=True), check_categorical=False)


def test_a_run_is_not_appended_to_a_fleet_of_the_previous_layout(outputs, tmp_path, capsys):
    legacy = _legacy_fleet(tmp_path / "old", outputs["one"])
    before = sorted(p.name for p in legacy.iterdir())
    code = main([*SIM[:-4], "--runs", "1", "--seed", "9", "--run-id", "late", "--out",
                 str(legacy) + "/"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("bubblecast: error:") and "layout before" in err
    assert sorted(p.name for p in legacy.iterdir()) == before


def test_a_run_with_a_column_the_fleet_lacks_is_refused(outputs, tmp_path):
    from bubblecast.errors import BubblecastError

    fleet = tmp_path / "f"
    shutil.copytree(outputs["fleet"], fleet)
    events = read_events(outputs["one"])
    one = next(e for _, e in events.by_run())
    frame = one.frame.assign(run_id=pd.Categorical(["late"] * len(one.frame)), my_extra=1.0)
    from bubblecast.telemetry.events import Events

    late = Events(frame, {"late": next(iter(one.runs.values()))})
    with pytest.raises(BubblecastError, match="column 'my_extra' is not in the fleet's schema"):
        write_events(late, str(fleet) + "/")
    assert sorted(fleet_runs(fleet)) == sorted(fleet_runs(outputs["fleet"]))


def test_a_run_lacking_a_fleet_extra_column_gets_typed_nulls(tmp_path, outputs):
    from bubblecast.telemetry.events import Events

    events = read_events(outputs["one"])
    (_, first), (_, second) = list(events.by_run())[:2]
    fleet = str(tmp_path / "x") + "/"
    write_events(Events(first.frame.assign(my_extra=2.5), first.runs), fleet)
    write_events(second, fleet)
    schemas = {pq.read_schema(p).remove_metadata() for p in Path(fleet).rglob("*.parquet")}
    assert len(schemas) == 1 and schemas.pop().field("my_extra").type == pa.float64()
    back = read_events(fleet).frame
    assert back.groupby("run_id", observed=True)["my_extra"].apply(
        lambda s: bool(s.isna().all())).tolist() == [False, True]


@pytest.fixture(scope="module")
def quoted(outputs, tmp_path_factory) -> dict[str, Path]:
    """Runs whose ids need URL-quoting as directory names, with a ``host`` string column,
    as one file and as a fleet (the pandas writer)."""
    from bubblecast.telemetry.events import Events

    root = tmp_path_factory.mktemp("quoted")
    events = read_events(outputs["one"])
    names = dict(zip(sorted(events.runs), ["a b/c", "x%y", "é-1", "run=4"], strict=True))
    frame = events.frame.assign(
        run_id=events.frame["run_id"].astype(str).map(names).astype("category"),
        host=events.frame["rank"].map(lambda r: f"node{r // 2}").astype("category"))
    quoted = Events(frame, {names[k]: v for k, v in events.runs.items()})
    write_events(quoted, root / "one.parquet")
    write_events(quoted, str(root / "fleet") + "/")
    return {"one": root / "one.parquet", "fleet": root / "fleet"}


@pytest.fixture(scope="module")
def documents(tmp_path_factory) -> dict[str, Path]:
    """Packed-document runs (``tokens``, ``tokens_sq``, ``documents`` filled) as one file and
    as a fleet written a run at a time."""
    from bubblecast.sim.simulator import SimConfig, simulate_fleet, write_simulation

    root = tmp_path_factory.mktemp("documents")
    config = SimConfig(schedule="1f1b", stages=2, microbatches=4, steps=6, runs=2, replicas=2,
                       documents="lognormal", seed=4)
    write_simulation(config, str(root / "one.parquet"))
    simulate_fleet(config, str(root / "fleet") + "/")
    return {"one": root / "one.parquet", "fleet": root / "fleet"}


@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_reader_opens_a_fleet_of_packed_document_runs(documents, reader):
    part = next(documents["fleet"].rglob("*.parquet"))
    assert pq.read_table(part, columns=["tokens_sq"]).column(0).null_count == 0
    assert_same_data(reader, documents["one"], documents["fleet"], KEYS, set(OPTIONAL))


@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_reader_decodes_quoted_run_ids(quoted, reader):
    assert sorted(fleet_runs(quoted["fleet"])) == ["a b/c", "run=4", "x%y", "é-1"]
    assert_same_data(reader, quoted["one"], quoted["fleet"], KEYS, set(OPTIONAL))
