"""The FastAPI application of ``bubblecast serve``.

:func:`create_app` wires a :class:`~bubblecast.serve.predictor.Predictor` (or a source to load
one from at start-up) to the routes. A pure-ASGI guard in front of every route checks the bearer
token (constant-time), caps the request body (Content-Length and the bytes actually streamed)
and records Prometheus metrics. Forecasts run directly on the event loop, since a forecast is a
bounded sub-millisecond computation and a thread hop would cost more than it saves; a
recommendation (the policy's solver and timing engine) and a step's work plan (``POST
/v1/plan``, the planner of ``bubblecast.plan_batch``), which can take long for the largest
requests the schema allows, run in the thread pool so the loop keeps answering. Planning needs
no forecasting model (no 503); ``cost: "served"`` uses the cost model the app was created with.
A well-formed ``POST /v1/forecast``, and a well-formed ``POST /v1/plan`` of at most
:data:`FAST_PLAN_BYTES`, is answered by the guard itself from the buffered body (pydantic parses
the JSON; no routing or dependency solving); anything it declines goes to the FastAPI route, so
errors and the OpenAPI schema stay the route's. Reloads run in a worker thread and swap the
model in one assignment.
"""

from __future__ import annotations

import gc
import json
import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from bubblecast._version import __version__
from bubblecast.errors import BubblecastError
from bubblecast.serve.errors import error_body, validation_body
from bubblecast.serve.http_guard import JSON, OPEN_ROUTES, Guard, authorized, bearer
from bubblecast.serve.openapi import service_openapi
from bubblecast.serve.predictor import Predictor
from bubblecast.serve.prometheus import Metrics
from bubblecast.serve.schemas import (
    ErrorResponse,
    ForecastRequest,
    ForecastResponse,
    ModelInfoResponse,
    PlanRequest,
    PlanResponse,
    RecommendRequest,
    RecommendResponse,
    RequestError,
)

log = logging.getLogger("bubblecast.serve")

ROUTES = ("/v1/forecast", "/v1/recommend", "/v1/plan", "/v1/model", "/v1/admin/reload",
          "/healthz", "/readyz", "/metrics", "/openapi.json", "/docs")


@dataclass
class ServeConfig:
    """Service settings: ``token`` (None = no auth), body cap, alias/dir watch interval."""

    token: str | None = None
    max_body_bytes: int = 1 << 20
    watch_interval_s: float | None = None

    def __post_init__(self) -> None:
        if self.token is not None and not self.token.strip():
            raise BubblecastError("--token-file: the token is empty")
        if self.max_body_bytes < 1024:
            raise BubblecastError(f"--max-body-bytes: must be >= 1024, got {self.max_body_bytes}")
        if self.watch_interval_s is not None and not self.watch_interval_s > 0:
            raise BubblecastError(f"--watch-interval: must be > 0, got {self.watch_interval_s}")


def settle_heap() -> None:
    """Collect once, then move every object alive now (modules, the model) out of the
    cyclic collector's reach (``gc.freeze``). A full collection over them is a pause, and
    one lands every few thousand requests: every request queued behind it would see it.
    Objects made later are collected as usual (the first model's own cyclic garbage, if any,
    stays after a reload)."""
    gc.collect()
    gc.freeze()


class Service:
    """State shared by the routes: the predictor (once loaded), metrics, the watcher."""

    def __init__(self, predictor: Predictor | None, metrics: Metrics) -> None:
        self.predictor = predictor
        self.metrics = metrics
        self.load_error: str | None = None
        self.watcher: Any = None
        if predictor is not None:
            self.publish()

    def publish(self) -> None:
        info = self.predictor.info  # type: ignore[union-attr]
        self.metrics.set_model(info.name, info.version, info.alias, info.loaded_at)

    def reload(self) -> None:
        try:
            self.predictor.reload()  # type: ignore[union-attr]
        except Exception:
            self.metrics.reload("failure")
            raise
        self.metrics.reload("success")
        self.publish()


def _json(model: Any, status: int = 200) -> Response:
    return Response(model.model_dump_json(), status_code=status, media_type=JSON)


def _unready() -> Response:
    return Response(error_body("no model loaded yet"), status_code=503, media_type=JSON)


_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "the body is not JSON (or not UTF-8)"},
    401: {"model": ErrorResponse, "description": "missing or wrong bearer token"},
    413: {"model": ErrorResponse, "description": "request body too large"},
    422: {"model": ErrorResponse, "description": "invalid request; `field` names the field"},
}


#: Plan requests up to this many body bytes (about 3,000 documents) are answered on the event
#: loop (see fast_plan); larger ones (up to 16,384 documents) in the thread pool.
FAST_PLAN_BYTES = 16 * 1024

_FIELD = re.compile(r"^-{0,2}([A-Za-z_][\w.\[\]]*): (.*)$", re.DOTALL)


def plan_json(request: PlanRequest, served: Any = None) -> bytes:
    """The plan of ``request`` as ``bubblecast.plan_batch`` makes it (``WorkPlan.to_json()``
    bytes); ``served``: the app's cost model for ``cost: "served"``. RequestError (-> 422,
    naming the field) on what the planner refuses."""
    from bubblecast.policy.plan_api import plan_batch

    cost: Any = request.cost
    if cost == "served":
        if served is None:
            raise RequestError("cost", "this service has no cost model (start it with "
                                       "--cost-model DIR)")
        cost = served
    elif cost is not None:
        cost = cost.model_dump()
    try:
        plan = plan_batch(request.lengths, token_budget=request.token_budget,
                          replicas=request.replicas, microbatches=request.microbatches,
                          stages=request.stages, schedule=request.schedule, cost=cost,
                          speeds=request.speeds)
    except BubblecastError as exc:
        match = _FIELD.match(str(exc))
        raise (RequestError(match.group(1), match.group(2)) if match
               else RequestError("body", str(exc))) from None
    return json.dumps(plan.to_json(), allow_nan=False).encode()


def _lifespan(svc: Service, config: ServeConfig, load: Callable[[], Predictor] | None
              ) -> Any:
    """Start-up and shut-down: load the model in a thread when asked to, watch its source."""
    from contextlib import asynccontextmanager

    def start_watch() -> None:
        pred = svc.predictor
        src = getattr(pred, "source", None)
        if config.watch_interval_s and src is not None:
            from bubblecast.serve.registry import SourceWatcher

            try:
                initial = src.fingerprint()
            except Exception as exc:  # noqa: BLE001 - the first poll will set it
                log.warning("model watch: %s", exc)
                initial = None
            svc.watcher = SourceWatcher(src.fingerprint, svc.reload, config.watch_interval_s,
                                        initial=initial,
                                        settle=bool(getattr(src, "settles", False))).start()

    def background_load() -> None:
        try:
            svc.predictor = load()  # type: ignore[misc]
            svc.publish()
            settle_heap()
            start_watch()
        except Exception as exc:  # noqa: BLE001 - reported by /readyz, the process stays up
            svc.load_error = f"{type(exc).__name__}: {exc}"
            log.error("model load failed: %s", svc.load_error)

    @asynccontextmanager
    async def lifespan(_: FastAPI):  # type: ignore[no-untyped-def]
        if svc.predictor is None and load is not None:
            threading.Thread(target=background_load, name="bubblecast-load", daemon=True).start()
        elif svc.predictor is not None:
            settle_heap()
            start_watch()
        svc.metrics.track_gc()  # after the settling collection: count pauses while serving
        yield
        svc.metrics.untrack_gc()
        if svc.watcher is not None:
            svc.watcher.stop()

    return lifespan


def _routes(app: FastAPI, svc: Service, metrics: Metrics, expected: bytes | None,
            cost_model: Any = None) -> None:
    """Error handlers, the prediction and planning routes and the probes."""

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> Response:
        return Response(validation_body(exc.errors()), status_code=422, media_type=JSON)

    @app.exception_handler(RequestError)
    async def _refused(_: Request, exc: RequestError) -> Response:
        return Response(error_body(exc.message, exc.field), status_code=422, media_type=JSON)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        """A body FastAPI cannot parse (not UTF-8) is a 400 in the service's error form."""
        if exc.status_code == 400:
            return Response(error_body(str(exc.detail), "body"), status_code=400,
                            media_type=JSON)
        return await http_exception_handler(request, exc)

    @app.post("/v1/forecast", response_model=ForecastResponse, responses=_ERRORS)
    async def forecast(request: ForecastRequest) -> Response:
        """p10/p50/p90 seconds per rank and horizon, and the predicted bubble fraction."""
        if svc.predictor is None:
            return _unready()
        return _json(svc.predictor.forecast(request))

    @app.post("/v1/recommend", response_model=RecommendResponse, responses=_ERRORS)
    async def recommend(request: RecommendRequest) -> Response:
        """The action to take now (SPEC action JSON), step times with and without it."""
        predictor = svc.predictor
        if predictor is None:
            return _unready()
        # Policy work can be long for large plans: in the thread pool, so probes and
        # forecasts keep being answered meanwhile.
        return _json(await run_in_threadpool(predictor.recommend, request))

    @app.post("/v1/plan", response_model=PlanResponse, responses=_ERRORS)
    async def plan(request: PlanRequest) -> Response:
        """One step's work plan: documents per micro-batch per replica, in run order, and
        micro-batches per replica (``bubblecast.plan_batch``'s answer)."""
        body = await run_in_threadpool(plan_json, request, cost_model)
        return Response(body, media_type=JSON)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        """Liveness: the process answers."""
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz(request: Request) -> Response:
        """Readiness: 200 once a model is loaded, else 503. The model's name and version (or
        why loading failed) only with the bearer token, when one is configured."""
        told = authorized(dict(request.scope.get("headers") or []), expected)
        if svc.predictor is None:
            why = (svc.load_error or "loading") if told else "not ready"
            return Response(error_body(why), status_code=503, media_type=JSON)
        if not told:
            return JSONResponse({"ready": True})
        info = svc.predictor.info
        return JSONResponse({"ready": True, "model": info.name, "version": info.version})

    @app.get("/metrics", response_class=PlainTextResponse)
    async def prometheus() -> Response:
        """Prometheus text format: requests, latency histogram, model version."""
        return PlainTextResponse(metrics.render(),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")


def _model_routes(app: FastAPI, svc: Service, source: str | None) -> None:
    """``/v1/model`` and ``/v1/admin/reload``."""

    @app.get("/v1/model", response_model=ModelInfoResponse)
    async def model_info() -> Response:
        """Name, version, alias, source and training metrics of the model served."""
        if svc.predictor is None:
            return _unready()
        loaded = svc.predictor.loaded
        info = loaded.info
        horizons = loaded.model.horizons
        body = ModelInfoResponse(
            name=info.name, version=info.version, alias=info.alias, source=source or info.source,
            loaded_at=info.loaded_at, metrics=info.metrics, min_window=int(loaded.model.min_window),
            horizons=list(horizons) if horizons is not None else None,
            feature_path=getattr(loaded.model, "feature_path", None))
        return _json(body)

    @app.post("/v1/admin/reload", response_model=ModelInfoResponse,
              responses={409: {"model": ErrorResponse, "description": "reload failed; the "
                               "previous model keeps serving"}, **_ERRORS})
    async def reload() -> Response:
        """Load the model source again and swap it in without dropping requests."""
        if svc.predictor is None:
            return _unready()
        try:
            await run_in_threadpool(svc.reload)
        except Exception as exc:  # noqa: BLE001 - the old model keeps serving
            log.warning("reload failed: %s", exc)
            return Response(error_body(f"reload failed, previous model kept: {exc}", "model"),
                            status_code=409, media_type=JSON)
        return await model_info()


def create_app(predictor: Predictor | None = None, *, source: str | None = None,
               config: ServeConfig | None = None,
               load: Callable[[], Predictor] | None = None, cost_model: Any = None) -> FastAPI:
    """The service app. Give a loaded ``predictor``, or ``load`` (called in a thread at
    start-up; ``/readyz`` says 503 until it returns). ``source`` is only reported.
    ``cost_model``: what ``POST /v1/plan`` uses for ``cost: "served"`` (a loaded cost model
    or a ``WorkCost``; checked here), None for none."""
    config = config or ServeConfig()
    if cost_model is not None:
        from bubblecast.policy.plan_api import resolve_cost

        resolve_cost(cost_model, "--cost-model")
    metrics = Metrics(ROUTES)
    svc = Service(predictor, metrics)

    app = FastAPI(title="bubblecast", version=__version__, lifespan=_lifespan(svc, config, load),
                  description="Forecasts of pipeline-stage delays and recommended actions.")
    app.state.service = svc

    _routes(app, svc, metrics, bearer(config.token), cost_model)
    _model_routes(app, svc, source)
    app.openapi = service_openapi(  # type: ignore[method-assign]
        app, OPEN_ROUTES, config.token is not None,
        lambda: None if svc.predictor is None else int(svc.predictor.loaded.model.min_window))

    def fast_forecast(body: bytes) -> bytes | None:
        """``/v1/forecast`` for a valid request; None (the route answers) on anything else."""
        pred = svc.predictor
        if pred is None:
            return None
        try:
            return pred.forecast_json(ForecastRequest.model_validate_json(body))
        except Exception:  # noqa: BLE001 - the route repeats it and answers with the error
            return None

    def fast_plan(body: bytes) -> bytes | None:
        """``/v1/plan`` for a valid request of at most :data:`FAST_PLAN_BYTES` (a few thousand
        documents: milliseconds of planning, answered on the event loop without the thread
        pool's hand-offs); None (the route answers, in the thread pool) on anything else."""
        if len(body) > FAST_PLAN_BYTES:
            return None
        try:
            return plan_json(PlanRequest.model_validate_json(body), cost_model)
        except Exception:  # noqa: BLE001 - the route repeats it and answers with the error
            return None

    app.add_middleware(Guard, metrics=metrics, token=config.token,
                       max_body_bytes=config.max_body_bytes,
                       fast={"/v1/forecast": fast_forecast, "/v1/plan": fast_plan})
    return app
