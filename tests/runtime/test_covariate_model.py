"""A model trained with device-metric covariates, served in the live loop (runtime/control/
covariate_model.py): the controller builds the covariate features the dataset builder built
for training, from the device metrics it gathers; one it cannot build is named, not guessed."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import pytest

from bubblecast.cli import main
from bubblecast.dataset.config import DatasetConfig
from bubblecast.dataset.window import Window
from bubblecast.errors import BubblecastError
from bubblecast.runtime.control.covariate_model import (
    GATHERED,
    CovariateModel,
    device_frame,
    load_with_covariates,
)
from bubblecast.telemetry.metrics import metrics_path, read_metrics, write_metrics

STEPS = 160


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Three simulated thermal runs with the temperature metrics the controller gathers, their
    covariate features and a LightGBM model trained on them."""
    d = tmp_path_factory.mktemp("cov-model")
    runs = d / "runs.parquet"
    assert main(["simulate", "--schedule", "1f1b", "--stages", "2", "--microbatches", "4",
                 "--steps", str(STEPS), "--scenario", "thermal", "--seed", "1", "--runs", "3",
                 "--out", str(runs)]) == 0
    metrics = read_metrics(runs)
    write_metrics(metrics[metrics["metric"].isin(GATHERED)], metrics_path(runs))
    feats, model = d / "features.parquet", d / "model"
    assert main(["dataset", str(runs), "--out", str(feats), "--covariates", "auto",
                 "--horizons", "1,5"]) == 0
    assert main(["train", str(feats), "--model", "lgbm", "--out", str(model), "--no-track",
                 "--seed", "0"]) == 0
    return {"runs": runs, "metrics": read_metrics(runs), "features": pd.read_parquet(feats),
            "model": str(model)}


def _window(steps: int) -> Window:
    rng = np.random.default_rng(0)
    return Window(compute=1.0 + 0.05 * rng.random((steps, 2)), cost=np.ones((steps, 2)),
                  microbatches=4)


def _temps(metrics: pd.DataFrame, run_id: str, upto: int) -> np.ndarray:
    m = metrics[(metrics["metric"] == "temperature_c") & (metrics["run_id"] == run_id)]
    out = np.full((upto + 1, 2), np.nan)
    for row in m[m["step"] <= upto].itertuples():
        out[row.step, row.rank] = row.value
    return out


def _capture(served: CovariateModel) -> list[pd.DataFrame]:
    """The covariate columns each fast-path forecast adds to its origin rows from now on."""
    seen: list[pd.DataFrame] = []
    inner = served.fast_features.predict

    def capture(window: Window, hz: list[int], extra: dict[str, np.ndarray]) -> np.ndarray:
        seen.append(pd.DataFrame(extra))
        return inner(window, hz, extra)

    served.fast_features.predict = capture  # type: ignore[method-assign]
    return seen


def test_live_covariates_equal_the_datasets(trained: dict[str, Any]) -> None:
    served = load_with_covariates(trained["model"])
    assert isinstance(served, CovariateModel) and served.fast  # numpy rows agree on probes
    assert served.covariates and all(c.startswith("f_cov_temperature_c")
                                     for c in served.covariates)
    seen = _capture(served)
    feats = trained["features"]
    run = str(feats["run_id"].iloc[0])
    rows = feats[feats["run_id"].astype(str) == run]
    hot = rows.loc[rows["f_cov_temperature_c_d5"].idxmax(), "step"]  # heating: covariates move
    for origin in (100, int(hot)):
        served.device = device_frame(_temps(trained["metrics"], run, origin), None)
        q = served.predict_window(_window(origin + 1), [1, 5])
        assert q.shape == (2, 2, 3) and np.isfinite(q).all()
        exact = served._forecast(_window(origin + 1), [1, 5], fast=False)  # the pandas rows
        np.testing.assert_allclose(q, exact, rtol=1e-5)
        want = rows[rows["step"] == origin].sort_values("stage")
        for col in served.covariates:
            np.testing.assert_allclose(seen[-1][col].to_numpy(np.float64),
                                       want[col].to_numpy(np.float64), rtol=1e-6,
                                       equal_nan=True, err_msg=f"{col} at step {origin}")


def test_a_metric_no_rank_reports_is_nan_and_named(trained: dict[str, Any]) -> None:
    """As the dataset gives a rank without the metric: the model was trained on such rows."""
    served = load_with_covariates(trained["model"])
    seen = _capture(served)
    q = served.predict_window(_window(100), [1])
    assert np.isfinite(q).all() and served.missing == ["temperature_c"]
    assert seen[-1][served.covariates].isna().all().all()
    served.device = device_frame(np.full((100, 2), 80.0), np.array([85.0, 85.0]))
    served.predict_window(_window(100), [5])
    assert served.missing == [] and (seen[-1]["f_cov_temperature_c"] == 80.0).all()


def test_a_model_reading_an_ungathered_metric_is_refused_at_load() -> None:
    fake = SimpleNamespace(horizons_=[1], features_=["f_cov_power_w", "f_level"],
                           horizon_features_=[], dataset_config_=DatasetConfig(horizons=(1,)),
                           predict_signal=lambda rows, hz: {})
    with pytest.raises(BubblecastError, match="device metric 'power_w'"):
        CovariateModel(fake)


EVERY, LAYERS = 10, 8


class _LiveLoop:
    """The live controller's decider on a saved model, over a 2-stage 1F1B plan of
    :data:`LAYERS` equal layers, fed blocks of :data:`EVERY` steps whose ranks report the given
    temperatures (slowdown temperature 85 C)."""

    def __init__(self, model_dir: str) -> None:
        from bubblecast.runtime.control.control_config import ControllerConfig
        from bubblecast.runtime.control.decide import Decider
        from bubblecast.runtime.plan import check_plan

        config = ControllerConfig(policy="predictive", every=EVERY, model=model_dir,
                                  timeout_s=30.0)
        self.plan = check_plan("1f1b", 2, 4, LAYERS)
        self.decider = Decider(config, self.plan, np.full(LAYERS, 1e3))
        self.model = self.decider.forecaster.inner.model  # type: ignore[union-attr]
        self.samples = [{"layer": i, "forward_s": 0.1, "total_s": 0.3} for i in range(LAYERS)]

    def feed(self, block: int, temps: list[np.ndarray]) -> int:
        """Observe block ``block`` (``temps[r]``: rank ``r``'s temperature per step); its last
        step."""
        from bubblecast.runtime.control.observe import pack

        steps = list(range(block * EVERY, (block + 1) * EVERY))
        rows = np.stack([pack([1.0] * EVERY, EVERY, self.samples, LAYERS, t, 85.0)
                         for t in temps])
        self.decider.observe(rows, [(s, self.plan.partition, 4) for s in steps])
        return steps[-1]

    def decide(self, step: int) -> dict[str, Any]:
        return self.decider.decide(self.plan, step, None)[1]


def test_the_decider_feeds_the_model_its_gathered_temperatures(trained: dict[str, Any]) -> None:
    live = _LiveLoop(trained["model"])
    temps = _temps(trained["metrics"], str(trained["features"]["run_id"].iloc[0]), 119)
    for b in range(12):
        live.feed(b, [temps[b * EVERY:(b + 1) * EVERY, r] for r in range(2)])
    record = live.decide(119)
    model = live.model
    assert isinstance(model, CovariateModel) and "speed_plan" in record, record["reason"]
    got = model.device.frame()
    t = got[got["metric"] == "temperature_c"].pivot(index="step", columns="rank",
                                                     values="value")
    np.testing.assert_array_equal(t.to_numpy(), temps[:120])  # window rows = steps 0..119
    assert got[got["metric"] == "temperature_slowdown_c"]["value"].tolist() == [85.0, 85.0]


def test_the_learned_lead_waits_for_the_history_its_features_need(
        trained: dict[str, Any]) -> None:
    """Below the model's ``min_window`` steps the learned lead does not ask the model (its
    features cannot be built yet): the decision is the policy's own, not a failed one."""
    live = _LiveLoop(trained["model"])
    blocks = live.model.min_window // EVERY - 1
    assert blocks >= 2
    for b in range(blocks + 2):
        last = live.feed(b, [np.full(EVERY, 70.0), np.full(EVERY, 75.0)])  # both below 85
        record = live.decide(last)
        assert "failed" not in record["reason"], (last, record["reason"])


def test_the_learned_lead_holds_until_the_device_throttles(trained: dict[str, Any]) -> None:
    """A forecast rise on a rank still below its slowdown temperature is announced (the guard
    cannot score a change not yet seen); at the slowdown temperature it is not."""

    def decided(last_temp: float) -> dict[str, Any]:
        live = _LiveLoop(trained["model"])

        def rising(window: Window, hz: list[int]) -> np.ndarray:
            q = np.ones((2, len(hz), 3))
            q[1, -1] = 1.3  # rank 1 forecast to slow down 30% at the farthest horizon
            return q

        live.model.predict_window = rising
        for b in range(10):
            live.feed(b, [np.full(EVERY, 70.0), np.full(EVERY, 75.0 if b < 9 else last_temp)])
        return live.decide(99)

    hot = decided(80.0)
    assert hot["learned_lead"] == {"1": pytest.approx(1.3)}
    assert "learned lead" in hot["reason"]
    assert "learned_lead" not in decided(85.0)  # throttling: the speeds tell now


def test_the_learned_lead_holds_until_the_slowdown_shows() -> None:
    from bubblecast.runtime.control.learned_lead import LearnedLead

    lead = LearnedLead()
    hz = [1, 5, 10, 20]
    q = np.ones((2, 4, 3))
    q[1, :, :] = np.array([1.0, 1.1, 1.2, 1.4])[:, None] * [0.9, 1.0, 1.1]
    flat = np.ones(2, dtype=bool)
    assert lead.update(80, [1.0, 1.0], flat, q, hz) == {1: pytest.approx(1.4)}
    # the device throttles (no longer below), the speed not yet slower: the lead holds
    assert set(lead.update(100, [1.0, 1.1], ~flat)) == {1} and lead.onset == 80
    f = lead.forecaster(np.array([1.0, 1.1])).forecast(None, np.array([1, 10, 15, 100]))
    assert np.allclose(f[:, 0], 1.0)  # an unannounced rank: its recent speed
    assert np.allclose(f[:, 1, 1], 1.1 * np.array([1.0, 1.2, 1.3, 1.4]))  # the model's path
    assert lead.update(110, [1.0, 1.35], ~flat) == {}  # shown: 0.8 of the rise reached
    lead.update(120, [1.0, 1.0], flat, q, hz)
    assert lead.update(120 + lead.hold_steps + 1, [1.0, 1.0], ~flat) == {}  # never came
    assert LearnedLead().update(0, [1.0, 1.0], ~flat, q, hz) == {}  # throttling: no lead


class _RatioForecaster:
    """A fitted forecaster whose median at horizon 20 is ``ratio`` times that at horizon 1,
    row by row (the rows of the frame it is asked about, in order)."""

    horizons_ = [1, 5, 20]

    def __init__(self, ratio: np.ndarray) -> None:
        self.ratio = ratio

    def predict(self, frame: pd.DataFrame, horizons: list[int]) -> pd.DataFrame:
        keys = frame[["run_id", "replica", "stage", "step"]]
        return pd.concat([keys.assign(horizon=h, p50=1.0 if h == 1 else self.ratio)
                          for h in horizons], ignore_index=True)


def test_calibrate_rise_bounds_the_false_alarms_on_quiet_rows() -> None:
    """The learned lead's rise is the (1 - false_alarm) quantile of the model's forecast rise
    over the rows whose realised future holds no rise; rows with a slowdown ahead do not count,
    however large their forecast."""
    from bubblecast.runtime.control.control_config import ControllerConfig
    from bubblecast.runtime.control.decide import Decider
    from bubblecast.runtime.control.learned_lead import LearnedLead, calibrate_rise
    from bubblecast.runtime.plan import check_plan

    rng = np.random.default_rng(0)
    n = 400
    forecast = 1.0 + 0.2 * rng.random(n)  # quiet rows: a forecast rise of 0-20%
    realised = np.ones(n)
    realised[:100], forecast[:100] = 1.5, 3.0  # a slowdown ahead, forecast as such
    frame = pd.DataFrame({"run_id": "r", "replica": 0, "stage": np.arange(n) % 2,
                          "step": np.arange(n), "y_h1": 1.0, "y_h20": realised})
    cal = calibrate_rise(_RatioForecaster(forecast), frame, false_alarm=0.1)
    assert cal.quiet_rows == 300 and cal.rows == n and cal.horizons == (1, 20)
    assert cal.rise == pytest.approx(np.quantile(forecast[100:], 0.9) - 1)
    assert 0.15 < cal.rise < 0.2 and cal.false_alarm <= 0.1
    # the lead announces about that share of the quiet rows, and every row with its slowdown
    lead = LearnedLead(rise=cal.rise)
    q = np.ones((n, 2, 3))
    q[:, 1, 1] = forecast
    announced = lead.update(0, np.ones(n), np.ones(n, dtype=bool), q, [1, 20])
    assert set(range(100)) <= set(announced) and len(announced) - 100 <= 0.1 * 300
    with pytest.raises(BubblecastError, match="target column 'y_h20'"):
        calibrate_rise(_RatioForecaster(forecast), frame.drop(columns="y_h20"))
    with pytest.raises(BubblecastError, match="no row of the features is quiet"):
        calibrate_rise(_RatioForecaster(forecast), frame.assign(y_h20=2.0))
    # the controller's decider announces with the rise it is configured with
    config = ControllerConfig(policy="predictive", lead_rise=cal.rise)
    plan = check_plan("1f1b", 2, 4, 8)
    assert Decider(config, plan, np.full(8, 1e3)).learned.rise == cal.rise
