"""Wrongly typed inputs of the per-step series are user errors (exit 2, one line), not
internal errors: string ``speed``/``wait_s`` columns, and per-layer costs that are not
numbers in the run metadata (before: ``ValueError`` -> exit 1 "internal error")."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bubblecast.cli import main


@pytest.fixture(scope="module")
def events_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from bubblecast.telemetry import write_events
    from tests.dataset.synth import make_events

    out = tmp_path_factory.mktemp("series") / "synth.parquet"
    return write_events(make_events(runs=1, steps=70, stages=2), out)


def _one_line(capsys: pytest.CaptureFixture, code: int) -> str:
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("bubblecast: error:"), err
    return err


@pytest.mark.parametrize("column", ["speed", "wait_s"])
def test_string_column_exits_2_naming_file_and_column(events_file: Path, column: str,
                                                      tmp_path: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    table = pq.read_table(events_file)
    if column in table.schema.names:
        table = table.drop([column])
    table = table.append_column(column, pa.array(["fast"] * table.num_rows))
    bad = tmp_path / "bad.parquet"
    pq.write_table(table.replace_schema_metadata(pq.read_schema(events_file).metadata), bad)
    capsys.readouterr()
    err = _one_line(capsys, main(["dataset", str(bad), "--horizons", "1",
                                  "--out", str(tmp_path / "f.parquet")]))
    assert str(bad) in err and f"'{column}'" in err
    assert not (tmp_path / "f.parquet").exists()


def test_layer_costs_that_are_not_numbers_exit_2(events_file: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture) -> None:
    from bubblecast.telemetry import read_events, write_events
    from bubblecast.telemetry.events import Events

    ev = read_events(events_file)
    runs = {k: dataclasses.replace(m, extra={**m.extra, "workload": None,
                                             "layer_costs": [1.0, "x", 2.0]})
            for k, m in ev.runs.items()}
    bad = write_events(Events(ev.frame, runs), tmp_path / "bad.parquet")
    capsys.readouterr()
    err = _one_line(capsys, main(["dataset", str(bad), "--horizons", "1",
                                  "--out", str(tmp_path / "f.parquet")]))
    assert "run 'run0': run metadata 'layer_costs': expected a list of numbers, got str" in err
