"""``bubblecast collect``: bad requests refused before launch; an emulated straggler shows up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bubblecast.cli import main

BASE = ["collect", "--model", "mlp", "--layers", "8", "--stages", "2", "--microbatches", "4",
        "--steps", "5", "--schedule", "1f1b"]


@pytest.mark.parametrize(("extra", "message"), [
    (["--partition", "3,4"], "sums to 7"),
    (["--partition", "8,0"], "leaves a stage empty"),
    (["--stages", "9"], "need at least 9 layers"),
    (["--microbatches", "1"], "at least as many micro-batches as stages"),
    (["--schedule", "dualpipev", "--microbatches", "3"], "at least 4 micro-batches"),
    (["--schedule", "zb-h2"], "not shipped"),
    (["--inject", "rank=1,factor=fast"], "'factor' must be a number"),
    (["--inject", "rank=5,factor=2"], "rank 5 does not exist"),
    (["--model", "cnn"], "unknown model 'cnn'"),
    (["--batch-size", "6"], "does not split"),
    (["--action", "10:teleport=1"], "--action"),
    (["--partition", "4,x"], "comma-separated integers"),
])
def test_bad_requests_exit_2_before_launch(extra: list[str], message: str, tmp_path: Path,
                                           capsys: pytest.CaptureFixture,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import bubblecast.runtime.launch as launch_mod

    def no_launch(*a, **k):
        raise AssertionError("launched despite a bad request")

    monkeypatch.setattr(launch_mod, "launch", no_launch)
    out = tmp_path / "e.parquet"
    code = main([*BASE, *extra, "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("bubblecast: error:") and message in err[0]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.dist
def test_injected_straggler_becomes_the_bottleneck(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture) -> None:
    import pandas as pd

    from bubblecast.sim.accounting import inspect_summary
    from bubblecast.telemetry import read_events

    out = tmp_path / "run.parquet"
    code = main([*BASE[:-4], "--steps", "30", "--schedule", "1f1b", "--inject",
                 "rank=1,factor=2.0,start=10", "--action", "20:repartition=3,5",
                 "--profile", str(tmp_path / "prof"), "--out", str(out), "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert result["rows"] > 0 and result["partition"] == [3, 5]
    assert [a["ok"] for a in result["actions"]] == [True]
    ev = read_events(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prof", "run.parquet"]  # no leftovers
    meta = ev.runs["run"]
    assert meta.source == "bubblecast-runtime" and meta.partition == [4, 4]
    assert meta.extra["emulated_slowdown"]["spec"] == "rank=1,factor=2.0,start=10"
    assert meta.extra["actions"][0]["seconds"] > 0 and meta.extra["actions"][0]["bytes"] > 0
    f = ev.frame
    assert len(ev) == result["rows"] and set(f["step"]) == set(range(30))
    layers = f.loc[f["op"] == "F"].groupby(["step", "stage"])["layers"].first().unstack()
    assert (layers.loc[:19] == [4, 4]).all().all() and (layers.loc[20:] == [3, 5]).all().all()
    per = ev.compute().groupby(["step", "stage"])["duration_s"].sum().unstack()
    before, after = per.loc[5:9].median(), per.loc[10:19].median()  # same partition, unprofiled
    assert after[1] > after[0]  # stage 1 is the bottleneck once slowed
    assert after[1] / after[0] > 1.4 * before[1] / before[0]  # and it is the injection
    late = ev.frame.loc[ev.frame["step"] >= 10]
    from bubblecast.telemetry import from_frame

    summary = inspect_summary(from_frame(late.reset_index(drop=True), dict(ev.runs)))
    if "bottleneck_stage" in summary:
        assert summary["bottleneck_stage"] == 1
    _check_kineto(tmp_path / "prof")
    assert isinstance(per, pd.DataFrame)


def _check_kineto(prof: Path) -> None:
    """The optional torch.profiler capture is readable by the kineto importer."""
    from bubblecast.telemetry.importers import load_events

    assert sorted(p.name for p in prof.iterdir()) == ["rank0.json", "rank1.json"]
    ev = load_events(prof, "kineto")
    assert set(ev.frame["stage"]) == {0, 1} and {"F", "B"} <= set(ev.frame["op"].astype(str))
