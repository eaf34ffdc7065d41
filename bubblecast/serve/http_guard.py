"""The ASGI guard in front of every route of the service: bearer token, body cap, metrics.

A pure-ASGI middleware (no Starlette request objects on the hot path): it checks the bearer
token in constant time (401), caps the request body by Content-Length and by the bytes
actually streamed (413), records Prometheus metrics for every answer, and may answer a
well-formed POST itself from the buffered body (``fast`` handlers; see :class:`Guard`).
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from bubblecast.serve.errors import error_body
from bubblecast.serve.prometheus import Metrics

#: Routes answered without the bearer token: liveness and readiness probes (``/readyz``
#: names the model only to a caller with the token).
OPEN_ROUTES = frozenset({"/healthz", "/readyz"})
JSON = "application/json"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def bearer(token: str | None) -> bytes | None:
    """The ``Authorization`` header value a request must carry; None without a token."""
    return f"Bearer {token.strip()}".encode() if token else None


def authorized(headers: dict[bytes, bytes], expected: bytes | None) -> bool:
    """True when no token is configured or ``headers`` carry it (constant-time)."""
    if expected is None:
        return True
    return hmac.compare_digest(headers.get(b"authorization", b""), expected)


async def _reply(send: Send, status: int, body: bytes,
                 extra: list[tuple[bytes, bytes]] | None = None) -> None:
    headers = [(b"content-type", JSON.encode()), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status,
                "headers": headers + (extra or [])})
    await send({"type": "http.response.body", "body": body})


#: A hot-route handler: the JSON reply bytes for a body, or None to let the app answer.
FastHandler = Callable[[bytes], "bytes | None"]


def _json_body(headers: list[tuple[bytes, bytes]]) -> bool:
    """True when FastAPI would read the body as plain JSON: no content-type, or exactly one
    whose media type is ``application/json``."""
    types = [v for k, v in headers if k.lower() == b"content-type"]
    return not types or (len(types) == 1 and
                         types[0].split(b";", 1)[0].strip().lower() == b"application/json")


class Guard:
    """ASGI middleware: auth (401), body cap (413) and metrics, before any route runs.

    ``fast`` maps POST paths to handlers that answer a well-formed request straight from the
    buffered body (no routing, no dependency solving, JSON parsed by pydantic's own parser);
    whatever a handler declines (None) goes to the FastAPI route, which gives the exact
    status and error body.
    """

    def __init__(self, app: Any, metrics: Metrics, token: str | None, max_body_bytes: int,
                 fast: dict[str, FastHandler] | None = None) -> None:
        self.app = app
        self.metrics = metrics
        self.expected = bearer(token)
        self.limit = max_body_bytes
        self.fast = dict(fast or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = [500]

        async def send_status(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self._guarded(scope, receive, send_status)
        finally:
            self.metrics.observe(scope.get("method", "?"), self.metrics.route(scope["path"]),
                                 status[0], time.perf_counter() - t0)

    async def _guarded(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope.get("headers") or [])
        if scope["path"] not in OPEN_ROUTES and not authorized(headers, self.expected):
            await _reply(send, 401, error_body("missing or wrong bearer token", "Authorization"),
                         [(b"www-authenticate", b"Bearer")])
            return
        if scope.get("method") in ("POST", "PUT", "PATCH"):
            length = headers.get(b"content-length")
            if length is not None:
                try:
                    declared = int(length)
                except ValueError:
                    await _reply(send, 400, error_body("not an integer", "Content-Length"))
                    return
                if declared > self.limit:
                    await self._too_large(send)
                    return
            chunks, size = [], 0
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                body = message.get("body", b"")
                size += len(body)
                if size > self.limit:
                    await self._too_large(send)
                    return
                chunks.append(body)
                if not message.get("more_body", False):
                    break
            data = b"".join(chunks)
            handler = self.fast.get(scope["path"]) if scope.get("method") == "POST" else None
            if handler is not None and _json_body(scope.get("headers") or []):
                out = handler(data)
                if out is not None:
                    await _reply(send, 200, out)
                    return
            receive = _replay(data, receive)
        await self.app(scope, receive, send)

    async def _too_large(self, send: Send) -> None:
        await _reply(send, 413, error_body(f"request body over {self.limit} bytes", "body"))


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that yields the buffered body once, then defers to the real one."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
