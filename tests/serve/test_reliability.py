"""Issue 16, item 1: no 5xx for a schema-valid request.

Each test reproduces a defect found by probing the service: tokens known ahead misaligned
with the model's horizons (500, or a silently wrong answer), arithmetic overflow leaking
``null`` (or a 500), ``layer_costs`` sizes the schema did not bound, and a heavy recommend
blocking the event loop so ``/healthz`` waited behind it.
"""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from bubblecast.forecast.served import ModelInfo
from bubblecast.serve.app import create_app
from bubblecast.serve.predictor import Predictor
from tests.helpers import all_finite
from tests.serve.conftest import app_server
from tests.serve.fakes import ScaledLast, TokenAware, recommend_request, token_request


def _client(model) -> httpx.Client:
    from fastapi.testclient import TestClient

    return TestClient(create_app(Predictor(model, ModelInfo(name="f", version="1",
                                                            source="memory"))))


def test_tokens_ahead_for_fewer_horizons_than_the_model_knows_is_not_a_500():
    """The issue's case: 1 stage, 60-step windows with tokens, horizons [1, 5],
    next_tokens [100, 100] (the model knows 1, 5, 10)."""
    with _client(TokenAware()) as c:
        r = c.post("/v1/recommend", json=token_request(horizons=(1, 5),
                                                       next_tokens=(100.0, 100.0)))
    assert r.status_code == 200, r.text
    assert all_finite(r.json())


def test_the_order_of_the_horizons_does_not_change_the_answer():
    """horizons [10, 5, 1] with tokens [a, b, c] is the same request as [1, 5, 10] with
    [c, b, a]; both differ from the tokens reversed (the tokens are read)."""
    a, b, c_ = 400.0, 150.0, 50.0
    with _client(TokenAware()) as c:
        desc = c.post("/v1/recommend", json=token_request(horizons=(10, 5, 1),
                                                          next_tokens=(a, b, c_))).json()
        asc = c.post("/v1/recommend", json=token_request(horizons=(1, 5, 10),
                                                         next_tokens=(c_, b, a))).json()
        swapped = c.post("/v1/recommend", json=token_request(horizons=(1, 5, 10),
                                                             next_tokens=(a, b, c_))).json()
    assert desc["step_time_s"] == asc["step_time_s"]
    assert swapped["step_time_s"] != asc["step_time_s"]


def test_tokens_ahead_with_a_model_of_any_horizon_are_not_a_500():
    """A model without fixed horizons is asked at the policy's horizons, not the request's."""
    with _client(TokenAware(horizons=None, min_window=2)) as c:
        r = c.post("/v1/recommend", json=token_request(steps=12, horizons=(1, 5),
                                                       next_tokens=(100.0, 120.0)))
    assert r.status_code == 200, r.text


def _overflowing(case: int) -> dict:
    req = recommend_request(stages=2, layers_per_stage=2, steps=8)
    for r in req["ranks"]:
        r["work"] = [1e-300] * 8
        r["compute_s"] = [1e6] * 8
    if case >= 1:
        req["layer_costs"] = [1e12] * 4
    return req


@pytest.mark.parametrize("case", [0, 1])
def test_overflow_is_a_422_naming_the_field_or_finite_numbers(case):
    """Tiny work and huge costs overflow the predicted step time: never null, never 500."""
    with _client(ScaledLast(scale=10.0)) as c:
        r = c.post("/v1/recommend", json=_overflowing(case))
    assert r.status_code in (200, 422), r.text
    if r.status_code == 422:
        body = r.json()
        assert body["field"] and "overflow" in body["error"]
    else:
        assert all_finite(r.json()) and "null" not in r.text


def test_the_schema_bounds_layer_costs_with_array_keywords():
    spec = create_app().openapi()
    field = spec["components"]["schemas"]["RecommendRequest"]["properties"]["layer_costs"]
    assert "minLength" not in json.dumps(field) and "maxLength" not in json.dumps(field)
    for branch in field["anyOf"]:
        assert branch["minItems"] == 1 and branch["maxItems"] == 1024
    for name in ("partition", "ranks", "horizons"):
        prop = spec["components"]["schemas"]["RecommendRequest"]["properties"][name]
        assert prop["minItems"] >= 1 and prop["maxItems"] <= 2048
    pipe = spec["components"]["schemas"]["Pipeline"]["properties"]
    assert pipe["stages"]["maximum"] == 256 and pipe["microbatches"]["maximum"] == 1024


def big_request(steps: int = 100) -> dict:
    """The issue's 13 KiB request: 8 stages, 1,024 layers, 1,024 microbatches."""
    return recommend_request(stages=8, layers_per_stage=128, steps=steps, microbatches=1024)


class Blocking(ScaledLast):
    """Holds its first forecast until ``release`` is set (or 20 s pass)."""

    def __init__(self) -> None:
        super().__init__(min_window=40)
        self.started = threading.Event()
        self.release = threading.Event()

    def predict_window(self, window, horizons):
        if not self.started.is_set():
            self.started.set()
            self.release.wait(timeout=20)
        return super().predict_window(window, horizons)


def test_healthz_answers_while_a_big_recommend_runs():
    """The recommend runs off the event loop: /healthz completes while the recommend is
    still inside the model (the model waits until /healthz has answered)."""
    model = Blocking()
    app = create_app(Predictor(model, ModelInfo(name="f", version="1", source="memory")))
    body = json.dumps(big_request()).encode()
    assert 12 * 1024 < len(body) < 14 * 1024
    answers: dict[str, httpx.Response] = {}

    with app_server(app) as port:
        url = f"http://127.0.0.1:{port}"

        def post() -> None:
            answers["recommend"] = httpx.post(f"{url}/v1/recommend", content=body, timeout=120,
                                              headers={"content-type": "application/json"})

        worker = threading.Thread(target=post)
        worker.start()
        assert model.started.wait(timeout=60)
        health = httpx.get(f"{url}/healthz", timeout=120)
        still_running = "recommend" not in answers and not model.release.is_set()
        model.release.set()
        worker.join(timeout=120)
    assert health.status_code == 200
    assert still_running
    assert answers["recommend"].status_code == 200, answers["recommend"].text
