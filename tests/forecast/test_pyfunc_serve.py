"""The logged MLflow model is MLflow's: it loads where bubblecast cannot be imported, reads a
features file as ``pd.read_parquet`` returns it, and ``mlflow models serve`` answers with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bubblecast._version import __version__
from bubblecast.dataset import read_features
from bubblecast.errors import BubblecastError
from bubblecast.forecast.cost_modeldir import load_cost_model
from bubblecast.forecast.cost_training import train_cost_model
from bubblecast.forecast.lgbm import LGBMForecaster
from bubblecast.forecast.modeldir import log_model, make_model, save_model
from bubblecast.forecast.tracking import (
    DEFAULT_EXPERIMENT,
    create_experiment,
    forecaster_inputs,
    mlflow_run,
    numeric_inputs,
    wide_quantiles,
)
from tests.forecast.test_cost_model import simulate
from tests.helpers import free_port

NAME, ALIAS = "bc-serve", "champion"

#: Run in a fresh interpreter: bubblecast made unimportable (the editable install's finder
#: and the repository dropped from the path), and the libraries bubblecast depends on but
#: the logged model does not list refused, before anything else is imported.
LOAD_SCRIPT = r'''
import importlib.abc, importlib.util, json, sys
args = json.loads(sys.argv[1])
sys.meta_path = [f for f in sys.meta_path
                 if not getattr(f, "__module__", "").startswith("__editable__")]
sys.path = [p for p in sys.path if p not in ("", args["repo"])]

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in args["blocked"]:
            raise ModuleNotFoundError(f"blocked by the test: {name}")
        return None

sys.meta_path.insert(0, Refuse())
importable = importlib.util.find_spec("bubblecast") is not None
import mlflow
import pandas as pd

before = sorted(m for m in sys.modules if m.split(".")[0] == "bubblecast")
mlflow.set_tracking_uri(args["tracking"])
out = {"importable_before": importable, "bubblecast_before": before, "predictions": {}}
for name, case in args["cases"].items():
    model = mlflow.pyfunc.load_model(case["uri"])
    for backend in ("default", "numpy_nullable", "pyarrow"):
        kw = {} if backend == "default" else {"dtype_backend": backend}
        frame = pd.read_parquet(case["file"], **kw)
        out["predictions"][f"{name}/{backend}"] = model.predict(frame).to_dict(orient="list")
    if name == "forecaster":
        out["h5_only"] = list(model.predict(frame, params={"horizons": [5]}).columns)
out["bubblecast_file"] = sys.modules["bubblecast"].__file__
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def logged(features_file, tmp_path_factory):
    """A LightGBM forecaster fitted on ``features_file`` and a linear cost model, each logged
    and registered (``models:/bc-serve@champion``, ``models:/bc-serve-cost@champion``) in a
    SQLite store of their own; the cost model's op rows saved as Parquet."""
    tmp = tmp_path_factory.mktemp("pyfunc")
    frame, _ = read_features(features_file)
    model = LGBMForecaster(n_estimators=30, early_stopping_rounds=10, seed=0).fit(frame)
    model_dir = save_model(model, tmp / "model")
    tracking = f"sqlite:///{tmp / 'mlflow.db'}"
    create_experiment(tracking, DEFAULT_EXPERIMENT, tmp / "mlruns")
    with mlflow_run(tracking, "pyfunc-test") as mlflow:
        info = log_model(mlflow, model_dir, frame.head(5), NAME, ALIAS)
    assert info["uri"] == f"models:/{NAME}@{ALIAS}"
    events = simulate(3, 21, "cost", steps=24)
    cost = train_cost_model(events, tmp / "cost", params={"learner": "linear"},
                            tracking_uri=tracking, register=f"{NAME}-cost", alias=ALIAS)
    cost_model = load_cost_model(tmp / "cost")
    rows = cost_model.rows(events)
    rows.to_parquet(tmp / "cost_rows.parquet")
    return {"tracking": tracking, "uri": info["uri"], "model": model, "tmp": tmp,
            "cost_uri": cost["registered"]["uri"], "cost_model": cost_model,
            "cost_rows": tmp / "cost_rows.parquet"}


def expected(model, features: Path, horizons=None) -> pd.DataFrame:
    """The forecaster's own quantiles on the features file, in the pyfunc's layout."""
    frame = pd.read_parquet(features)
    return wide_quantiles(model.predict_signal(frame, list(horizons or model.horizons_)))


def blocked_imports(requirements: list[str]) -> list[str]:
    """Import names of bubblecast's own dependencies that the logged model does not list."""
    from importlib import metadata

    listed = {r.split("==")[0].strip().lower().replace("_", "-") for r in requirements}
    deps = {r.split(";")[0].split(">")[0].split("=")[0].split("<")[0].strip().lower()
            for r in metadata.requires("bubblecast") or [] if "extra ==" not in r}
    dists = metadata.packages_distributions()
    return sorted(m for m, ds in dists.items() if not m.startswith("_")
                  and {d.lower().replace("_", "-") for d in ds} & (deps - listed))


def test_logged_model_carries_bubblecast_and_a_features_only_signature(logged):
    import mlflow

    mlflow.set_tracking_uri(logged["tracking"])
    info = mlflow.models.get_model_info(logged["uri"])
    names = info.signature.inputs.input_names()
    assert names == forecaster_inputs(logged["model"])
    assert {"level", "f_u_lag0", "x5_u_seasonal", "f_tokens_ratio"} <= set(names)
    leaks = [c for c in names if c.startswith(("y_h", "s_h", "work", "speed", "scenario"))
             or c in ("y", "run_id", "replica", "stage", "step", "compute_s", "layers")]
    assert leaks == []
    assert info.signature.outputs.input_names() == [
        f"{q}_h{h}" for h in (1, 5) for q in ("p10", "p50", "p90")]
    assert info.metadata["bubblecast_version"] == __version__
    local = Path(mlflow.artifacts.download_artifacts(logged["uri"],
                                                     dst_path=str(logged["tmp"] / "dl")))
    reqs = (local / "requirements.txt").read_text().split()
    assert not [r for r in reqs if r.startswith("bubblecast")]
    assert {r.split("==")[0] for r in reqs} >= {"numpy", "pandas", "pyarrow", "lightgbm"}
    assert (local / "code" / "bubblecast" / "forecast" / "pyfunc_model.py").is_file()
    assert not (local / "code" / "bubblecast" / "_bundled").exists()


def test_registered_model_predicts_from_disk_where_bubblecast_is_not_installed(
        logged, features_file, tmp_path):
    import mlflow

    mlflow.set_tracking_uri(logged["tracking"])
    local = Path(mlflow.artifacts.download_artifacts(logged["uri"],
                                                     dst_path=str(tmp_path / "dl")))
    blocked = blocked_imports((local / "requirements.txt").read_text().split())
    assert "torch" in blocked and "numpy" not in blocked and "lightgbm" not in blocked
    repo = str(Path(__file__).resolve().parents[2])
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MLFLOW_TRACKING_URI")}
    args = {"repo": repo, "blocked": blocked, "tracking": logged["tracking"], "cases": {
        "forecaster": {"uri": logged["uri"], "file": str(features_file)},
        "cost": {"uri": logged["cost_uri"], "file": str(logged["cost_rows"])}}}
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", LOAD_SCRIPT,
                           json.dumps(args)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["importable_before"] is False and out["bubblecast_before"] == []
    assert not out["bubblecast_file"].startswith(repo)  # the logged copy: code_paths
    assert Path(out["bubblecast_file"]).parent.name == "bubblecast"
    rows = pd.read_parquet(logged["cost_rows"])
    want = {"forecaster": expected(logged["model"], features_file),
            "cost": pd.DataFrame(logged["cost_model"].predict(rows, quantiles=(0.1, 0.5, 0.9)),
                                 columns=["p10", "p50", "p90"])}
    assert len(out["predictions"]) == 6
    for key, got in out["predictions"].items():
        expect = want[key.split("/")[0]]
        assert list(got) == list(expect.columns), key
        np.testing.assert_array_equal(pd.DataFrame(got).to_numpy(), expect.to_numpy(),
                                      err_msg=key)
    assert out["h5_only"] == ["p10_h5", "p50_h5", "p90_h5"]


@pytest.mark.slow  # mlflow models serve takes ~25 s to answer /ping on a loaded machine
def test_mlflow_models_serve_answers_invocations(logged, features_file):
    import httpx

    port = free_port()
    env = {**os.environ, "MLFLOW_TRACKING_URI": logged["tracking"],
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("PYTHONPATH", None)
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "models", "serve", "-m",
                             logged["uri"], "--env-manager", "local", "-h", "127.0.0.1",
                             "-p", str(port), "-w", "1"], env=env, cwd=logged["tmp"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        with httpx.Client(trust_env=False, timeout=60) as http:
            while True:
                assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
                assert time.monotonic() < deadline, "mlflow models serve never answered /ping"
                try:
                    if http.get(f"http://127.0.0.1:{port}/ping", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.3)
            rows = pd.read_parquet(features_file).iloc[::97]
            split = json.loads(rows.to_json(orient="split", index=False, double_precision=15))
            body = {"dataframe_split": split, "params": {"horizons": [5]}}
            reply = http.post(f"http://127.0.0.1:{port}/invocations", json=body)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        proc.stderr.close()
    assert reply.status_code == 200, reply.text[:500]
    got = pd.DataFrame(reply.json()["predictions"])
    sent = pd.DataFrame(split["data"], columns=split["columns"])  # the numbers as sent
    model = logged["model"]
    want = wide_quantiles(model.predict_signal(numeric_inputs(sent, forecaster_inputs(model)),
                                               [5]))
    assert list(got.columns) == ["p10_h5", "p50_h5", "p90_h5"] and len(got) == len(rows)
    np.testing.assert_allclose(got.to_numpy(), want.to_numpy(), rtol=1e-12)


@pytest.mark.parametrize("kind", ["last", "ewma", "rolling_median", "seasonal_naive", "seq"])
def test_forecaster_inputs_are_all_a_forecaster_reads(kind, train_frame):
    model = make_model(kind, epochs=2, hidden=8).fit(train_frame)  # seq: tiny and quick
    inputs = forecaster_inputs(model)
    hz = list(model.horizons_)
    full = model.predict_signal(train_frame, hz)
    narrow = model.predict_signal(numeric_inputs(train_frame, inputs), hz)
    for h in hz:
        np.testing.assert_array_equal(narrow[h], full[h])
    assert not [c for c in inputs if c.startswith(("y", "s_h", "work"))]


def test_numeric_inputs_take_nullable_and_arrow_numbers():
    frame = pd.DataFrame({"a": pd.array([1, None, 3], dtype="Int64"),
                          "b": pd.Series([0.5, None, 2.0], dtype="float[pyarrow]"),
                          "c": pd.Categorical(["x", "y", "x"])})
    out = numeric_inputs(frame, ["b", "a"])
    assert list(out.columns) == ["b", "a"] and (out.dtypes == np.float64).all()
    np.testing.assert_array_equal(out["a"].to_numpy(), [1.0, np.nan, 3.0])
    np.testing.assert_array_equal(out["b"].to_numpy(), [0.5, np.nan, 2.0])
    with pytest.raises(BubblecastError, match="column 'c' is not numeric"):
        numeric_inputs(frame, ["c"])
    with pytest.raises(BubblecastError, match="column 'd' is missing"):
        numeric_inputs(frame, ["d"])


@pytest.fixture(autouse=True)
def _no_global_store(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
