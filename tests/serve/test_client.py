"""The fail-open client: answers when the service works, None (never an exception) otherwise."""

from __future__ import annotations

import math
import socket
import time

import pytest

from bubblecast.serve.client import CircuitBreaker, Client
from bubblecast.serve.schemas import ForecastResponse, RecommendResponse
from tests.helpers import free_port
from tests.serve.conftest import fake_server
from tests.serve.fakes import forecast_request, recommend_request

#: Generous bound for "returned within its timeout" on a shared, loaded test machine: the
#: point is that a call never hangs; benchmarks/bench_serve.py measures the real figures.
BOUND_S = 1.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_breaker_opens_after_n_failures_and_half_opens_after_cooldown():
    clock = FakeClock()
    b = CircuitBreaker(failures=3, cooldown_s=2.0, clock=clock)
    for _ in range(2):
        assert b.allow()
        b.record_failure()
    assert b.state == "closed" and b.allow()
    b.record_failure()
    assert b.state == "open" and not b.allow()
    clock.now = 1.9
    assert not b.allow()
    clock.now = 2.0
    assert b.allow() and b.state == "half_open"
    assert not b.allow()  # one trial at a time
    b.record_failure()  # the trial failed: open again, for a fresh cool-down
    assert b.state == "open" and not b.allow()
    clock.now = 4.0
    assert b.allow()
    b.record_success()
    assert b.state == "closed" and b.allow()


def test_breaker_rejects_bad_settings():
    with pytest.raises(ValueError):
        CircuitBreaker(failures=0)


def test_client_gets_answers_and_refusals_from_a_real_server(model_dir):
    with fake_server(model_dir) as (port, _), \
            Client(f"http://127.0.0.1:{port}", timeout=2.0) as c:
        out = c.forecast(forecast_request(slow_stage=1))
        assert isinstance(out, ForecastResponse) and out.ranks[1].p50[0] > 1.5
        rec = c.recommend(recommend_request(slow_stage=3))
        assert isinstance(rec, RecommendResponse) and rec.action["action"] == "repartition"
        bad = forecast_request()
        bad["horizons"] = [0]
        assert c.forecast(bad) is None  # 422: refused, not a failure of the service
        assert c.stats.rejected == 1 and "horizons[0]" in c.last_error
        assert c.breaker.state == "closed"
        nan = forecast_request()
        nan["ranks"][0]["compute_s"][0] = math.nan
        assert c.forecast(nan) is None  # not even sent; never raises


def test_client_with_and_without_the_token(model_dir, tmp_path):
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    with fake_server(model_dir, token="t0ken") as (port, _):
        url = f"http://127.0.0.1:{port}"
        with Client(url, timeout=2.0, token_file=token) as c:
            assert c.forecast(forecast_request()) is not None
        with Client(url, timeout=2.0) as c:
            assert c.forecast(forecast_request()) is None and "401" in c.last_error


def test_killed_service_gives_none_within_the_timeout_every_time(model_dir):
    with fake_server(model_dir) as (port, proc):
        c = Client(f"http://127.0.0.1:{port}", timeout=0.05, retries=2,
                   breaker=CircuitBreaker(failures=5, cooldown_s=0.05))
        # A live keep-alive connection (the first calls may miss 50 ms on a busy machine).
        assert any(c.forecast(forecast_request()) is not None for _ in range(100))
        proc.kill()
        proc.wait(timeout=10)
        times = []
        for i in range(60):
            t0 = time.perf_counter()
            out = c.forecast(forecast_request()) if i % 2 else c.recommend(recommend_request())
            times.append(time.perf_counter() - t0)
            assert out is None
            if i % 10 == 0:
                time.sleep(0.06)  # let the breaker half-open now and then
        assert max(times) < BOUND_S, max(times)
        assert c.stats.failed >= 5 and c.stats.short_circuited > 0
        c.close()


def test_hung_service_times_out_instead_of_blocking():
    """A socket that accepts connections and never answers: the read must time out."""
    port = free_port()
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", port))
        srv.listen(16)  # never accept(): the kernel completes the handshake, nobody answers
        c = Client(f"http://127.0.0.1:{port}", timeout=0.05, retries=3, backoff=0.01,
                   breaker=CircuitBreaker(failures=1000))
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            assert c.forecast(forecast_request()) is None
            times.append(time.perf_counter() - t0)
        c.close()
    assert min(times) >= 0.04  # it did wait for the answer ...
    assert max(times) < BOUND_S  # ... but only about its timeout, retries included
    assert "Timeout" in (c.last_error or "")


def test_nothing_listening_gives_none_and_opens_the_breaker():
    c = Client(f"http://127.0.0.1:{free_port()}", timeout=0.05,
               breaker=CircuitBreaker(failures=2, cooldown_s=60))
    assert [c.forecast(forecast_request()) for _ in range(5)] == [None] * 5
    assert c.breaker.state == "open" and c.stats.short_circuited == 3
    c.close()


def test_client_rejects_a_nonpositive_timeout():
    with pytest.raises(ValueError):
        Client("http://127.0.0.1:1", timeout=0)
