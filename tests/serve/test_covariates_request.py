"""A model trained with device-metric covariates, served: a request's ``device_metrics`` give
it the dataset's covariate features at the window's origin; a request without the metric the
model needs is refused with a 422 naming the field and the metric."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from bubblecast.dataset import DatasetConfig, build_dataset
from bubblecast.dataset.covariates import covariate_columns, origin_covariates
from bubblecast.errors import BubblecastError
from bubblecast.forecast.served import FeatureModel, ModelInfo
from bubblecast.serve.app import create_app
from bubblecast.serve.inputs import forecast_window
from bubblecast.serve.predictor import Predictor
from bubblecast.serve.schemas import ForecastRequest, RequestError
from bubblecast.sim.device_metrics import simulated_metrics
from bubblecast.sim.simulator import SimConfig, simulate_events

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

CONFIG = DatasetConfig(windows=(5, 20), lags=8, max_period=10, covariates="auto")
HZ = [1, 5, 10]
ORIGIN = 70


def _sim(seed: int, runs: int) -> SimConfig:
    return SimConfig(schedule="1f1b", stages=3, microbatches=4, model="uniform:12", steps=90,
                     scenario="thermal", seed=seed, runs=runs)


@pytest.fixture(scope="module")
def served():
    """A LightGBM model fitted on covariate features of thermal runs, behind the service's
    window protocol, and one held-out run with its device metrics."""
    from bubblecast.forecast.modeldir import make_model

    train = _sim(5, 3)
    frame, _ = build_dataset(simulate_events(train), CONFIG, metrics=simulated_metrics(train))
    fitted = make_model("lgbm", n_estimators=40, num_leaves=15, seed=0).fit(frame)
    fitted.dataset_config_ = CONFIG
    model = FeatureModel(fitted, CONFIG)
    test = _sim(17, 1)
    return {"model": model, "events": simulate_events(test),
            "metrics": simulated_metrics(test)}


def _request(served, metrics: pd.DataFrame | None, steps: int = ORIGIN + 1) -> dict:
    """A forecast request of the run's first ``steps`` steps (compute per rank from the
    events), each rank's device metrics per step (null where unsampled) when given."""
    ev = served["events"].frame
    comp = ev[ev["op"].isin(["F", "B", "W"]) & (ev["step"] < steps)]
    per = comp.groupby(["stage", "rank", "step"])["duration_s"].sum()
    ranks = []
    for (stage, rank), series in per.groupby(level=[0, 1]):
        row = {"rank": int(rank), "stage": int(stage),
               "compute_s": series.to_numpy(np.float64).tolist()}
        if metrics is not None:
            mine = metrics[(metrics["rank"] == rank) & (metrics["step"] < steps)]
            row["device_metrics"] = {}
            for name, part in mine.groupby("metric"):
                values: list[float | None] = [None] * steps
                for s, v in zip(part["step"], part["value"], strict=True):
                    values[int(s)] = float(v)
                row["device_metrics"][str(name)] = values
        ranks.append(row)
    return {"pipeline": {"schedule": "1f1b", "stages": 3, "microbatches": 4},
            "horizons": HZ, "ranks": ranks}


def test_origin_covariates_equal_the_datasets(served):
    """One origin's covariates, as the controller and the service build them, are the
    dataset's row at that step."""
    events, metrics = served["events"], served["metrics"]
    frame, _ = build_dataset(events, CONFIG, metrics=metrics)
    cols = [c for c in covariate_columns(frame.columns) if c.startswith("f_cov_")]
    assert len(cols) >= 9
    rows = frame[(frame["step"] == ORIGIN) & (frame["replica"] == 0)].sort_values("stage")
    ranks = events.frame.drop_duplicates("stage").sort_values("stage")["rank"].tolist()
    got = origin_covariates(metrics, ranks, ORIGIN, CONFIG)
    for col in cols:
        np.testing.assert_array_equal(got[col], rows[col].to_numpy(np.float32), err_msg=col)


def test_request_metrics_feed_the_covariate_model(served):
    model, metrics = served["model"], served["metrics"]
    predictor = Predictor(model, ModelInfo(name="cov", version="1", source="test"))
    assert predictor.loaded.covariates  # the model reads covariates
    req = ForecastRequest.model_validate(_request(served, metrics))
    fc = forecast_window(predictor.loaded, req)
    # expected: the model's own origin rows plus the covariates of the same metrics
    rows = model.origin_rows(fc.window, HZ)
    ranks = [r.rank for r in sorted(req.ranks, key=lambda r: r.stage)]
    rows = rows.assign(**origin_covariates(metrics[metrics["step"] <= ORIGIN], ranks, ORIGIN,
                                           CONFIG))
    preds = model.forecaster.predict_signal(rows, HZ)
    expect = np.stack([np.asarray(preds[h], dtype=np.float64) for h in HZ], axis=1)
    np.testing.assert_allclose(fc.delay_q, np.sort(np.maximum(expect, 0), axis=2), rtol=1e-12)
    # and the metrics matter: other readings, another forecast
    cold = metrics.assign(value=0.0)
    other = forecast_window(predictor.loaded,
                            ForecastRequest.model_validate(_request(served, cold)))
    assert not np.allclose(other.delay_q, fc.delay_q)
    # the recommendation route takes the same path (a decision, no refusal)
    rec = predictor.recommend({**_request(served, metrics), "partition": [4, 4, 4],
                               "layer_costs": [1.0] * 12})
    assert rec.reason


def test_http_forecast_with_and_without_device_metrics(served):
    client = TestClient(create_app(Predictor(served["model"], ModelInfo(
        name="cov", version="1", source="test"))))
    ok = client.post("/v1/forecast", json=_request(served, served["metrics"]))
    assert ok.status_code == 200, ok.text
    assert len(ok.json()["ranks"]) == 3
    bare = client.post("/v1/forecast", json=_request(served, None))
    assert bare.status_code == 422
    body = bare.json()
    text = str(body)
    assert "device_metrics" in text and "needs device metric" in text and "f_cov_" in text
    partial = _request(served, served["metrics"][served["metrics"]["metric"] != "power_w"])
    refused = client.post("/v1/forecast", json=partial)
    assert refused.status_code == 422 and "'power_w'" in refused.text


def test_schema_bounds_device_metrics(served):
    predictor = Predictor(served["model"], ModelInfo(name="cov", version="1", source="test"))
    req = _request(served, served["metrics"])
    req["ranks"][0]["device_metrics"]["power_w"] = [1.0] * 3  # wrong length
    with pytest.raises(RequestError, match="device_metrics.power_w: has 3 steps"):
        predictor.forecast(req)


def test_a_cut_window_reads_no_later_metric_and_steps_may_be_absolute(served):
    """The forecast guard asks at earlier origins (the window cut): covariates there read no
    metric after that origin. ``first_step`` maps window rows to absolute metric steps (the
    controller's)."""
    from dataclasses import replace

    from bubblecast.dataset.online_frame import WithCovariates
    from bubblecast.serve.inputs import request_window

    model, metrics = served["model"], served["metrics"]
    req = ForecastRequest.model_validate(_request(served, metrics))
    index, window = request_window(req)
    ranks = [req.ranks[i].rank for i in index.tolist()]
    cut = 50
    head = replace(window, compute=window.compute[:cut], cost=window.cost[:cut])
    base = WithCovariates(model, metrics, ranks).predict_window(head, HZ)
    later = metrics.assign(value=np.where(metrics["step"] >= cut, 0.0, metrics["value"]))
    np.testing.assert_array_equal(WithCovariates(model, later, ranks).predict_window(head, HZ),
                                  base)
    earlier = metrics.assign(value=np.where(metrics["step"] < cut, 0.0, metrics["value"]))
    assert not np.array_equal(WithCovariates(model, earlier, ranks).predict_window(head, HZ),
                              base)
    shifted = metrics.assign(step=metrics["step"] + 1000)
    np.testing.assert_array_equal(
        WithCovariates(model, shifted, ranks, first_step=1000).predict_window(head, HZ), base)


def test_fill_gives_nan_covariates_for_a_metric_no_rank_reports(served):
    """``fill``: the controller's choice for a metric no rank reports: NaN covariates, the
    forecast of rows where that metric's samples are NaN; without it the columns are left
    out and the model refuses the rows."""
    from dataclasses import replace

    from bubblecast.dataset.online_frame import WithCovariates
    from bubblecast.serve.inputs import request_window

    model, metrics = served["model"], served["metrics"]
    req = ForecastRequest.model_validate(_request(served, metrics))
    index, window = request_window(req)
    ranks = [req.ranks[i].rank for i in index.tolist()]
    head = replace(window, compute=window.compute[:60], cost=window.cost[:60])
    power = metrics["metric"] == "power_w"
    seen: list[pd.DataFrame] = []
    inner = model.forecaster.predict_signal
    model.forecaster.predict_signal = lambda rows, hz: seen.append(rows) or inner(rows, hz)
    try:
        filled = WithCovariates(model, metrics[~power], ranks, fill=True).predict_window(head,
                                                                                         HZ)
        cols = [c for c in seen[-1].columns if "_cov_power_w" in c]
        assert cols and seen[-1][cols].isna().all().all()
        assert seen[-1][[c for c in seen[-1].columns if "_cov_temperature" in c]].notna().any(
        ).all()
    finally:
        model.forecaster.predict_signal = inner
    blank = metrics.assign(value=np.where(power, np.nan, metrics["value"]))
    np.testing.assert_array_equal(filled, WithCovariates(model, blank, ranks).predict_window(
        head, HZ))
    with pytest.raises(BubblecastError, match="power_w"):
        WithCovariates(model, metrics[~power], ranks).predict_window(head, HZ)
