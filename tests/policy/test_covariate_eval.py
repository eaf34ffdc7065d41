"""policy-eval with a model trained on device-metric covariates: the runs' device metrics give
it the same covariate features as in training; a run without them is refused in one line
naming the metric, unless ``--fallback trend`` is asked for (then said on stderr and in the
JSON)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from bubblecast.cli import main
from bubblecast.dataset import DatasetConfig, build_dataset
from bubblecast.sim.device_metrics import simulated_metrics, write_simulated_metrics
from bubblecast.sim.simulator import SimConfig, simulate_events
from bubblecast.telemetry import write_events

CONFIG = DatasetConfig(windows=(5, 20), lags=8, max_period=10, covariates="auto")
NAMES = "static,reactive,predictive,oracle"


def _sim(seed: int, runs: int, run_id: str) -> SimConfig:
    return SimConfig(schedule="1f1b", stages=4, microbatches=4, model="uniform:12", steps=90,
                     scenario="thermal", seed=seed, runs=runs, run_id=run_id)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A LightGBM model trained on covariate features of thermal runs; held-out thermal runs
    with their device metrics beside them (``with/``) and without (``without/``)."""
    from bubblecast.forecast.modeldir import load_model, make_model, save_model

    root = tmp_path_factory.mktemp("cov")
    train = _sim(11, 3, "tr")
    frame, _ = build_dataset(simulate_events(train), CONFIG,
                             metrics=simulated_metrics(train))
    assert any(c.startswith("f_cov_power_w") for c in frame.columns)
    model = make_model("lgbm", n_estimators=40, num_leaves=15, seed=0).fit(frame)
    save_model(model, root / "model")
    test = _sim(23, 2, "te")
    (root / "with").mkdir()
    (root / "without").mkdir()
    events = simulate_events(test)
    write_events(events, root / "with" / "runs.parquet")
    assert write_simulated_metrics(test, root / "with" / "runs.parquet") is not None
    shutil.copy(root / "with" / "runs.parquet", root / "without" / "runs.parquet")
    return {"root": root, "model": str(root / "model"), "events": events,
            "metrics": simulated_metrics(test), "loaded": load_model(root / "model")}


def _eval(capsys, path, *extra):
    code = main(["policy-eval", str(path), "--policies", NAMES, "--json", *extra])
    out = capsys.readouterr()
    return code, out


def test_model_reads_the_runs_device_metrics(setup, capsys):
    code, out = _eval(capsys, setup["root"] / "with" / "runs.parquet", "--model", setup["model"])
    assert code == 0, out.err
    assert out.err == ""
    doc = json.loads(out.out)
    assert doc["forecaster"] == "trained model 'lgbm'" and doc["fallback"] is None
    assert {r["forecaster"] for r in doc["runs"].values()} == {"trained model 'lgbm'"}
    assert all(r["fallback"] is None for r in doc["runs"].values())


def test_runs_without_device_metrics_exit_2_naming_the_metric(setup, capsys):
    code, out = _eval(capsys, setup["root"] / "without" / "runs.parquet",
                      "--model", setup["model"])
    assert code == 2 and out.out == ""
    assert out.err.startswith("bubblecast: error:") and out.err.count("\n") == 1
    assert "needs device metric '" in out.err and "(f_cov_" in out.err
    assert "te-0, te-1 have no device metrics" in out.err


def test_fallback_flag_falls_back_and_says_so(setup, capsys):
    code, out = _eval(capsys, setup["root"] / "without" / "runs.parquet",
                      "--model", setup["model"], "--fallback", "trend")
    assert code == 0
    lines = out.err.splitlines()
    assert len(lines) == 1 and "fell back to the built-in trend forecaster" in lines[0]
    assert "needs device metric" in lines[0]
    doc = json.loads(out.out)
    assert doc["fallback"]["forecaster"] == "trend"
    assert set(doc["fallback"]["runs"]) == {"te-0", "te-1"}
    assert "fell back" in doc["forecaster"]


def test_unknown_fallback_exits_2(setup, capsys):
    code, out = _eval(capsys, setup["root"] / "with" / "runs.parquet",
                      "--model", setup["model"], "--fallback", "oracle")
    assert code == 2 and "--fallback: unknown forecaster 'oracle'" in out.err


def test_bound_model_forecasts_as_on_the_training_features(setup):
    """The evaluation's model (frame without metrics + the run's metrics) predicts exactly
    what the model predicts on the dataset built with the metrics, and the metrics matter."""
    from bubblecast.policy.forecasting import WithDeviceMetrics

    model, events, metrics = setup["loaded"], setup["events"], setup["metrics"]
    config = model.dataset_config_
    full, _ = build_dataset(events, config, metrics=metrics)
    bare, _ = build_dataset(events, config)
    assert not any(c.startswith("f_cov_") for c in bare.columns)
    expect = model.predict(full)
    got = WithDeviceMetrics(model, events.frame, metrics, config).predict(bare)
    cols = ["p10", "p50", "p90"]
    np.testing.assert_array_equal(got[cols].to_numpy(), expect[cols].to_numpy())
    hot = metrics.assign(value=0.0)  # every device metric flat: the covariates say nothing
    moved = WithDeviceMetrics(model, events.frame, hot, config).predict(bare)
    assert not np.array_equal(moved[cols].to_numpy(), expect[cols].to_numpy())


def test_run_by_run_path_reads_the_metrics_too(setup, capsys):
    """The unit-by-unit path (fleets, ``--skip-bad-runs``, Dask) reads each unit's metrics."""
    code, out = _eval(capsys, setup["root"] / "with" / "runs.parquet", "--model", setup["model"],
                      "--skip-bad-runs")
    assert code == 0, out.err
    doc = json.loads(out.out)
    assert doc["forecaster"] == "trained model 'lgbm'" and doc["fallback"] is None
