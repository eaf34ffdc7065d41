"""HTTP contract: auth, body limits, 422 naming the field, metrics, model info, reload, OpenAPI."""

from __future__ import annotations

import copy
import json
import threading

import pytest

from bubblecast.forecast.served import ModelInfo
from bubblecast.serve.app import ServeConfig, create_app
from bubblecast.serve.predictor import Predictor
from tests.serve.conftest import TestClient
from tests.serve.fakes import (
    Broken,
    ScaledLast,
    forecast_request,
    load_fake,
    recommend_request,
    write_model_dir,
)


def _with(path: str, value, req=None) -> dict:
    """A copy of a valid request with the value at ``path`` (dots; ints index lists)."""
    req = copy.deepcopy(req or forecast_request())
    keys = [int(k) if k.isdigit() else k for k in path.split(".")]
    target = req
    for k in keys[:-1]:
        target = target[k]
    if value is KeyError:
        del target[keys[-1]]
    else:
        target[keys[-1]] = value
    return req


def post(client, path: str, obj) -> object:
    """POST ``obj`` as JSON; NaN and inf written as Python's json writes them."""
    return client.post(path, content=json.dumps(obj), headers={"content-type": "application/json"})


INVALID = [
    ("ranks.0.compute_s.1", -0.5, "ranks[0].compute_s[1]"),
    ("ranks.0.compute_s.1", "fast", "ranks[0].compute_s[1]"),
    ("ranks.0.compute_s.1", float("inf"), "ranks[0].compute_s[1]"),
    ("ranks.0.compute_s.1", 1e300, "ranks[0].compute_s[1]"),
    ("ranks.2.compute_s", [], "ranks[2].compute_s"),
    ("ranks.2.compute_s", [1.0] * 1025, "ranks[2].compute_s"),
    ("ranks.1.compute_s", [1.0, 1.0], "ranks[1].compute_s"),
    ("ranks.1.work", [1.0, 0.0, 1.0, 1.0], "ranks[1].work[1]"),
    ("ranks.1.tokens", [1.0], "ranks[1].tokens"),
    ("ranks.1.stage", 9, "ranks[1].stage"),
    ("ranks.1.stage", 0, "ranks[1].stage"),
    ("ranks.1.rank", 10, "ranks[1].rank"),
    ("ranks.1.rank", KeyError, "ranks[1].rank"),
    ("ranks.1.speed", 3, "ranks[1].speed"),
    ("ranks", [], "ranks"),
    ("pipeline", KeyError, "pipeline"),
    ("pipeline.stages", 5, "ranks"),
    ("pipeline.stages", "four", "pipeline.stages"),
    ("pipeline.schedule", "pipedream", "pipeline.schedule"),
    ("pipeline.microbatches", 0, "pipeline.microbatches"),
    ("pipeline.microbatches", 2000, "pipeline.microbatches"),
    ("pipeline", {"schedule": "interleaved", "stages": 4, "microbatches": 1024, "chunks": 8},
     "pipeline"),
    ("pipeline.chunks", 2, "pipeline.chunks"),
    ("horizons", [0], "horizons[0]"),
    ("horizons", [1, 1], "horizons"),
    ("horizons", [1.5], "horizons[0]"),
    ("next_tokens", [1.0], "next_tokens"),
]


@pytest.mark.parametrize("path,value,field", INVALID)
def test_invalid_forecast_requests_get_422_naming_the_field(client, path, value, field):
    r = post(client, "/v1/forecast", _with(path, value))
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["field"] == field, body
    assert body["error"].startswith(f"{field}: ")


@pytest.mark.parametrize("path,value,field", [
    ("partition", [4, 4, 4], "partition"),
    ("partition", [4, 4, 4, 5], "partition"),
    ("partition.0", 0, "partition[0]"),
    ("layer_costs.3", -1.0, "layer_costs[3]"),
    ("migration", {"bandwidth_bytes_per_s": 0}, "migration.bandwidth_bytes_per_s"),
    ("migration", {"param_bytes": [1.0]}, "migration.param_bytes"),
    ("policy", {"risk": 2}, "policy.risk"),
    ("steps_since_action", -1, "steps_since_action"),
])
def test_invalid_recommend_requests_get_422_naming_the_field(client, path, value, field):
    r = client.post("/v1/recommend", json=_with(path, value, recommend_request()))
    assert r.status_code == 422, r.text
    assert r.json()["field"] == field


def test_malformed_json_and_empty_bodies_get_422(client):
    for body in (b"", b"{", b"[1, 2]", b"null", b'"text"', b"\xff\xfe"):
        r = client.post("/v1/forecast", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 422, (body, r.text)
        assert r.json()["field"]


def test_nan_in_the_body_is_refused(client):
    text = '{"pipeline": {"stages": 1, "microbatches": 2}, "ranks": [{"rank": 0, "stage": 0, ' \
           '"compute_s": [1.0, NaN]}]}'
    r = client.post("/v1/forecast", content=text, headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["field"] == "ranks[0].compute_s[1]"


def test_a_model_that_cannot_forecast_gives_422_not_500():
    pred = Predictor(Broken(), ModelInfo(name="broken", version="1", source="mem"))
    with TestClient(create_app(pred)) as c:
        r = c.post("/v1/forecast", json=forecast_request())
    assert r.status_code == 422 and r.json()["field"] == "ranks"


@pytest.fixture
def secured(predictor):
    with TestClient(create_app(predictor, config=ServeConfig(token="s3cret",
                                                             max_body_bytes=4096))) as c:
        yield c


def test_requests_without_the_bearer_token_get_401(secured):
    req = forecast_request()
    assert secured.post("/v1/forecast", json=req).status_code == 401
    wrong = secured.post("/v1/forecast", json=req, headers={"Authorization": "Bearer s3cre"})
    assert wrong.status_code == 401 and wrong.headers["www-authenticate"] == "Bearer"
    assert secured.get("/v1/model").status_code == 401
    assert secured.get("/metrics").status_code == 401
    ok = secured.post("/v1/forecast", json=req, headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200
    assert secured.get("/healthz").status_code == 200  # probes stay open
    assert secured.get("/readyz").status_code == 200


def test_bodies_over_the_limit_get_413_declared_or_streamed(secured):
    auth = {"Authorization": "Bearer s3cret"}
    big = secured.post("/v1/forecast", content=b" " * 5000, headers=auth)
    assert big.status_code == 413 and big.json()["field"] == "body"

    def chunks():  # no Content-Length: the streamed size must be counted
        for _ in range(10):
            yield b" " * 1000

    streamed = secured.post("/v1/forecast", content=chunks(), headers=auth)
    assert streamed.status_code == 413
    small = secured.post("/v1/forecast", json=forecast_request(), headers=auth)
    assert small.status_code == 200


def test_unauthenticated_big_bodies_get_401_before_being_read(secured):
    assert secured.post("/v1/forecast", content=b" " * 5000).status_code == 401


def test_metrics_count_requests_by_route_and_status(client):
    client.post("/v1/forecast", json=forecast_request())
    client.post("/v1/forecast", json=forecast_request())
    client.post("/v1/forecast", json={})
    client.get("/no/such/route")
    text = client.get("/metrics").text
    assert 'bubblecast_requests_total{method="POST",route="/v1/forecast",status="200"} 2' in text
    assert 'bubblecast_requests_total{method="POST",route="/v1/forecast",status="422"} 1' in text
    assert 'route="other",status="404"' in text
    assert 'bubblecast_request_duration_seconds_count{route="/v1/forecast"} 3' in text
    assert 'bubblecast_request_duration_seconds_bucket{route="/v1/forecast",le="+Inf"} 3' in text
    assert 'bubblecast_model_info{name="fake",version="1",alias=""} 1' in text


def test_model_info_and_readiness(client):
    info = client.get("/v1/model").json()
    assert info["name"] == "fake" and info["version"] == "1" and info["min_window"] == 2
    assert client.get("/readyz").json()["ready"] is True


def test_readyz_is_503_until_the_model_has_loaded():
    gate = threading.Event()

    def load():
        gate.wait(10)
        return Predictor(ScaledLast(), ModelInfo(name="late", version="1", source="mem"))

    with TestClient(create_app(load=load)) as c:
        assert c.get("/healthz").status_code == 200
        assert c.get("/readyz").status_code == 503
        assert c.post("/v1/forecast", json=forecast_request()).status_code == 503
        gate.set()
        for _ in range(200):
            if c.get("/readyz").status_code == 200:
                break
            threading.Event().wait(0.01)
        assert c.get("/readyz").status_code == 200
        assert c.post("/v1/forecast", json=forecast_request()).status_code == 200


def test_admin_reload_swaps_in_the_new_model(tmp_path):
    d = write_model_dir(tmp_path / "m", scale=1.0)
    pred = Predictor.from_source(str(d), loader=load_fake)
    req = forecast_request()
    last = req["ranks"][0]["compute_s"][-1]
    with TestClient(create_app(pred)) as c:
        v1 = c.get("/v1/model").json()["version"]
        assert c.post("/v1/forecast", json=req).json()["ranks"][0]["p50"][0] == pytest.approx(last)
        write_model_dir(d, scale=3.0)
        r = c.post("/v1/admin/reload")
        assert r.status_code == 200 and r.json()["version"] != v1
        assert r.json()["metrics"]["scale"] == 3.0
        out = c.post("/v1/forecast", json=req).json()
        assert out["ranks"][0]["p50"][0] == pytest.approx(3 * last)
        (d / "model.json").write_text("{broken")
        failed = c.post("/v1/admin/reload")
        assert failed.status_code == 409  # the old model keeps serving
        assert c.post("/v1/forecast", json=req).json()["model"]["version"] == r.json()["version"]
        text = c.get("/metrics").text
        assert 'bubblecast_model_reloads_total{outcome="failure"} 1' in text


def test_openapi_publishes_the_routes_and_schemas(client):
    spec = client.get("/openapi.json").json()
    for path in ("/v1/forecast", "/v1/recommend", "/healthz", "/readyz", "/metrics",
                 "/v1/model", "/v1/admin/reload"):
        assert path in spec["paths"]
    schemas = spec["components"]["schemas"]
    assert {"ForecastRequest", "ForecastResponse", "RecommendRequest",
            "RecommendResponse"} <= set(schemas)
    assert "422" in spec["paths"]["/v1/forecast"]["post"]["responses"]


def test_served_schedules_are_rows_of_the_one_schedule_table(client):
    """The OpenAPI enum is serve.schemas.SCHEDULES, each a simulable row of sim's table, and
    only the table's multi-chunk rows take chunks."""
    from bubblecast.serve.schemas import SCHEDULES
    from bubblecast.sim.schedules import SCHEDULES as TABLE

    spec = client.get("/openapi.json").json()
    assert spec["components"]["schemas"]["Pipeline"]["properties"]["schedule"]["enum"] == \
        list(SCHEDULES)
    assert all(TABLE[name].simulable for name in SCHEDULES)
    for name in SCHEDULES:
        r = post(client, "/v1/forecast", _with("pipeline.chunks", 2, _with("pipeline.schedule",
                                                                           name)))
        assert (r.status_code == 422) == (not TABLE[name].multi_chunk), (name, r.text)
