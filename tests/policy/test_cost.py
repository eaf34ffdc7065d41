"""Migration cost model: bytes of the layers that change owner, constants from measurements."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bubblecast.errors import BubblecastError
from bubblecast.policy.cost import (
    MigrationConstants,
    MigrationCost,
    fit_measurements,
    run_constants,
)


def test_only_layers_that_change_owner_move():
    cost = MigrationCost(np.arange(1, 9) * 1e6, MigrationConstants(bandwidth_Bps=1e9,
                                                                   fixed_pause_s=0.5,
                                                                   optimizer_factor=2.0))
    # 4|4 -> 3|5: layer 3 moves from stage 0 to stage 1.
    assert cost.bytes_moved((4, 4), (3, 5)) == pytest.approx(4e6 * 3)
    assert cost.seconds((4, 4), (3, 5)) == pytest.approx(0.5 + 12e6 / 1e9)
    # 4|4 -> 6|2: layers 4 and 5 move.
    assert cost.bytes_moved((4, 4), (6, 2)) == pytest.approx((5e6 + 6e6) * 3)
    assert cost.seconds((4, 4), (4, 4)) == 0.0


def test_chunks_of_one_rank_share_an_owner():
    cost = MigrationCost(np.ones(8), MigrationConstants(1.0, 0.0, 0.0), ranks=2)
    # Virtual stages 0..3 on ranks 0, 1, 0, 1: layer 1 moves from vstage 0 to 1 (rank 0 -> 1);
    # layer 5 moves from vstage 2 to 3 (rank 0 -> 1) as well.
    assert cost.bytes_moved((2, 2, 2, 2), (1, 3, 1, 3)) == 2.0
    # One rank with two chunks: moving a layer between its chunks ships nothing (the pause for
    # rebuilding the stages is still paid).
    one = MigrationCost(np.ones(4), MigrationConstants(1.0, 0.5, 0.0), ranks=1)
    assert one.bytes_moved((2, 2), (1, 3)) == 0.0 and one.seconds((2, 2), (1, 3)) == 0.5


def test_parallel_links_follow_the_busiest_stage():
    c = MigrationConstants(bandwidth_Bps=1.0, fixed_pause_s=0.0, optimizer_factor=0.0,
                           parallel_links=True)
    cost = MigrationCost(np.ones(6), c)
    # 2|2|2 -> 1|2|3: layer 1 moves 0->1, layer 3 moves 1->2; each stage sends or gets 1.
    assert cost.seconds((2, 2, 2), (1, 2, 3)) == pytest.approx(1.0)
    serial = MigrationCost(np.ones(6), MigrationConstants(1.0, 0.0, 0.0))
    assert serial.seconds((2, 2, 2), (1, 2, 3)) == pytest.approx(2.0)


def test_fit_recovers_bandwidth_and_pause():
    rng = np.random.default_rng(0)
    nbytes = rng.uniform(1e8, 5e9, 20)
    seconds = 0.7 + nbytes / 4e9
    records = [{"seconds": s, "bytes": b} for s, b in zip(seconds, nbytes, strict=True)]
    bw, pause = fit_measurements(records)
    assert bw == pytest.approx(4e9, rel=1e-6)
    assert pause == pytest.approx(0.7, rel=1e-6)


def test_from_json_file_overrides_defaults(tmp_path):
    path = tmp_path / "mig.json"
    path.write_text(json.dumps({"migrations": [{"migration_s": 1.5, "bytes_moved": 1e9},
                                               {"migration_s": 2.5, "bytes_moved": 2e9}],
                                "optimizer_factor": 2.0}))
    c = MigrationConstants.from_json(path)
    assert c.bandwidth_Bps == pytest.approx(1e9)
    assert c.fixed_pause_s == pytest.approx(0.5)
    assert c.optimizer_factor == 2.0
    assert MigrationConstants.from_json({"fixed_pause_s": 3.0}).fixed_pause_s == 3.0


@pytest.mark.parametrize("doc, match", [
    ({"migrations": []}, "non-empty"),
    ({"migrations": [{"seconds": 1.0}]}, "bytes"),
    ({"migrations": [{"seconds": 1.0, "bytes": 0}]}, "non-empty"),
    ({"migrations": [{"seconds": 0.0, "bytes": 5}]}, "do not grow"),
    ({"bandwidth_Bps": -1}, "bandwidth_Bps"),
    ({"fixed_pause_s": float("nan")}, "fixed_pause_s"),
])
def test_bad_constants_are_refused(doc, match):
    with pytest.raises(BubblecastError, match=match):
        MigrationConstants.from_json(doc)


def test_runtime_records_are_read_and_failures_skipped():
    actions = [{"action": "repartition", "ok": True, "seconds": 1.2, "bytes": 1e9},
               {"action": "repartition", "ok": False, "seconds": 9.0, "bytes": 1e9},
               {"action": "noop", "ok": True, "seconds": 0.0, "bytes": 0},
               {"action": "repartition", "ok": True, "seconds": 2.2, "bytes": 3e9}]
    c = run_constants({"actions": actions}, MigrationConstants())
    assert c is not None
    assert c.bandwidth_Bps == pytest.approx(2e9) and c.fixed_pause_s == pytest.approx(0.7)
    assert run_constants({}, MigrationConstants()) is None
    bench = {"rows": [{"seconds": 0.5, "bytes": 1e8, "ok": True}]}  # migration.json layout
    assert MigrationConstants.from_json(bench).bandwidth_Bps == pytest.approx(2e8)


def test_bad_files_and_partitions_are_refused(tmp_path):
    with pytest.raises(BubblecastError, match="no such file"):
        MigrationConstants.from_json(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(BubblecastError, match="not valid JSON"):
        MigrationConstants.from_json(tmp_path / "bad.json")
    cost = MigrationCost(np.ones(4))
    with pytest.raises(BubblecastError, match="must hold 4 layers"):
        cost.seconds((2, 2), (1, 2))
