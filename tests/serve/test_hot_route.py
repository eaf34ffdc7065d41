"""The Guard's shortcut for ``POST /v1/forecast``: a valid request gets the very bytes the
FastAPI route gives; anything the shortcut declines is answered by the route as before."""

from __future__ import annotations

import json

import pytest

from bubblecast.serve.app import create_app
from bubblecast.serve.http_guard import Guard, _json_body
from tests.serve.conftest import TestClient
from tests.serve.fakes import forecast_request


@pytest.fixture
def both(predictor):
    """A client with the shortcut and one where it always declines (route only)."""
    fast_app = create_app(predictor)
    slow_app = create_app(predictor)
    declined: list[bytes] = []

    def decline(body: bytes) -> None:
        declined.append(body)

    for mw in slow_app.user_middleware:
        if mw.cls is Guard:
            mw.kwargs["fast"] = {"/v1/forecast": decline}
    with TestClient(fast_app) as fast, TestClient(slow_app) as slow:
        yield fast, slow, declined


def _post(client, body: bytes, ctype: str | None = "application/json"):
    headers = {"content-type": ctype} if ctype else {}
    return client.post("/v1/forecast", content=body, headers=headers)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_valid_requests_get_the_same_bytes(both, seed):
    fast, slow, declined = both
    req = forecast_request(steps=8 + seed)
    req["horizons"] = [1, 3 + seed]
    body = json.dumps(req).encode()
    a, b = _post(fast, body), _post(slow, body)
    assert a.status_code == b.status_code == 200
    assert a.content == b.content
    assert a.headers["content-type"] == b.headers["content-type"]
    assert declined == [body]  # the route-only client did ask its (declining) shortcut


@pytest.mark.parametrize("body,ctype", [
    (b"{", "application/json"),
    (b"", "application/json"),
    (json.dumps({"horizons": [1]}).encode(), "application/json"),
    (json.dumps(forecast_request()).encode(), "text/plain"),
    (json.dumps(dict(forecast_request(), horizons=[0])).encode(), None),
    (json.dumps(forecast_request()).replace("0.", "NaN", 1).encode(), "application/json"),
])
def test_declined_requests_get_the_routes_answer(both, body, ctype):
    fast, slow, _ = both
    a, b = _post(fast, body, ctype), _post(slow, body, ctype)
    assert a.status_code == b.status_code
    assert a.json() == b.json()


def test_shortcut_requests_are_counted(both):
    fast, _, _ = both
    body = json.dumps(forecast_request()).encode()
    for _ in range(3):
        assert _post(fast, body).status_code == 200
    text = fast.get("/metrics").text
    line = [x for x in text.splitlines() if "/v1/forecast" in x and 'status="200"' in x
            and x.startswith("bubblecast_requests_total")]
    assert line and float(line[0].rsplit(" ", 1)[1]) == 3.0, text


def test_json_body_media_types():
    assert _json_body([])
    assert _json_body([(b"content-type", b"application/json; charset=utf-8")])
    assert not _json_body([(b"content-type", b"text/plain")])
    assert not _json_body([(b"content-type", b"application/json"),
                           (b"content-type", b"application/json")])
