"""``bubblecast serve``: the prediction service over HTTP (FastAPI + uvicorn).

The port is bound once the model is loaded, before anything is printed, and handed to
uvicorn: a busy port or an unknown host is one ``bubblecast: error:`` line and exit 2."""

from __future__ import annotations

import socket
from pathlib import Path

import typer

from bubblecast.cli import app

_LOOPBACK = ("127.0.0.1", "localhost", "::1")


@app.command()
def serve(
    model: str = typer.Option(..., "--model", help="Model directory or models:/NAME@ALIAS."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (loopback default)."),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="TCP port."),
    token_file: Path | None = typer.Option(
        None, "--token-file", help="File holding the bearer token every request must carry."),
    max_body_bytes: int = typer.Option(1 << 20, "--max-body-bytes",
                                       help="Larger request bodies get 413."),
    watch_interval: float = typer.Option(
        10.0, "--watch-interval", help="Seconds between checks that the alias (or the model "
        "directory) moved; 0 disables the watch."),
    tracking_uri: str | None = typer.Option(None, "--tracking-uri",
                                            help="MLflow tracking URI for models:/ URIs."),
    log_level: str = typer.Option("warning", "--log-level", help="uvicorn log level."),
    cost_model: str | None = typer.Option(
        None, "--cost-model", help="Cost-model directory or models:/ URI (`train --model "
        "cost`) that POST /v1/plan uses for requests with \"cost\": \"served\"."),
    workers: int = typer.Option(
        1, "--workers", min=1, max=64, help="Worker processes, each with its own copy of the "
        "model, sharing the port: one serves requests on one core, add workers for more "
        "throughput; with N > 1, /metrics and /v1/admin/reload reach one worker per request "
        "(the --watch-interval watch reloads every worker)."),
) -> None:
    """Serve forecasts and recommended actions; OpenAPI at /openapi.json."""
    import sys

    from bubblecast.errors import BubblecastError
    from bubblecast.serve.app import ServeConfig, create_app
    from bubblecast.serve.predictor import Predictor

    token = None
    if token_file is not None:
        try:
            token = token_file.read_text().strip()
        except OSError as exc:
            raise BubblecastError(f"--token-file {token_file}: {exc.strerror}") from None
    if max_body_bytes < 1024:
        raise BubblecastError(f"--max-body-bytes: must be >= 1024, got {max_body_bytes}")
    if watch_interval < 0:
        raise BubblecastError(f"--watch-interval: must be >= 0, got {watch_interval}")
    config = ServeConfig(token=token, max_body_bytes=max_body_bytes,
                         watch_interval_s=watch_interval or None)
    served_cost = None
    if cost_model is not None:
        from bubblecast.policy.plan_api import load_cost

        served_cost = load_cost(cost_model, tracking_uri)
    predictor = Predictor.from_source(model, tracking_uri=tracking_uri)
    sock = bind(host, port)  # before anything is printed: a busy port is a one-line error
    try:
        if host not in _LOOPBACK and token is None:
            print(f"bubblecast: warning: serving on {host} without --token-file",
                  file=sys.stderr)
        import uvicorn

        port = sock.getsockname()[1]  # the one the system chose for --port 0
        print(f"bubblecast: serving {predictor.info.name} version {predictor.info.version} "
              f"on http://{host}:{port}", file=sys.stderr)
        if workers > 1:
            _run_workers(sock, workers, log_level, {
                "model": model, "tracking_uri": tracking_uri, "max_body_bytes": max_body_bytes,
                "cost_model": cost_model,
                "token_file": str(token_file.resolve()) if token_file else None,
                "watch_interval_s": config.watch_interval_s})
            return
        server = uvicorn.Server(uvicorn.Config(
            create_app(predictor, source=model, config=config, cost_model=served_cost),
            host=host, port=port,
            log_level=log_level, access_log=False, server_header=False))
        server.run(sockets=[sock])
    finally:
        sock.close()


_WORKER_ENV = "BUBBLECAST_SERVE_WORKER"


def _run_workers(sock: socket.socket, workers: int, log_level: str,
                 settings: dict[str, object]) -> None:
    """uvicorn's multi-process supervisor on the bound socket: ``workers`` spawned processes,
    each building its app with :func:`worker_app` from ``settings`` (passed in the
    environment, as JSON: the token travels as its file's path, not its value)."""
    import json
    import os

    import uvicorn
    from uvicorn.supervisors import Multiprocess

    os.environ[_WORKER_ENV] = json.dumps(settings)
    config = uvicorn.Config("bubblecast.cli.serve_cmd:worker_app", factory=True,
                            workers=workers, log_level=log_level, access_log=False,
                            server_header=False)
    Multiprocess(config, sockets=[sock]).run()


def worker_app() -> object:
    """The app of one ``--workers`` process, with the model loaded before the process takes
    connections (the other workers serve meanwhile); the heap is settled at start-up."""
    import json
    import os

    from bubblecast.serve.app import ServeConfig, create_app
    from bubblecast.serve.predictor import Predictor

    s = json.loads(os.environ[_WORKER_ENV])
    token = Path(s["token_file"]).read_text().strip() if s["token_file"] else None
    config = ServeConfig(token=token, max_body_bytes=int(s["max_body_bytes"]),
                         watch_interval_s=s["watch_interval_s"])
    model, uri = str(s["model"]), s["tracking_uri"]
    served_cost = None
    if s.get("cost_model"):
        from bubblecast.policy.plan_api import load_cost

        served_cost = load_cost(s["cost_model"], uri)
    return create_app(Predictor.from_source(model, tracking_uri=uri), source=model,
                      config=config, cost_model=served_cost)


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` for uvicorn to serve on (so nothing can take the port
    between this check and the server start); BubblecastError (one line) when the address is
    unknown or the port is in use."""
    from bubblecast.errors import BubblecastError

    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except (socket.gaierror, UnicodeError) as exc:
        raise BubblecastError(f"--host {host}: unknown address ({exc})") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.set_inheritable(True)
    except OSError as exc:
        sock.close()
        raise BubblecastError(f"--port {port}: cannot listen on {host}:{port} "
                              f"({exc.strerror or exc})") from None
    return sock
