"""Issue 16, item 5 (service): /readyz reveals nothing without the token, and the OpenAPI
schema states the window minimum and documents 401 on every route that needs the token."""

from __future__ import annotations

import threading

from bubblecast.forecast.served import ModelInfo
from bubblecast.serve.app import ServeConfig, create_app
from bubblecast.serve.predictor import Predictor
from tests.serve.conftest import TestClient
from tests.serve.fakes import ScaledLast

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _app(min_window: int = 60, token: str | None = TOKEN):
    pred = Predictor(ScaledLast(min_window=min_window),
                     ModelInfo(name="secret-model", version="v42", source="memory"))
    return create_app(pred, config=ServeConfig(token=token))


def test_readyz_names_the_model_only_with_the_token():
    with TestClient(_app()) as c:
        bare = c.get("/readyz")
        wrong = c.get("/readyz", headers={"Authorization": "Bearer nope"})
        told = c.get("/readyz", headers=AUTH)
    for r in (bare, wrong):
        assert r.status_code == 200 and r.json() == {"ready": True}
        assert "secret-model" not in r.text and "v42" not in r.text
    assert told.json() == {"ready": True, "model": "secret-model", "version": "v42"}


def test_readyz_hides_why_loading_failed_without_the_token():
    gate = threading.Event()

    def load() -> Predictor:
        gate.wait(10)
        raise RuntimeError("cannot open /srv/models/secret-model/model.json")

    app = create_app(load=load, config=ServeConfig(token=TOKEN))
    with TestClient(app) as c:
        gate.set()
        for _ in range(200):
            if app.state.service.load_error:
                break
            threading.Event().wait(0.01)
        bare, told = c.get("/readyz"), c.get("/readyz", headers=AUTH)
    assert bare.status_code == told.status_code == 503
    assert "secret-model" not in bare.text and "secret-model" in told.text


def test_without_a_token_readyz_still_names_the_model():
    with TestClient(_app(token=None)) as c:
        assert c.get("/readyz").json()["model"] == "secret-model"


def test_openapi_states_the_window_minimum_of_the_served_model():
    with TestClient(_app(min_window=60)) as c:
        spec = c.get("/openapi.json", headers=AUTH).json()
    props = spec["components"]["schemas"]["RankWindow"]["properties"]
    assert props["compute_s"]["minItems"] == 60 and props["compute_s"]["maxItems"] == 1024
    assert "at least 60 steps" in props["compute_s"]["description"]
    for name in ("work", "tokens", "layers"):
        arrays = [b for b in props[name]["anyOf"] if b.get("type") == "array"]
        assert arrays and all(b["minItems"] == 60 for b in arrays)
    with TestClient(_app(min_window=12)) as c:
        spec = c.get("/openapi.json", headers=AUTH).json()
    assert spec["components"]["schemas"]["RankWindow"]["properties"]["compute_s"][
        "minItems"] == 12


def test_openapi_documents_401_on_every_route_that_needs_the_token():
    with TestClient(_app()) as c:
        spec = c.get("/openapi.json", headers=AUTH).json()
        assert c.get("/openapi.json").status_code == 401
    assert spec["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    seen = []
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            if path in ("/healthz", "/readyz"):
                assert "401" not in op["responses"] and "security" not in op
                continue
            seen.append(f"{method.upper()} {path}")
            assert "401" in op["responses"], f"{method} {path}"
            assert op["security"] == [{"bearer": []}]
    assert {"GET /v1/model", "GET /metrics", "POST /v1/forecast"} <= set(seen)
    with TestClient(_app()) as c:  # and they do answer 401 without it
        for entry in seen:
            method, path = entry.split(" ")
            assert c.request(method, path).status_code == 401, entry


def test_a_body_that_is_not_utf8_is_a_documented_400_in_the_error_form():
    """Found by schemathesis: FastAPI answered an undocumented 400 ``{"detail": ...}``."""
    with TestClient(_app()) as c:
        r = c.post("/v1/recommend", content=b"\xff", headers={**AUTH,
                                                               "content-type": "application/json"})
        spec = c.get("/openapi.json", headers=AUTH).json()
    assert r.status_code == 400 and r.json()["field"] == "body"
    assert "400" in spec["paths"]["/v1/recommend"]["post"]["responses"]
