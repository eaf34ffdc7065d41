"""The fail-open client a training job uses to ask the service for forecasts and actions.

Every call is bounded by ``timeout`` seconds in total (retries and back-off included) and never
raises: it returns the parsed response, or ``None``, which means "keep the current plan". A
circuit breaker stops calling a service that keeps failing, so a dead service costs the
training loop nothing, and probes it again after a cool-down. One persistent HTTP connection
(httpx, keep-alive) avoids a TCP handshake per call.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bubblecast.errors import BubblecastError

log = logging.getLogger("bubblecast.serve.client")


@dataclass
class CircuitBreaker:
    """Closed -> open after ``failures`` consecutive failures; open -> half-open after
    ``cooldown_s``, when one trial call may pass: success closes, failure re-opens."""

    failures: int = 5
    cooldown_s: float = 1.0
    clock: Callable[[], float] = time.monotonic
    state: str = field(default="closed", init=False)
    _count: int = field(default=0, init=False, repr=False)
    _opened_at: float = field(default=0.0, init=False, repr=False)
    _trial: bool = field(default=False, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.failures < 1:
            raise BubblecastError(f"breaker failures: must be >= 1, got {self.failures}")
        if not self.cooldown_s >= 0:
            raise BubblecastError(f"breaker cooldown_s: must be >= 0, got {self.cooldown_s}")

    def allow(self) -> bool:
        """May a call go out now? (In half-open state, only one trial at a time.)"""
        with self._lock:
            if self.state == "closed":
                return True
            if self.state == "open" and self.clock() - self._opened_at >= self.cooldown_s:
                self.state = "half_open"
                self._trial = False
            if self.state == "half_open" and not self._trial:
                self._trial = True
                return True
            return False

    def record_success(self) -> None:
        with self._lock:
            self.state, self._count, self._trial = "closed", 0, False

    def record_failure(self) -> None:
        with self._lock:
            self._count += 1
            if self.state == "half_open" or self._count >= self.failures:
                if self.state != "open":
                    log.warning("bubblecast service: circuit open after %d failure(s)",
                                self._count)
                self.state, self._opened_at, self._trial = "open", self.clock(), False


@dataclass
class ClientStats:
    calls: int = 0
    ok: int = 0
    failed: int = 0
    rejected: int = 0  # 4xx: the request itself was refused
    short_circuited: int = 0


class Client:
    """``Client(url)``: ``forecast(request)`` / ``recommend(request)`` / ``plan(request)`` ->
    response or None.

    ``timeout`` bounds each call in seconds, all attempts together; ``retries`` extra attempts
    follow transport errors and 5xx (never 4xx) after ``backoff * 2**k`` seconds while time is
    left. ``token`` or ``token_file`` adds the bearer token. ``request`` is a pydantic request
    model or a plain dict.
    """

    def __init__(self, url: str, *, timeout: float = 0.05, retries: int = 1,
                 backoff: float = 0.005, breaker: CircuitBreaker | None = None,
                 token: str | None = None, token_file: str | Path | None = None) -> None:
        import httpx

        if not timeout > 0:
            raise BubblecastError(f"timeout: must be > 0 seconds, got {timeout}")
        if retries < 0 or backoff < 0:
            raise BubblecastError("retries and backoff: must be >= 0")
        if token_file is not None:
            token = Path(token_file).read_text().strip()
        self.url = url.rstrip("/")
        self.timeout = float(timeout)
        self.retries = int(retries)
        self.backoff = float(backoff)
        self.breaker = breaker if breaker is not None else CircuitBreaker()
        self.stats = ClientStats()
        self.last_error: str | None = None
        headers = {"content-type": "application/json"}
        if token:
            headers["authorization"] = f"Bearer {token}"
        self._httpx = httpx
        self._http = httpx.Client(base_url=self.url, headers=headers, trust_env=False,
                                  limits=httpx.Limits(max_connections=4,
                                                      max_keepalive_connections=4))

    def forecast(self, request: Any) -> Any | None:
        """A :class:`~bubblecast.serve.schemas.ForecastResponse`, or None."""
        from bubblecast.serve.schemas import ForecastResponse

        return self._call("/v1/forecast", request, ForecastResponse)

    def recommend(self, request: Any) -> Any | None:
        """A :class:`~bubblecast.serve.schemas.RecommendResponse`, or None."""
        from bubblecast.serve.schemas import RecommendResponse

        return self._call("/v1/recommend", request, RecommendResponse)

    def plan(self, request: Any) -> Any | None:
        """A :class:`~bubblecast.serve.schemas.PlanResponse` (``POST /v1/plan``: the step's
        work plan, as ``bubblecast.plan_batch`` gives it), or None: then keep the data
        loader's own packing. ``request`` as :class:`~bubblecast.serve.schemas.PlanRequest`
        (or its dict); a large step may need a ``timeout`` above the default."""
        from bubblecast.serve.schemas import PlanResponse

        return self._call("/v1/plan", request, PlanResponse)

    def fetch(self, path: str) -> Any:
        """``GET path`` within the client's timeout: the raw ``httpx.Response``. Unlike the
        forecast calls it raises on transport errors and touches neither the circuit breaker
        nor the stats: the caller (e.g. a decider asking ``/v1/model`` once) fails open."""
        return self._http.get(path, timeout=self.timeout)

    def close(self) -> None:
        with contextlib.suppress(Exception):  # closing never raises into the caller
            self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, path: str, request: Any, model: type) -> Any | None:
        try:
            return self._attempts(path, request, model)
        except Exception as exc:  # noqa: BLE001 - fail open: the training loop goes on
            self._fail(f"{type(exc).__name__}: {exc}")
            return None

    def _fail(self, why: str) -> None:
        self.stats.failed += 1
        self.last_error = why
        self.breaker.record_failure()
        log.debug("bubblecast service call failed: %s", why)

    def _attempts(self, path: str, request: Any, model: type) -> Any | None:
        deadline = time.monotonic() + self.timeout
        self.stats.calls += 1
        if not self.breaker.allow():
            self.stats.short_circuited += 1
            return None
        body = (request.model_dump_json().encode() if hasattr(request, "model_dump_json")
                else json.dumps(request, allow_nan=False).encode())
        httpx = self._httpx
        why = "no attempt made"
        for attempt in range(self.retries + 1):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                resp = self._http.post(path, content=body, timeout=httpx.Timeout(left))
            except httpx.HTTPError as exc:
                why = f"{type(exc).__name__}: {exc}"
            else:
                if resp.status_code == 200:
                    out = model.model_validate_json(resp.content)
                    self.stats.ok += 1
                    self.breaker.record_success()
                    return out
                if 400 <= resp.status_code < 500:
                    self.stats.rejected += 1
                    self.last_error = f"HTTP {resp.status_code}: {resp.text[:200]}"
                    self.breaker.record_success()  # the service works; the request was refused
                    log.debug("bubblecast service refused the request: %s", self.last_error)
                    return None
                why = f"HTTP {resp.status_code}"
            pause = min(self.backoff * (2**attempt), deadline - time.monotonic())
            if attempt < self.retries and pause > 0:
                time.sleep(pause)
        self._fail(why)
        return None
