"""Fleet layout and Dask execution: a real LocalCluster of 2 worker processes per module.

The CLI joins the module's cluster with ``--cluster tcp://...`` (the ``local:N`` path starts
its own, the same code after start-up)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bubblecast.cli import main
from bubblecast.errors import BubblecastError
from bubblecast.telemetry.fleet import fleet_runs, run_dir_name
from bubblecast.telemetry.io import read_events, write_events

distributed = pytest.importorskip("distributed")

SIM = ["simulate", "--schedule", "1f1b", "--stages", "2", "--microbatches", "4", "--steps",
       "40", "--scenario", "mixed", "--seed", "3"]
DATA = ["--windows", "5,20", "--horizons", "1,5", "--lags", "8"]


@pytest.fixture(scope="module")
def cluster() -> str:
    import dask

    # one retry after a worker dies running a task (Dask's default is 3): keeps the test short
    from bubblecast.execution import local_cluster

    with dask.config.set({"distributed.scheduler.allowed-failures": 1}):
        cl = local_cluster(2)
    with cl:
        yield cl.scheduler_address


def _die_once(marker: str) -> int:
    """Kill the worker process the first time (marker absent), succeed on the retry."""
    import os

    if not os.path.exists(marker):
        Path(marker).write_text("died")
        os._exit(1)
    return 7


def _fail_or_write(item: int, folder: str) -> int:
    """Item 0 fails once item 1 has started; item 1 writes a file after a while (a task
    still running when the map fails)."""
    import time

    if item == 0:
        deadline = time.monotonic() + 20
        while not Path(folder, "started-1").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        raise ZeroDivisionError("item 0 fails")
    Path(folder, "started-1").write_text("")
    time.sleep(1.5)
    Path(folder, "written-1").write_text("late")
    return item


def test_a_failed_map_returns_once_its_running_tasks_stopped(cluster: str,
                                                             tmp_path: Path) -> None:
    """Cancelling a future does not stop its running task: the map's failure reaches the
    caller only after that task ended, so the caller's clean-up (a failed build's temporary
    output) is not raced by a late write."""
    from distributed import Client

    from bubblecast.execution import DaskExecutor

    with Client(cluster) as client:
        with pytest.raises(ZeroDivisionError):
            DaskExecutor(client, progress=False).map(_fail_or_write, [0, 1], str(tmp_path))
        assert (tmp_path / "started-1").exists() and (tmp_path / "written-1").exists()


def _always_die(_item: int) -> int:
    import os

    os._exit(1)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fleet")
    assert main([*SIM, "--runs", "5", "--out", f"{root / 'fleet'}/"]) == 0
    return root / "fleet"


def _json(capsys: pytest.CaptureFixture[str]) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def _sorted(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.assign(run_id=frame["run_id"].astype(str), scenario=frame["scenario"]
                         .astype(str)) if "scenario" in frame else frame
    return frame.sort_values(["run_id", "replica", "stage", "step"]).reset_index(drop=True)


def test_simulate_writes_a_fleet_equal_to_one_file(fleet: Path, tmp_path: Path) -> None:
    assert list(fleet_runs(fleet)) == [f"sim-{k}" for k in range(5)]
    assert all((d / "part-00000.parquet").is_file() for d in fleet_runs(fleet).values())
    assert main([*SIM, "--runs", "5", "--out", str(tmp_path / "one.parquet")]) == 0
    one, many = read_events(tmp_path / "one.parquet"), read_events(fleet)
    assert one.runs == many.runs
    pd.testing.assert_frame_equal(one.frame, many.frame)


def test_append_is_atomic_and_refuses_a_present_run(fleet: Path, tmp_path: Path) -> None:
    events = read_events(fleet / run_dir_name("sim-0"))
    target = tmp_path / "f"
    write_events(events, f"{target}/")
    with pytest.raises(BubblecastError, match="already in the fleet"):
        write_events(events, target)
    # a half-written run (hidden temporary) is invisible to readers
    hidden = target / f".{run_dir_name('sim-9')}.abc.1"
    hidden.mkdir()
    (hidden / "part-00000.parquet").write_bytes(b"garbage")
    assert read_events(target).run_ids == ["sim-0"]


@pytest.fixture
def several_per_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """Groups of several runs (one group per worker), so a task reads runs at once."""
    monkeypatch.setattr("bubblecast.dataset.fleet_build.GROUPS_PER_WORKER", 1)


def _corrupt(fleet: Path, run: str) -> Path:
    part = fleet / run_dir_name(run) / "part-00000.parquet"
    part.write_bytes(part.read_bytes()[:200] + b"\0" * 64)
    return part


def test_group_read_equals_run_by_run(fleet: Path, tmp_path: Path) -> None:
    import shutil

    from bubblecast.dataset.series import EVENT_COLUMNS
    from bubblecast.telemetry.events import Events
    from bubblecast.telemetry.fleet_read import read_group

    dirs = list(fleet_runs(fleet).values())
    for columns in (list(EVENT_COLUMNS), None):
        one = Events.concat([read_events(d, columns=columns) for d in dirs])
        many = read_group(dirs, columns)
        assert many is not None and many.runs == one.runs
        pd.testing.assert_frame_equal(many.frame, one.frame)
    shutil.copytree(fleet, tmp_path / "bad")
    _corrupt(tmp_path / "bad", "sim-2")
    assert read_group(list(fleet_runs(tmp_path / "bad").values()), None) is None


def test_dataset_on_dask_equals_in_process(fleet: Path, tmp_path: Path, cluster: str,
                                           capsys: pytest.CaptureFixture[str],
                                           several_per_group: None) -> None:
    from bubblecast.dataset.store import read_features

    assert main(["dataset", str(fleet), *DATA, "--out", str(tmp_path / "a.parquet"),
                 "--json"]) == 0
    local = _json(capsys)
    assert main(["dataset", str(fleet), *DATA, "--out", str(tmp_path / "b"), "--json",
                 "--cluster", cluster]) == 0
    remote = _json(capsys)
    assert remote["fingerprint"] == local["fingerprint"]
    assert remote["rows"] == local["rows"] > 0
    assert sorted(fleet_runs(tmp_path / "b")) == [f"sim-{k}" for k in range(5)]
    a, meta_a = read_features(tmp_path / "a.parquet")
    b, meta_b = read_features(tmp_path / "b")
    assert meta_a.runs == meta_b.runs and meta_a.run_info == meta_b.run_info
    pd.testing.assert_frame_equal(_sorted(a), _sorted(b))


def test_corrupt_run_fails_naming_it_or_is_skipped(fleet: Path, tmp_path: Path, cluster: str,
                                                   capsys: pytest.CaptureFixture[str],
                                                   several_per_group: None) -> None:
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(fleet, bad)
    _corrupt(bad, "sim-2")
    out = tmp_path / "feat"
    assert main(["dataset", str(bad), *DATA, "--out", str(out), "--cluster", cluster]) == 2
    err = capsys.readouterr().err
    assert "sim-2" in err and "part-00000.parquet" in err
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert main(["dataset", str(bad), *DATA, "--out", str(out), "--cluster", cluster,
                 "--skip-bad-runs", "--json"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out.strip().splitlines()[-1])
    assert [s["run_id"] for s in summary["skipped_runs"]] == ["sim-2"]
    assert summary["runs"] == 4 and "sim-2" in captured.err
    assert main(["dataset", str(bad), *DATA, "--out", str(tmp_path / "f.parquet"),
                 "--skip-bad-runs", "--json"]) == 0
    assert _json(capsys)["fingerprint"] == summary["fingerprint"]


def test_missing_extra_is_one_line(monkeypatch: pytest.MonkeyPatch, fleet: Path,
                                   tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)
    assert main(["dataset", str(fleet), *DATA, "--out", str(tmp_path / "x"),
                 "--cluster", "local:2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "fleet" in err and len(err.splitlines()) == 1
    assert main(["dataset", str(fleet), "--out", "x", "--cluster", "local"]) == 2


def test_best_iteration_follows_early_stopping() -> None:
    from bubblecast.forecast.dask_train import best_iteration

    assert best_iteration([5, 4, 3, 3.5, 3.6, 3.7, 2.0], 3) == 3
    assert best_iteration([5, 4, 3, 3.5, 2.0], 3) == 5


def test_lgbm_on_dask_is_an_ordinary_model(fleet: Path, tmp_path: Path, cluster: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    from bubblecast.dataset.store import read_features
    from bubblecast.forecast.modeldir import load_model
    from bubblecast.forecast.training import train_model

    assert main(["dataset", str(fleet), *DATA, "--out", f"{tmp_path / 'feat'}/"]) == 0
    result = train_model(tmp_path / "feat", "lgbm", tmp_path / "model", track=False,
                         params={"n_estimators": 15, "seed": 0}, cluster=cluster)
    assert set(result["metrics"]) == {"h1", "h5"} and result["runs"] == 4
    model = load_model(str(tmp_path / "model"))
    frame, _ = read_features(tmp_path / "feat")
    preds = model.predict_signal(frame.head(20), [1, 5])
    assert all(np.isfinite(p).all() and p.shape == (20, 3) for p in preds.values())
    with pytest.raises(BubblecastError, match="one process"):
        train_model(tmp_path / "feat", "seq", tmp_path / "m2", track=False, cluster=cluster)


def test_validation_curve_is_lightgbms_quantile_metric() -> None:
    import lightgbm as lgb

    from bubblecast.forecast.dask_train import validation_curve

    rng = np.random.default_rng(0)
    x, xv = rng.normal(size=(800, 4)), rng.normal(size=(300, 4))
    y, yv = x[:, 0] + rng.normal(size=800), xv[:, 0] + rng.normal(size=300)
    recorded: dict = {}
    booster = lgb.train({"objective": "quantile", "alpha": 0.9, "verbosity": -1,
                         "num_leaves": 7}, lgb.Dataset(x, y), 30,
                        valid_sets=[lgb.Dataset(xv, yv)],
                        callbacks=[lgb.record_evaluation(recorded)])
    expected = np.array(recorded["valid_0"]["quantile"])
    np.testing.assert_allclose(validation_curve(booster, xv, yv, 0.9), expected, rtol=1e-6)


def test_policy_inspect_whatif_on_dask_equal_in_process(
        fleet: Path, cluster: str, capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["policy-eval", str(fleet), "--policies", "reactive"],
                 ["inspect", str(fleet), "--run", "sim-4"],
                 ["whatif", str(fleet), "--run", "sim-1"]):
        assert main([*args, "--json"]) == 0
        local = _json(capsys)
        assert main([*args, "--json", "--cluster", cluster]) == 0
        assert _json(capsys) == local, args[0]


def test_evaluate_on_dask_equals_in_process(fleet: Path, tmp_path: Path, cluster: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    feat = f"{tmp_path / 'feat'}/"
    assert main(["dataset", str(fleet), *DATA, "--out", feat]) == 0
    assert main(["train", feat, "--model", "ewma", "--no-track", "--out",
                 str(tmp_path / "m")]) == 0
    capsys.readouterr()
    args = ["evaluate", feat, "--model", str(tmp_path / "m"), "--no-track", "--json"]
    assert main(args) == 0
    local = _json(capsys)
    assert main([*args, "--cluster", cluster]) == 0
    assert _json(capsys) == local


def test_killed_worker_is_retried_or_one_line(tmp_path: Path, cluster: str) -> None:
    from bubblecast.execution import executor

    with executor(cluster, progress=False) as ex:
        assert ex.map(_die_once, [str(tmp_path / "marker")]) == [7]
        with pytest.raises(BubblecastError, match="workers died") as err:
            ex.map(_always_die, [1])
    assert "\n" not in str(err.value)


def test_inspect_whatif_skip_bad_runs(fleet: Path, tmp_path: Path, cluster: str,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    bad = tmp_path / "bad"
    for run in ("sim-0", "sim-2"):
        shutil.copytree(fleet / run_dir_name(run), bad / run_dir_name(run))
    _corrupt(bad, "sim-2")
    for cmd in ("inspect", "whatif"):
        for extra in ([], ["--cluster", cluster]):
            assert main([cmd, str(bad), "--json", *extra]) == 2
            err = capsys.readouterr().err.strip()
            assert "sim-2" in err and "part-00000.parquet" in err and "\n" not in err
        assert main([cmd, str(bad), "--json", "--run", "sim-0"]) == 0  # only that run is read
        plain = _json(capsys)
        for extra in ([], ["--cluster", cluster]):
            assert main([cmd, str(bad), "--json", "--skip-bad-runs", *extra]) == 0, extra
            captured = capsys.readouterr()
            got = json.loads(captured.out.strip().splitlines()[-1])
            assert [s["run_id"] for s in got.pop("skipped_runs")] == ["sim-2"]
            assert got == plain and "skipped sim-2" in captured.err


def test_local_cluster_dashboard_answers(capsys: pytest.CaptureFixture[str]) -> None:
    import re
    import urllib.request

    from bubblecast.execution import executor

    pytest.importorskip("bokeh")
    with executor("local:1", progress=False):
        err = capsys.readouterr().err
        url = re.search(r"dashboard (http://\S+)", err)
        assert url is not None, err
        with urllib.request.urlopen(url.group(1), timeout=20) as resp:
            assert resp.status == 200 and b"<html" in resp.read(65536).lower()


def test_features_with_a_bad_part_fail_naming_the_run_or_skip_it(fleet: Path,
                                                                 tmp_path: Path) -> None:
    from bubblecast.dataset.fleet_build import read_features_skipping
    from bubblecast.dataset.store import read_features

    feat = tmp_path / "feat"
    assert main(["dataset", str(fleet), *DATA, "--out", f"{feat}/"]) == 0
    whole, meta = read_features(feat)
    _corrupt(feat, "sim-3")
    with pytest.raises(BubblecastError, match=r"run 'sim-3': .*part-00000.parquet"):
        read_features_skipping(feat)
    frame, part_meta, skipped = read_features_skipping(feat, skip_bad=True)
    assert [s["run_id"] for s in skipped] == ["sim-3"]
    assert part_meta.runs == [r for r in meta.runs if r != "sim-3"]
    kept = whole.loc[whole["run_id"].astype(str) != "sim-3"].reset_index(drop=True)
    pd.testing.assert_frame_equal(_sorted(frame), _sorted(kept), check_categorical=False)


def test_seq_streamed_from_parts_fits_as_from_the_frame(fleet: Path, tmp_path: Path) -> None:
    from bubblecast.dataset.store import read_features
    from bubblecast.forecast.seq import SeqForecaster

    feat = tmp_path / "feat"
    assert main(["dataset", str(fleet), *DATA, "--out", f"{feat}/"]) == 0
    frame, _ = read_features(feat)
    runs = ["sim-0", "sim-1", "sim-3", "sim-4"]
    sub = frame.loc[frame["run_id"].astype(str).isin(runs)].reset_index(drop=True)
    sub.attrs = dict(frame.attrs)
    params = {"hidden": 8, "epochs": 2, "max_train_rows": 150, "seed": 1}
    a = SeqForecaster(**params).fit(sub)
    b = SeqForecaster(**params).fit_partitioned(feat, runs)
    assert a.state() == b.state()
    for h, p in a.predict_signal(frame, [1, 5]).items():
        np.testing.assert_array_equal(p, b.predict_signal(frame, [1, 5])[h])
