"""Issue 16, item 1: schemathesis against the service's own OpenAPI schema; no 5xx, ever.

Two runs, each bounded (about a minute together):

- the schemathesis CLI (``st run --checks all``: server errors, status codes, content types,
  response schemas, positive and negative data, missing auth, ...) against a uvicorn server
  in this process, with the bearer token, on a model that needs 60-step windows and knows
  horizons 1, 5 and 10 and reads tokens known ahead;
- a strategy of *valid* requests (consistent stages, lengths, partitions, tokens ahead in any
  horizon order, extreme but allowed numbers), each sent and validated by schemathesis's
  checks through its Python API (``schemathesis.openapi.from_asgi``). Schema-derived data
  rarely passes the cross-field rules, so this is what reaches the model and the policy.

``tests/serve/schemathesis.toml`` lets a schema-valid request get a 422 naming the field (the
cross-field rules JSON Schema cannot state); a 5xx fails both runs.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bubblecast.forecast.served import ModelInfo
from bubblecast.serve.app import ServeConfig, create_app
from bubblecast.serve.predictor import Predictor
from tests.helpers import all_finite
from tests.serve.conftest import app_server
from tests.serve.fakes import TokenAware

schemathesis = pytest.importorskip("schemathesis")

HERE = Path(__file__).resolve().parent
TOKEN = "st-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MIN_WINDOW = 60
HORIZONS = (1, 5, 10)


def served_app() -> Any:
    """The app under test: a token, a model of 60-step windows reading tokens ahead."""
    model = TokenAware(min_window=MIN_WINDOW, horizons=HORIZONS)
    pred = Predictor(model, ModelInfo(name="st", version="1", source="memory"))
    return create_app(pred, config=ServeConfig(token=TOKEN))


def test_schemathesis_cli_checks_all_finds_nothing(tmp_path):
    """``st run --checks all`` on every operation; exit 0 means no check failed."""
    st_bin = Path(sys.executable).with_name("st")
    with app_server(served_app()) as port:
        proc = subprocess.run(
            [str(st_bin), "--config-file", str(HERE / "schemathesis.toml"), "run",
             f"http://127.0.0.1:{port}/openapi.json", "--checks", "all", "-H",
             f"Authorization: Bearer {TOKEN}", "--max-examples", "25", "--max-time", "40",
             "--seed", "16", "--workers", "1", "--no-color", "--request-timeout", "30",
             "--report", "junit", "--report-dir", str(tmp_path)],
            cwd=tmp_path, capture_output=True, text=True, timeout=240)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    generated = re.search(r"(\d+) generated", out)
    assert generated and int(generated.group(1)) >= 100, out[-2000:]
    assert "8 selected / 8 total" in out, out[:2000]
    print(f"schemathesis: {generated.group(1)} cases generated, 0 failures")


# ---- valid requests -------------------------------------------------------------------

seconds = st.one_of(st.floats(0.05, 5.0), st.sampled_from([0.0, 1e-9, 1e6]))
work = st.one_of(st.floats(0.1, 100.0), st.sampled_from([1e-300, 1e-9, 1e12]))


@st.composite
def valid_request(draw: Any, recommend: bool) -> dict[str, Any]:
    """A request every cross-field rule accepts (the model may still refuse, e.g. overflow)."""
    schedule = draw(st.sampled_from(["gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2"]))
    stages = draw(st.integers(1, 4))
    chunks = draw(st.integers(1, 2)) if schedule == "interleaved" else 1
    micro = stages * draw(st.integers(1, 4))
    steps = draw(st.integers(MIN_WINDOW, MIN_WINDOW + 6))
    horizons = draw(st.permutations(HORIZONS).flatmap(
        lambda p: st.integers(1, 3).map(lambda k: list(p[:k]))))
    with_tokens = draw(st.booleans())
    ranks = []
    for s in draw(st.permutations(range(stages))):
        flat = draw(st.booleans())  # constant history, or noisy values
        if flat:
            value = draw(seconds)
            compute = [value] * steps
        else:
            compute = draw(st.lists(st.floats(0.05, 5.0), min_size=steps, max_size=steps))
        rank: dict[str, Any] = {"rank": 1000 - s, "stage": s, "compute_s": compute}
        if draw(st.booleans()):
            rank["work"] = [draw(work)] * steps
        if with_tokens:
            rank["tokens"] = draw(st.lists(st.floats(1.0, 4096.0), min_size=steps,
                                           max_size=steps))
        ranks.append(rank)
    req: dict[str, Any] = {
        "pipeline": {"schedule": schedule, "stages": stages, "microbatches": micro,
                     "chunks": chunks, "comm_s": draw(st.floats(0.0, 0.01))},
        "horizons": horizons, "ranks": ranks}
    if draw(st.booleans()):
        req["next_tokens"] = draw(st.lists(st.floats(1.0, 1e6), min_size=len(horizons),
                                           max_size=len(horizons)))
    if recommend:
        partition = draw(st.lists(st.integers(1, 6), min_size=stages * chunks,
                                  max_size=stages * chunks))
        layers = sum(partition)
        cost = st.floats(0.1, 10.0) | st.sampled_from([0.0, 1e12])
        if draw(st.booleans()):
            costs: list[Any] = [draw(cost) for _ in range(layers)]
            costs[0] = draw(st.floats(0.1, 10.0))  # at least one layer costs > 0
        else:
            costs = [[draw(st.floats(0.1, 10.0))] * 3 for _ in range(layers)]
        req.update(partition=partition, layer_costs=costs,
                   policy={"horizon": draw(st.integers(1, 64)), "min_history": 8,
                           "risk": draw(st.floats(0.0, 1.0))},
                   migration={"param_bytes": draw(st.none() | st.just([1e9] * layers)),
                              "bandwidth_bytes_per_s": draw(st.sampled_from([1e-3, 1e10]))},
                   steps_since_action=draw(st.none() | st.integers(0, 100)))
    return req


@pytest.fixture(scope="module")
def st_schema() -> Any:
    config = schemathesis.Config.from_path(HERE / "schemathesis.toml")
    return schemathesis.openapi.from_asgi("/openapi.json", served_app(), config=config,
                                          headers=AUTH)


STATS: dict[str, dict[int, int]] = {}


@pytest.mark.parametrize("route", ["/v1/forecast", "/v1/recommend"])
def test_valid_requests_pass_every_schemathesis_check(st_schema, route):
    """Every valid request: all schemathesis checks pass, a 200 holds only finite numbers,
    a refusal is a 422 naming the field; most are answered (the model is reached)."""
    operation = st_schema[route]["POST"]
    seen = STATS.setdefault(route, {})

    @settings(max_examples=60 if route == "/v1/recommend" else 100, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(req=valid_request(route == "/v1/recommend"))
    def run(req: dict[str, Any]) -> None:
        case = operation.Case(body=req, headers=dict(AUTH))
        response = case.call_and_validate()
        seen[response.status_code] = seen.get(response.status_code, 0) + 1
        assert response.status_code in (200, 422), response.text
        body = response.json()
        if response.status_code == 200:
            assert all_finite(body)
        else:
            assert body["field"] and body["error"]

    run()
    total = sum(seen.values())
    assert seen.get(200, 0) >= total // 2, seen
    print(f"{route}: {total} valid requests, statuses {seen}")
