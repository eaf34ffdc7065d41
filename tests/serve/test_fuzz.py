"""Fuzzing the request schema: arbitrary and malformed JSON never gets a 5xx.

Three generators: any JSON value; a valid request with one value anywhere replaced by any
JSON value (including NaN, huge numbers, wrong types); and structurally plausible requests with
out-of-range sizes. Every answer must be 200 or a 4xx with a JSON error naming a field, and a
200 must hold only finite numbers.
"""

from __future__ import annotations

import copy
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import all_finite
from tests.serve.fakes import forecast_request, recommend_request

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])

numbers = st.one_of(st.integers(-(2**70), 2**70),
                    st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([0, -1, 1e-320, 1e308, 1e6, 1e6 + 1, 2**31, 65_536]))
scalars = st.one_of(st.none(), st.booleans(), numbers, st.text(max_size=20))
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=6),
                            st.dictionaries(st.text(max_size=10), inner, max_size=6)),
    max_leaves=30,
)


def _check(response) -> None:
    assert response.status_code < 500, response.text
    if response.status_code == 200:
        assert all_finite(response.json())
    elif response.status_code == 422:
        body = response.json()
        assert body["field"] and body["error"]


def _post(client, path: str, obj) -> object:
    return client.post(path, content=json.dumps(obj).encode(),
                       headers={"content-type": "application/json"})


def _paths(obj, prefix=()):
    """Every path into a JSON value (dict keys and list indices)."""
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


FORECAST = forecast_request(stages=3, steps=3, microbatches=3)
RECOMMEND = recommend_request(stages=3, layers_per_stage=2, steps=3, microbatches=3)
PATHS = {"/v1/forecast": list(_paths(FORECAST))[1:],
         "/v1/recommend": list(_paths(RECOMMEND))[1:]}
BASES = {"/v1/forecast": FORECAST, "/v1/recommend": RECOMMEND}


@SETTINGS
@given(route=st.sampled_from(sorted(PATHS)), body=json_values)
def test_any_json_value_is_never_a_server_error(client, route, body):
    _check(_post(client, route, body))


@SETTINGS
@given(route=st.sampled_from(sorted(PATHS)), data=st.data(), value=json_values,
       delete=st.booleans())
def test_one_corrupted_field_is_never_a_server_error(client, route, data, value, delete):
    path = data.draw(st.sampled_from(PATHS[route]))
    req = copy.deepcopy(BASES[route])
    target = req
    for k in path[:-1]:
        target = target[k]
    if delete and isinstance(target, dict):
        del target[path[-1]]
    else:
        target[path[-1]] = value
    _check(_post(client, route, req))


def _mostly(draw, good, wild):
    """A value from ``good``, or from ``wild`` at the example's wildness (percent)."""
    return draw(wild) if draw(st.integers(0, 99)) < _WILD[-1] else draw(good)


_WILD = [0]


@st.composite
def plausible(draw):
    """Requests of the right shape: mostly valid values, with sizes and values now and then
    past the limits (negative, zero, huge, missing stages, mismatched lengths)."""
    _WILD.append(draw(st.sampled_from([0, 0, 2, 10, 30])))
    stages = draw(st.integers(1, 5))
    steps = draw(st.integers(1, 5))
    good = st.floats(min_value=0.0, max_value=10.0)
    wild = st.floats(min_value=-1.0, max_value=2e6, allow_nan=False)
    schedule = draw(st.sampled_from(["gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2"]))
    chunks = draw(st.integers(1, 3)) if schedule == "interleaved" else 1
    order = draw(st.permutations(range(stages)))
    ranks = []
    for s in order:
        n = _mostly(draw, st.just(steps), st.integers(0, 6))
        rank = {"rank": 100 + s, "stage": _mostly(draw, st.just(s), st.integers(-1, stages)),
                "compute_s": [_mostly(draw, good, wild) for _ in range(n)]}
        if draw(st.booleans()):
            rank["work"] = [_mostly(draw, st.floats(0.5, 4.0), wild) for _ in range(n)]
        if draw(st.booleans()):
            rank["tokens"] = [_mostly(draw, st.floats(1.0, 4096.0), wild) for _ in range(n)]
        ranks.append(rank)
    if _WILD[-1] and draw(st.integers(0, 9)) == 0:
        ranks = ranks[:-1]
    mb = _mostly(draw, st.integers(1, 4).map(lambda k: k * stages), st.integers(0, 2000))
    req = {"pipeline": {"schedule": schedule, "stages": stages, "microbatches": mb,
                        "chunks": chunks, "comm_s": _mostly(draw, st.floats(0.0, 0.1), wild),
                        "op_weights": [_mostly(draw, st.floats(0.1, 3.0), wild)
                                       for _ in range(3)]},
           "horizons": _mostly(draw, st.lists(st.integers(1, 20), min_size=1, max_size=4,
                                              unique=True),
                               st.lists(st.integers(-1, 20_000), max_size=4)),
           "ranks": ranks}
    if draw(st.booleans()):
        per = draw(st.integers(1, 3))
        layers = stages * per
        req["layer_costs"] = [_mostly(draw, st.floats(0.0, 5.0), wild) for _ in range(layers)]
        req["partition"] = _mostly(draw, st.just([per] * stages),
                                   st.lists(st.integers(0, 5), min_size=1, max_size=stages + 1))
        req["migration"] = {"pause_s": _mostly(draw, st.floats(0.0, 2.0), wild),
                            "bandwidth_bytes_per_s": _mostly(draw, st.floats(1e6, 1e11), wild),
                            "param_bytes": draw(st.none() | st.just([1e8] * layers))}
        req["policy"] = {"risk": _mostly(draw, st.floats(0.0, 1.0), wild),
                         "horizon": _mostly(draw, st.integers(1, 64), st.integers(-5, 10**6)),
                         "min_history": _mostly(draw, st.integers(1, 4), st.integers(-1, 9))}
        req["steps_since_action"] = draw(st.none() | st.integers(0, 10))
    _WILD.pop()
    return req


@SETTINGS
@given(req=plausible())
def test_plausible_requests_are_served_or_refused_cleanly(client, req):
    route = "/v1/recommend" if "partition" in req else "/v1/forecast"
    _check(_post(client, route, req))


def test_the_fuzzers_reach_the_model():
    """The plausible generator is not all refusals: some examples get a 200."""
    from fastapi.testclient import TestClient

    from bubblecast.forecast.served import ModelInfo
    from bubblecast.serve.app import create_app
    from bubblecast.serve.predictor import Predictor
    from tests.serve.fakes import ScaledLast

    pred = Predictor(ScaledLast(min_window=1), ModelInfo(name="f", version="1", source="m"))
    seen: dict[int, int] = {}

    @settings(max_examples=150, deadline=None)
    @given(req=plausible())
    def run(req):
        route = "/v1/recommend" if "partition" in req else "/v1/forecast"
        r = _post(c, route, req)
        seen[r.status_code] = seen.get(r.status_code, 0) + 1

    with TestClient(create_app(pred)) as c:
        run()
    assert seen.get(200, 0) >= 20 and seen.get(422, 0) >= 20, seen
