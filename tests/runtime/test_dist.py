"""Two processes under torchrun (gloo): every schedule, migrations back and forth with Adam, the
negative control, rollback after a rank fails mid-migration, checkpoint 4|4 -> resume 3|5.

All scenarios run in one launch (``dist_scenarios.py``); each test checks one of them against
the single-process reference (float64, same init, batches, micro-batch split and scaling).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks.oracles.runtime_reference import Reference
from tests.runtime.dist_results import launch_scenarios
from tests.runtime.dist_scenarios import MIGRATION_STEPS, SCRIPT, config, microbatches_at

pytestmark = pytest.mark.dist
HERE = Path(__file__).resolve().parent
TOL = 1e-6


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    return launch_scenarios(tmp_path_factory.mktemp("dist"), 2, HERE / "dist_scenarios.py")


def _merged_state(per_rank: list[dict[str, Any]], key: str = "state") -> dict[int, dict]:
    state: dict[int, dict] = {}
    for r in per_rank:
        assert not state.keys() & r[key].keys(), "a layer is held by two ranks"
        state.update(r[key])
    return state


def _max_diff(a: dict[int, dict], b: dict[int, dict]) -> float:
    assert sorted(a) == sorted(b)
    return max((a[i][k] - b[i][k]).abs().max().item() for i in b for k in b[i])


def test_every_schedule_matches_the_reference(results: dict) -> None:

    per_rank = results["schedules"]
    for name in per_rank[0]:
        ref = Reference(config(schedule=name))
        ref_losses = ref.run(2)
        losses = per_rank[0][name]["losses"]
        assert [abs(losses[s] - ref_losses[s]) < 1e-12 for s in range(2)] == [True, True], name
        state = _merged_state([r[name] for r in per_rank])
        assert _max_diff(state, ref.layer_state()) < TOL, name


def test_migrations_back_and_forth_keep_the_math(results: dict) -> None:

    per_rank = results["migrate"]
    actions = per_rank[0]["actions"]
    assert len(actions) == len(SCRIPT) and all(a["ok"] for a in actions)
    assert sum(a["layers_moved"] for a in actions) >= 10
    assert all(a["bytes"] > 0 for a in actions if a["layers_moved"])
    assert per_rank[0]["partition"] == (4, 4)
    ref = Reference(config())
    ref_losses = ref.run(MIGRATION_STEPS, microbatches=microbatches_at)
    losses = per_rank[0]["losses"]
    assert max(abs(losses[s] - ref_losses[s]) for s in range(MIGRATION_STEPS)) < 1e-9
    assert _max_diff(_merged_state(per_rank), ref.layer_state()) < TOL


def test_negative_control_dropping_optimizer_state_is_detected(results: dict) -> None:

    per_rank = results["migrate_drop_optimizer_state"]
    ref = Reference(config())
    ref.run(MIGRATION_STEPS, microbatches=microbatches_at)
    assert _max_diff(_merged_state(per_rank), ref.layer_state()) > TOL


def test_failure_during_migration_rolls_back_every_rank(results: dict) -> None:

    per_rank = results["rollback"]
    for r in per_rank:
        for trial in r["trials"]:
            assert not trial["ok"], trial
            assert "injected fault" in trial["error"], trial
            assert trial["plan_kept"] and trial["state_unchanged"], trial
        assert r["recovered"] and r["partition"] == (3, 5)
    ref = Reference(config())
    ref_losses = ref.run(7)  # 3 steps + 3 after failed migrations + 1 after the good one
    losses = per_rank[0]["losses"]
    assert max(abs(losses[s] - ref_losses[s]) for s in range(7)) < 1e-9
    assert _max_diff(_merged_state(per_rank), ref.layer_state()) < TOL


def test_checkpoint_at_4_4_resumes_at_3_5(results: dict) -> None:
    per_rank = results["checkpoint"]
    r0 = per_rank[0]
    assert r0["start"] == 3
    straight = [r0["straight"][s] for s in (3, 4, 5)]
    resumed = [r0["resumed"][s] for s in (3, 4, 5)]
    assert resumed == straight  # identical, not merely close
    ranks_layers = [sorted(r["state_resumed"]) for r in per_rank]
    assert ranks_layers == [[0, 1, 2], [3, 4, 5, 6, 7]]
    assert _max_diff(_merged_state(per_rank, "state_resumed"),
                     _merged_state(per_rank, "state_straight")) == 0.0
