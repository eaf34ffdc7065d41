"""A small, cheap HTTP/1.1 load generator for loopback tests and benchmarks.

Raw asyncio keep-alive connections (one per worker), so the generator spends little CPU per
request and the server under test gets most of the machine. Every run is bounded both in
requests and in wall time. With ``rate`` set the run is open-loop: request ``i`` is due at
``i / rate`` seconds and its latency counts from that due time, so a stalled server cannot
hide its queueing delay (no coordinated omission). The cyclic garbage collector is paused
for the run (as ``timeit`` does): in a benchmark process that has imported MLflow and pandas a
full collection takes 100+ ms, which would be charged to whichever requests were in flight.

Benchmarks import it as ``loadgen`` (run as scripts, ``benchmarks/`` is on the path); tests as
``benchmarks.loadgen`` (the repository root is on pytest's path).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

LOOPBACK = ("127.0.0.1", "localhost", "::1")

#: ``make(i) -> (method, path, body)`` for request ``i``.
RequestFactory = Callable[[int], tuple[str, str, bytes]]


@dataclass
class LoadResult:
    """Latencies (seconds) of completed requests, status counts and transport errors."""

    latency_s: np.ndarray
    statuses: dict[int, int]
    errors: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    sent: int = 0

    @property
    def completed(self) -> int:
        return int(self.latency_s.size)

    @property
    def throughput(self) -> float:
        return self.completed / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def percentile_ms(self, q: float) -> float:
        if not self.latency_s.size:
            return float("nan")
        return float(np.percentile(self.latency_s, q) * 1e3)


class Connection:
    """One keep-alive HTTP/1.1 connection (Content-Length or chunked responses)."""

    def __init__(self, host: str, port: int, headers: dict[str, str] | None = None) -> None:
        if host not in LOOPBACK:
            raise ValueError(f"loadgen only talks to loopback, not {host}")
        self.host, self.port = host, port
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._head = f"Host: {host}:{port}\r\n{extra}"
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await self.writer.wait_closed()
            self.writer = None

    async def request(self, method: str, path: str, body: bytes = b"",
                      content_type: str = "application/json") -> tuple[int, bytes]:
        if self.writer is None:
            await self.open()
        assert self.reader is not None and self.writer is not None
        head = (f"{method} {path} HTTP/1.1\r\n{self._head}Content-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        self.writer.write(head + body)
        status_line = await self.reader.readuntil(b"\r\n")
        status = int(status_line.split(b" ", 2)[1])
        length, chunked, close = None, False, False
        while True:
            line = await self.reader.readuntil(b"\r\n")
            if line == b"\r\n":
                break
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value.strip())
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
            elif name == b"connection" and b"close" in value.lower():
                close = True
        if chunked:
            parts = []
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                data = await self.reader.readexactly(size + 2)
                if size == 0:
                    break
                parts.append(data[:-2])
            payload = b"".join(parts)
        elif length is not None:
            payload = await self.reader.readexactly(length)
        else:
            payload = await self.reader.read()
            close = True
        if close:
            await self.close()
        return status, payload


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """No cyclic collection inside (objects alive before are frozen, then thawed after);
    reference counting still frees everything else, so memory stays bounded."""
    enabled = gc.isenabled()
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
        gc.unfreeze()


async def run_load(host: str, port: int, make: RequestFactory, *, total: int, concurrency: int,
                   time_limit_s: float, rate: float | None = None,
                   headers: dict[str, str] | None = None,
                   check: Callable[[int, bytes], bool] | None = None) -> LoadResult:
    """Send ``total`` requests over ``concurrency`` connections; stop early at the time limit.

    ``check(status, body)`` marks a response as an error when it returns False (default: any
    status other than 200).
    """
    if total < 1 or concurrency < 1 or time_limit_s <= 0:
        raise ValueError("total, concurrency and time_limit_s must be positive")
    lat = np.full(total, np.nan)
    statuses: dict[int, int] = {}
    errors: list[str] = []
    nxt = 0
    t0 = time.perf_counter()
    stop = t0 + time_limit_s
    ok = check or (lambda status, _body: status == 200)

    async def worker() -> None:
        nonlocal nxt
        conn = Connection(host, port, headers)
        try:
            while nxt < total and time.perf_counter() < stop:
                i = nxt
                nxt += 1
                method, path, body = make(i)
                due = t0 + i / rate if rate else None
                if due is not None and due > time.perf_counter():
                    await asyncio.sleep(due - time.perf_counter())
                begin = due if due is not None else time.perf_counter()
                try:
                    status, payload = await asyncio.wait_for(
                        conn.request(method, path, body), timeout=max(stop - begin, 0.001) + 5)
                except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError,
                        ValueError) as exc:
                    errors.append(f"request {i}: {type(exc).__name__}: {exc}")
                    await conn.close()
                    continue
                lat[i] = time.perf_counter() - begin
                statuses[status] = statuses.get(status, 0) + 1
                if not ok(status, payload):
                    errors.append(f"request {i}: HTTP {status}: {payload[:200]!r}")
        finally:
            await conn.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - t0
    done = lat[~np.isnan(lat)]
    return LoadResult(done, statuses, errors, elapsed, sent=min(nxt, total))


def load(host: str, port: int, make: RequestFactory, **kwargs: object) -> LoadResult:
    """Synchronous wrapper of :func:`run_load`, with the garbage collector paused."""
    with paused_gc():
        return asyncio.run(run_load(host, port, make, **kwargs))  # type: ignore[arg-type]
