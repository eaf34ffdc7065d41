"""``bubblecast policy-eval``: JSON contract, plot, forecaster choice, exit code 2 on bad input."""

from __future__ import annotations

import json

import pytest

from bubblecast.cli import main
from bubblecast.sim.simulator import SimConfig, simulate_events
from bubblecast.telemetry import write_events

KEYS = {"step_s", "bubble_fraction", "speedup_vs_static", "oracle_share", "actions",
        "migration_s"}


@pytest.fixture(scope="module")
def runs_file(tmp_path_factory):
    ev = simulate_events(SimConfig(schedule="1f1b", stages=4, microbatches=4,
                                   model="uniform:12", steps=80, scenario="failslow", seed=3,
                                   runs=2))
    path = tmp_path_factory.mktemp("pe") / "runs.parquet"
    write_events(ev, path)
    return path


def run_json(capsys, args):
    code = main(["policy-eval", *args, "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


def test_json_keys_and_plot(runs_file, tmp_path, capsys):
    png = tmp_path / "steps.png"
    doc = run_json(capsys, [str(runs_file), "--plot", str(png)])
    assert set(doc["policies"]) == {"static", "reactive", "predictive", "oracle"}
    for name, p in doc["policies"].items():
        assert set(p) >= KEYS, name
    assert doc["mode"] == "counterfactual" and doc["note"]
    assert "built-in" in doc["forecaster"]
    assert png.stat().st_size > 1000
    assert doc["policies"]["static"]["speedup_vs_static"] == pytest.approx(1.0)
    guard = doc["policies"]["predictive"]["guard"]  # the forecast guard's counts, per run too
    assert guard["decisions"] > 0 and 0 <= guard["fallback_decisions"] <= guard["decisions"]
    runs = doc["runs"].values()
    assert sum(r["policies"]["predictive"]["guard"]["decisions"] for r in runs) \
        == guard["decisions"]


def test_policy_subset_and_measured_migration(runs_file, tmp_path, capsys):
    mig = tmp_path / "mig.json"
    mig.write_text(json.dumps({"fixed_pause_s": 0.5, "bandwidth_Bps": 1e9}))
    doc = run_json(capsys, [str(runs_file), "--policies", "static,reactive",
                            "--migration", str(mig), "--param-bytes", "1e6"])
    assert set(doc["policies"]) == {"static", "reactive"}
    assert doc["migration"]["fixed_pause_s"] == 0.5
    r = doc["policies"]["reactive"]
    assert r["migration_s"] == pytest.approx(r["actions"] * 0.5, abs=r["actions"] * 0.02)


def test_text_output(runs_file, capsys):
    assert main(["policy-eval", str(runs_file), "--policies", "static,oracle"]) == 0
    out = capsys.readouterr().out
    assert "mode: counterfactual" in out and "oracle" in out


def test_a_trained_model_drives_the_predictive_policy(runs_file, tmp_path, capsys):
    from bubblecast.dataset import DatasetConfig, build_dataset
    from bubblecast.forecast.modeldir import make_model, save_model
    from bubblecast.telemetry import read_events

    train = simulate_events(SimConfig(schedule="1f1b", stages=4, microbatches=4,
                                      model="uniform:12", steps=120, scenario="throttle",
                                      seed=99, runs=2))
    frame, _ = build_dataset(train, DatasetConfig(windows=(5, 20), lags=8, max_period=10))
    save_model(make_model("last").fit(frame), tmp_path / "model")
    assert read_events(runs_file).run_ids
    doc = run_json(capsys, [str(runs_file), "--policies", "static,predictive",
                            "--model", str(tmp_path / "model")])
    # the model is used on every run (no "model not usable ...; fell back" note), and the
    # forecast guard takes its forecasts on some decisions rather than falling back on all
    assert doc["forecaster"] == "trained model 'last'"
    assert {r["forecaster"] for r in doc["runs"].values()} == {"trained model 'last'"}
    guard = doc["policies"]["predictive"]["guard"]
    assert 0 <= guard["fallback_decisions"] < guard["decisions"]


@pytest.mark.parametrize("args, match", [
    (["--policies", "static,clever"], "unknown policy 'clever'"),
    (["--model", "/no/such/model"], "model directory does not exist"),
    (["--run", "nope"], "no run 'nope'"),
    (["--migration", "/no/such.json"], "no such file"),
])
def test_bad_input_exits_2_with_one_line(runs_file, capsys, args, match):
    assert main(["policy-eval", str(runs_file), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bubblecast: error:") and err.count("\n") == 1
    assert match in err


def test_missing_file_exits_2(tmp_path, capsys):
    assert main(["policy-eval", str(tmp_path / "missing.parquet")]) == 2
    assert "no such file" in capsys.readouterr().err
