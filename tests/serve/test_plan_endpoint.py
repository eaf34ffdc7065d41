"""``POST /v1/plan``: the same plan as ``bubblecast.plan_batch``, 422 naming the field on bad
input, no forecasting model needed, the served cost model, OpenAPI, metrics and the client."""

from __future__ import annotations

import pytest

import bubblecast
from bubblecast.serve.app import ServeConfig, create_app
from bubblecast.serve.client import Client
from bubblecast.serve.schemas import PlanResponse
from bubblecast.sim.documents import DocumentSource, WorkCost, draw_batches
from tests.serve.conftest import TestClient, app_server


def _lengths(total: int, seed: int = 0, budget: int = 2048, kind: str = "long-tail"
             ) -> list[int]:
    return draw_batches(DocumentSource(kind, budget), seed, 1, total)[0].tolist()


def _request(**kw) -> dict:
    req = {"lengths": _lengths(8), "token_budget": 2048, "replicas": 2, "microbatches": 4,
           "stages": 4, "schedule": "1f1b"}
    req.update(kw)
    return req


@pytest.fixture
def plan_client():
    """A client over an app with no forecasting model and a served WorkCost."""
    app = create_app(cost_model=WorkCost(per_token=1.0, per_token_sq=1e-3))
    with TestClient(app) as c:
        yield c


def _library(req: dict, cost=None) -> dict:
    keys = ("token_budget", "replicas", "microbatches", "stages", "schedule", "speeds")
    return bubblecast.plan_batch(req["lengths"], cost=cost,
                                 **{k: req[k] for k in keys if k in req}).to_json()


@pytest.mark.parametrize("extra", [
    {},
    {"speeds": [1.0, 1.7]},
    {"cost": {"per_token": 0.5, "per_token_sq": 0.002, "per_microbatch": 3.0}},
    {"lengths": _lengths(24, 3, kind="lognormal"), "replicas": 3, "microbatches": 8,
     "schedule": "gpipe", "speeds": [1.2, 1.0, 1.0]},
])
def test_the_endpoint_answers_what_plan_batch_answers(plan_client, extra):
    req = _request(**extra)
    r = plan_client.post("/v1/plan", json=req)
    assert r.status_code == 200, r.text
    assert r.json() == _library(req, req.get("cost"))
    PlanResponse.model_validate(r.json())


def test_small_bodies_on_the_event_loop_large_ones_in_the_thread_pool(plan_client, monkeypatch):
    """Both paths answer the same plan; which one ran is told by the route's own call."""
    import bubblecast.serve.app as app_module

    routed = []
    real = app_module.run_in_threadpool

    async def counting(fn, *args):
        routed.append(fn.__name__)
        return await real(fn, *args)

    monkeypatch.setattr(app_module, "run_in_threadpool", counting)
    small = _request(lengths=_lengths(16, 5, kind="lognormal"), replicas=2, microbatches=8)
    large = _request(lengths=_lengths(640, 6, budget=4096, kind="lognormal"),
                     token_budget=4096, replicas=8, microbatches=80)
    import json

    size = [len(json.dumps(r, separators=(",", ":"))) for r in (small, large)]
    assert size[0] < app_module.FAST_PLAN_BYTES < size[1]
    for req in (small, large):
        r = plan_client.post("/v1/plan", json=req)
        assert r.status_code == 200, r.text
        assert r.json() == _library(req)
    assert routed == ["plan_json"]  # the large body only


def test_the_served_cost_model_is_used_for_cost_served(plan_client):
    req = _request(cost="served")
    r = plan_client.post("/v1/plan", json=req)
    assert r.status_code == 200, r.text
    assert r.json() == _library(req, WorkCost(per_token=1.0, per_token_sq=1e-3))
    assert r.json() != _library(req)


def test_cost_served_without_a_cost_model_is_a_422_naming_cost(client):
    r = client.post("/v1/plan", json=_request(cost="served"))
    assert r.status_code == 422
    assert r.json()["field"] == "cost" and "--cost-model" in r.json()["error"]


def test_a_fallback_is_in_the_answer(plan_client):
    r = plan_client.post("/v1/plan", json={"lengths": [5, 5, 4, 3, 3], "token_budget": 10,
                                          "microbatches": 2})
    assert r.status_code == 200
    assert "loader's packing" in r.json()["fallback"]
    assert r.json()["microbatches"] == [[[0, 1], [2, 3, 4]]]


@pytest.mark.parametrize("change, field, words", [
    ({"lengths": [10, 3000, 5, 7, 8, 9, 10, 11]}, "lengths[1]",
     "longer than the token budget 2048; split it into pieces of at most 2048 tokens"),
    ({"lengths": []}, "lengths", "at least 1"),
    ({"lengths": [10, 20, 30]}, "lengths", "fewer than the 8 micro-batches"),
    ({"lengths": [10, -5, 30, 40, 5, 6, 7, 8]}, "lengths[1]", "greater than or equal to 1"),
    ({"lengths": [10, 2.5, 30, 40, 5, 6, 7, 8]}, "lengths[1]", "valid integer"),
    ({"lengths": [10, "x", 30, 40, 5, 6, 7, 8]}, "lengths[1]", "valid integer"),
    ({"token_budget": 0}, "token_budget", "greater than or equal to 1"),
    ({"cost": {"per_token": 0.0}}, "cost", "every coefficient is 0"),
    ({"cost": {"per_token": 1.0, "per_tokn_sq": 1.0}}, "cost.per_tokn_sq", "Extra inputs"),
    ({"cost": {"per_token": -1.0}}, "cost.per_token", "greater than or equal to 0"),
    ({"speeds": [1.0]}, "speeds", "expected 2 values"),
    ({"speeds": [1.0, 0.0]}, "speeds[1]", "greater than 0"),
    ({"replicas": 64, "microbatches": 128}, "microbatches", "limit 4096"),
    ({"schedule": "pipedream"}, "schedule", "Input should be"),
    ({"schedule": "dualpipev", "stages": 4, "microbatches": 4}, "microbatches",
     "dualpipev needs at least 8"),
])
def test_bad_input_is_a_422_naming_the_field(plan_client, change, field, words):
    r = plan_client.post("/v1/plan", json=_request(**change))
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["field"].startswith(field), body
    assert words in body["error"], body
    assert body["error"].startswith(f"{body['field']}: ") and "\n" not in body["error"]


def test_planning_needs_no_forecasting_model_but_does_need_the_token():
    app = create_app(config=ServeConfig(token="sekrit"))
    with TestClient(app) as c:
        assert c.post("/v1/plan", json=_request()).status_code == 401
        r = c.post("/v1/plan", json=_request(), headers={"Authorization": "Bearer sekrit"})
        assert r.status_code == 200, r.text
        assert c.get("/v1/model", headers={"Authorization": "Bearer sekrit"}).status_code == 503
        spec = c.get("/openapi.json", headers={"Authorization": "Bearer sekrit"}).json()
        metrics = c.get("/metrics", headers={"Authorization": "Bearer sekrit"}).text
    responses = spec["paths"]["/v1/plan"]["post"]["responses"]
    assert {"200", "401", "422"} <= set(responses) and "503" not in responses
    assert 'route="/v1/plan",status="200"' in metrics


def test_the_client_gets_the_plan_and_none_on_a_refusal():
    req = _request(speeds=[1.0, 1.5])
    with app_server(create_app()) as port, \
            Client(f"http://127.0.0.1:{port}", timeout=5.0) as c:
        out = c.plan(req)
        assert isinstance(out, PlanResponse)
        assert out.model_dump() == _library(req)
        assert c.plan(_request(lengths=[1, 2, 3])) is None
        assert c.stats.rejected == 1 and "fewer than the 8 micro-batches" in c.last_error


def test_serve_refuses_a_cost_model_that_is_not_one_in_one_line(model_dir, tmp_path, capsys):
    from bubblecast.cli import main

    for bad in (tmp_path / "missing", model_dir):  # nothing there; a forecaster's directory
        code = main(["serve", "--model", str(model_dir), "--cost-model", str(bad),
                     "--port", "0"])
        err = capsys.readouterr().err
        assert code == 2, err
        assert err.startswith("bubblecast: error: ") and err.count("\n") == 1
        assert str(bad) in err
