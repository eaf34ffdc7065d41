"""In-process predictions: the one code path behind both the HTTP service and local callers.

:class:`Predictor` holds the loaded model in a single immutable slot. A request reads the slot
once and uses that model to the end; :meth:`Predictor.reload` builds the new model completely,
then replaces the slot in one assignment, so a reload never fails or mixes an in-flight request.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import ValidationError
from pydantic_core import to_json

from bubblecast.dataset.window import Window
from bubblecast.forecast.served import ForecastModel, ModelInfo, check_model
from bubblecast.serve.pipeline import pipeline_graph, step_times
from bubblecast.serve.schemas import (
    ForecastRequest,
    ForecastResponse,
    ModelRef,
    RankForecast,
    RecommendRequest,
    RecommendResponse,
    RequestError,
)

Loader = Callable[[], tuple[ForecastModel, ModelInfo]]


@dataclass(frozen=True)
class Loaded:
    """A model and its facts, swapped as one object."""

    model: ForecastModel
    info: ModelInfo
    ref: ModelRef


@dataclass(frozen=True)
class WindowForecast:
    """Forecast of one pipeline, stages in order: delay quantiles ``(P, H, 3)``, the work each
    stage will hold ``(P, H)`` and their product, quantiles in seconds ``(P, H, 3)``."""

    index: np.ndarray  # index[s]: position in request.ranks of the rank at stage s
    window: Window
    delay_q: np.ndarray
    work_ahead: np.ndarray
    seconds: np.ndarray


def validation_error(exc: ValidationError) -> RequestError:
    """The first pydantic error as a RequestError naming its field."""
    from bubblecast.serve.errors import describe

    first = describe(exc.errors(include_url=False))[0]
    return RequestError(first["field"] or "body", first["msg"])


def _matrix(req: ForecastRequest, index: np.ndarray, name: str) -> np.ndarray | None:
    """``(steps, P)`` of a per-rank list field in stage order; None where no rank has it;
    NaN columns for ranks that lack it while others have it."""
    cols = [getattr(req.ranks[i], name) for i in index]
    if all(c is None for c in cols):
        return None
    steps = len(req.ranks[0].compute_s)
    nan = [np.nan] * steps
    return np.array([c if c is not None else nan for c in cols], dtype=np.float64).T


def request_window(req: ForecastRequest, default_cost: np.ndarray | None = None
                   ) -> tuple[np.ndarray, Window]:
    """The request's history as a :class:`Window` in stage order, and that order."""
    index = np.argsort([r.stage for r in req.ranks], kind="stable")
    compute = np.array([req.ranks[i].compute_s for i in index], dtype=np.float64).T
    cost = _matrix(req, index, "work")
    fill = np.ones(compute.shape[1]) if default_cost is None else default_cost
    cost = np.broadcast_to(fill, compute.shape).copy() if cost is None else \
        np.where(np.isfinite(cost), cost, fill[None, :])
    ahead = None if req.next_tokens is None else np.asarray(req.next_tokens, dtype=np.float64)
    return index, Window(compute=compute, cost=cost, microbatches=req.pipeline.microbatches,
                         tokens=_matrix(req, index, "tokens"),
                         layers=_matrix(req, index, "layers"), next_tokens=ahead)


def check_servable(model: ForecastModel, req: ForecastRequest) -> None:
    """RequestError when the window is too short or a horizon unknown to ``model``."""
    steps = len(req.ranks[0].compute_s)
    if steps < model.min_window:
        raise RequestError("ranks[0].compute_s", f"window of {steps} steps is too short; the "
                           f"model needs at least {model.min_window}")
    known = model.horizons
    if known is not None:
        bad = [h for h in req.horizons if h not in known]
        if bad:
            raise RequestError("horizons", f"the model does not forecast horizons {bad} "
                               f"(known: {list(known)})")


def checked_quantiles(q: np.ndarray, stages: int, horizons: int) -> np.ndarray:
    """Model output as finite, non-negative, sorted ``(stages, horizons, 3)``; RequestError
    otherwise (a model that cannot forecast this window)."""
    q = np.asarray(q, dtype=np.float64)
    expect = (stages, horizons, 3)
    if q.shape != expect or not np.all(np.isfinite(q)):
        raise RequestError("ranks", "the model gave no finite forecast for this window "
                           f"(shape {q.shape}, expected {expect})")
    return np.sort(np.maximum(q, 0.0), axis=2)


def forecast_window(loaded: Loaded, req: ForecastRequest) -> WindowForecast:
    """Quantiles in delay per work and in seconds per rank and horizon for ``req``."""
    model = loaded.model
    check_servable(model, req)
    index, window = request_window(req)
    hz = list(req.horizons)
    q = checked_quantiles(model.predict_window(window, hz), window.stages, len(hz))
    work_ahead = window.cost[-1][:, None] * window.load_ahead(len(hz))
    seconds = q * work_ahead[:, :, None]
    if not np.all(np.isfinite(seconds)):
        raise RequestError("ranks", "forecast seconds overflow for this window")
    return WindowForecast(index, window, q, work_ahead, seconds)


class Predictor:
    """Forecasts and recommendations from a loaded model, in process.

    ``Predictor(model, info)`` serves a model object; ``Predictor.from_source(uri)`` loads a
    model directory or ``models:/name@alias`` and can :meth:`reload` it later.
    """

    def __init__(self, model: ForecastModel, info: ModelInfo, *,
                 loader: Loader | None = None, source: Any = None) -> None:
        self._loaded = self._wrap(model, info)
        self._loader = loader
        self.source = source  # a ModelSource when built by from_source (watchable)
        self._reload_lock = threading.Lock()

    @classmethod
    def from_source(cls, source: str, **options: Any) -> Predictor:
        """Load ``source`` (a model directory or ``models:/name@alias``)."""
        from bubblecast.serve.registry import ModelSource

        src = ModelSource(source, **options)
        model, info = src.load()
        return cls(model, info, loader=src.load, source=src)

    @staticmethod
    def _wrap(model: ForecastModel, info: ModelInfo) -> Loaded:
        return Loaded(check_model(model), info, ModelRef(name=info.name, version=info.version))

    @property
    def loaded(self) -> Loaded:
        return self._loaded

    @property
    def info(self) -> ModelInfo:
        return self._loaded.info

    def swap(self, model: ForecastModel, info: ModelInfo) -> None:
        """Serve ``model`` from now on; requests already running finish with the old one."""
        self._loaded = self._wrap(model, info)

    def reload(self) -> ModelInfo:
        """Load the source again and swap it in; on failure the old model keeps serving."""
        if self._loader is None:
            raise RuntimeError("this predictor was built from a model object; nothing to reload")
        with self._reload_lock:
            model, info = self._loader()
            self.swap(model, info)
            return info

    def forecast(self, request: ForecastRequest | dict[str, Any]) -> ForecastResponse:
        """p10/p50/p90 seconds per rank and horizon, and the predicted bubble fraction."""
        loaded, out = self._forecast_fields(self._parse(ForecastRequest, request))
        # Every value is already a checked int or finite float list, so the response is
        # assembled without re-validation (model_construct), the same object either way.
        out["model"] = loaded.ref
        out["ranks"] = [RankForecast.model_construct(**r) for r in out["ranks"]]
        return ForecastResponse.model_construct(**out)

    def forecast_json(self, request: ForecastRequest | dict[str, Any]) -> bytes:
        """:meth:`forecast` as the JSON bytes ``model_dump_json`` gives, without building
        the response models (the service's hot path)."""
        loaded, out = self._forecast_fields(self._parse(ForecastRequest, request))
        out["model"] = {"name": loaded.ref.name, "version": loaded.ref.version}
        return to_json(out)

    def _forecast_fields(self, req: ForecastRequest) -> tuple[Loaded, dict[str, Any]]:
        """The model used and the response fields (``ForecastResponse`` order) as plain
        lists and dicts; ``model`` is left to the caller."""
        loaded = self._loaded
        fc = forecast_window(loaded, req)
        pipe = req.pipeline
        pg = pipeline_graph(pipe.schedule, pipe.stages, pipe.microbatches, pipe.chunks)
        step, bubble = step_times(pg, fc.seconds[:, :, 1].T, pipe.op_weights, pipe.comm_s)
        per_rank = fc.seconds.transpose(0, 2, 1).tolist()  # (P, 3, H): p10/p50/p90 lists
        ranks = []
        for s, i in enumerate(fc.index.tolist()):
            r = req.ranks[i]
            p10, p50, p90 = per_rank[s]
            ranks.append({"rank": r.rank, "stage": r.stage, "p10": p10, "p50": p50, "p90": p90})
        return loaded, {"model": None, "horizons": list(req.horizons), "ranks": ranks,
                        "bubble_fraction": bubble.tolist(), "step_time_s": step.tolist()}

    def recommend(self, request: RecommendRequest | dict[str, Any]) -> RecommendResponse:
        """The action to take now, with predicted step times with and without it."""
        from bubblecast.serve.recommend import recommend

        req = self._parse(RecommendRequest, request)
        return recommend(self._loaded, req)

    @staticmethod
    def _parse(cls: type, request: Any) -> Any:
        if isinstance(request, cls):
            return request
        try:
            return cls.model_validate(request)
        except ValidationError as exc:
            raise validation_error(exc) from None
