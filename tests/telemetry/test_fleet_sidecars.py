"""A fleet written by ``simulate --out DIR/`` keeps its device metrics beside it, in
``_DIR.sidecars/``: every reader opens the fleet as the data, and bubblecast still finds the
metrics of the fleet and of each run (also inside the runs of the earlier layout)."""

from __future__ import annotations

import shutil

import pytest

from bubblecast.cli import main
from bubblecast.telemetry.fleet import fleet_runs, run_sidecar_dir, sidecar_dir
from bubblecast.telemetry.metrics import read_metrics
from bubblecast.telemetry.schema import OPTIONAL
from tests.telemetry.test_readers import KEYS, READERS, SIM, assert_same_data


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    root = tmp_path_factory.mktemp("sidecars")
    assert main([*SIM, "--out", str(root / "one.parquet")]) == 0
    assert main([*SIM, "--out", str(root / "fleet") + "/"]) == 0
    return root


@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_reader_opens_a_simulated_fleet_with_metrics(written, reader):
    assert_same_data(reader, written / "one.parquet", written / "fleet", KEYS, set(OPTIONAL))


def test_metrics_live_beside_the_fleet_and_read_as_the_single_files(written):
    fleet = written / "fleet"
    assert all(p.suffix == ".parquet" for p in fleet.rglob("*") if p.is_file())
    assert sorted(p.name for p in sidecar_dir(fleet).iterdir()) != []
    one = read_metrics(written / "one.parquet")
    assert len(one) and len(read_metrics(fleet)) == len(one)
    per_run = sum(len(read_metrics(d)) for d in fleet_runs(fleet).values())
    assert per_run == len(one)
    assert any(run_sidecar_dir(d).is_dir() for d in fleet_runs(fleet).values())


def test_metrics_inside_the_runs_of_the_earlier_layout_are_still_read(written, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(written / "fleet", old)
    for run_dir in fleet_runs(old).values():
        side = run_sidecar_dir(written / "fleet" / run_dir.name)
        for f in side.glob("*.metrics") if side.is_dir() else []:
            shutil.copy(f, run_dir / f.name)
    assert not sidecar_dir(old).exists()
    assert len(read_metrics(old)) == len(read_metrics(written / "one.parquet"))
