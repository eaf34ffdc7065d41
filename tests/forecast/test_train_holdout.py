"""``train`` says when no run is held out (issue 21 item 6) instead of an empty ``metrics``."""

from __future__ import annotations

import json

import pytest

from bubblecast.cli import main


@pytest.fixture(scope="module")
def four_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("four")
    events, features = tmp / "events.parquet", tmp / "features.parquet"
    assert main(["simulate", "--schedule", "1f1b", "--stages", "2", "--microbatches", "4",
                 "--steps", "80", "--scenario", "throttle", "--runs", "4", "--seed", "3",
                 "--out", str(events)]) == 0
    assert main(["dataset", str(events), "--out", str(features), "--json"]) == 0
    return features


def _train(features, tmp_path, capsys, *extra: str) -> tuple[dict, str]:
    capsys.readouterr()
    assert main(["train", str(features), "--model", "lgbm", "--out", str(tmp_path / "m"),
                 "--no-track", "--json", *extra]) == 0
    out = capsys.readouterr()
    return json.loads(out.out), out.err


def test_a_holdout_that_rounds_to_no_run_is_reported_with_advice(four_runs, tmp_path, capsys):
    result, err = _train(four_runs, tmp_path, capsys)  # --holdout 0.2 of 4 runs: none
    assert result["metrics"] == {}
    note = result["holdout_note"]
    assert "no run held out" in note and "--holdout 0.25" in note
    assert f"warning: {note}" in err
    # the advice works: one run held out, metrics reported, no note
    result, err = _train(four_runs, tmp_path, capsys, "--holdout", "0.25")
    assert set(result["metrics"]) == {"h1", "h5", "h10"} and "holdout_note" not in result
    assert "warning" not in err


def test_holdout_zero_is_noted_in_the_json_only(four_runs, tmp_path, capsys):
    result, err = _train(four_runs, tmp_path, capsys, "--holdout", "0")
    assert result["metrics"] == {} and "--holdout 0" in result["holdout_note"]
    assert "warning" not in err  # asked for: not warned about
