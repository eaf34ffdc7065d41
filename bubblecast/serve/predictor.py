"""In-process predictions: the one code path behind both the HTTP service and local callers.

:class:`Predictor` holds the loaded model in a single immutable slot. A request reads the slot
once and uses that model to the end; :meth:`Predictor.reload` builds the new model completely,
then replaces the slot in one assignment, so a reload never fails or mixes an in-flight request.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
from pydantic import ValidationError
from pydantic_core import to_json

from bubblecast.forecast.conformal import AdaptiveConformal
from bubblecast.forecast.served import ForecastModel, ModelInfo, check_model
from bubblecast.serve.inputs import (
    Loaded,
    WindowForecast,
    covariate_reads,
    forecast_window,
    request_model,
    request_shape,
)
from bubblecast.serve.recommend import recommend
from bubblecast.serve.run_intervals import RunIntervals
from bubblecast.serve.schemas import (
    ForecastRequest,
    ForecastResponse,
    ModelRef,
    RankForecast,
    RecommendRequest,
    RecommendResponse,
    RequestError,
)
from bubblecast.sim.steptime import stage_op_durations, step_times

Loader = Callable[[], tuple[ForecastModel, ModelInfo]]


def validation_error(exc: ValidationError) -> RequestError:
    """The first pydantic error as a RequestError naming its field."""
    from bubblecast.serve.errors import describe

    first = describe(exc.errors(include_url=False))[0]
    return RequestError(first["field"] or "body", first["msg"])


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
        self.runs = RunIntervals()  # per-run interval adaptation (requests with run_id + step)

    @classmethod
    def from_source(cls, source: str, **options: Any) -> Predictor:
        """Load ``source`` (a model directory or ``models:/name@alias``)."""
        from bubblecast.serve.registry import ModelSource

        src = ModelSource(source, **options)
        model, info = src.load()
        return cls(model, info, loader=src.load, source=src)

    @staticmethod
    def _wrap(model: ForecastModel, info: ModelInfo) -> Loaded:
        checked = check_model(model)
        return Loaded(checked, info, ModelRef(name=info.name, version=info.version),
                      covariate_reads(checked))

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
        with self.runs.for_request("forecast", loaded.ref.version, req.run_id, req.step,
                                   fc.window.stages) as aci:
            seconds = fc.seconds if aci is None else _run_adapted(aci, fc, req.horizons,
                                                                  req.step)
        pipe = req.pipeline
        shape = request_shape(pipe)
        step, bubble = step_times(shape, stage_op_durations(shape, seconds[:, :, 1].T,
                                                            pipe.op_weights))
        per_rank = seconds.transpose(0, 2, 1).tolist()  # (P, 3, H): p10/p50/p90 lists
        ranks = []
        for s, i in enumerate(fc.index.tolist()):
            r = req.ranks[i]
            p10, p50, p90 = per_rank[s]
            ranks.append({"rank": r.rank, "stage": r.stage, "p10": p10, "p50": p50, "p90": p90})
        return loaded, {"model": None, "horizons": list(req.horizons), "ranks": ranks,
                        "bubble_fraction": bubble.tolist(), "step_time_s": step.tolist(),
                        "intervals": "model" if aci is None else "run"}

    def recommend(self, request: RecommendRequest | dict[str, Any]) -> RecommendResponse:
        """The action to take now, with predicted step times with and without it."""
        req = self._parse(RecommendRequest, request)
        loaded = self._loaded
        if loaded.covariates:  # the model fed the request's device metrics
            index = np.argsort([r.stage for r in req.ranks], kind="stable")
            loaded = replace(loaded, model=request_model(loaded, req, index), covariates=())
        return recommend(loaded, req, self.runs)

    @staticmethod
    def _parse(cls: type, request: Any) -> Any:
        if isinstance(request, cls):
            return request
        try:
            return cls.model_validate(request)
        except ValidationError as exc:
            raise validation_error(exc) from None


def _run_adapted(aci: AdaptiveConformal, fc: WindowForecast, horizons: list[int], step: int
                 ) -> np.ndarray:
    """``(P, H, 3)`` seconds with the delay intervals adapted by the run's state ``aci``
    (held for this request), the window ending at ``step``: it observes the window's delay
    signal (``Window.delay``, the unit the model forecasts in), then rescales this
    forecast's intervals."""
    aci.observe(fc.window.delay, step)
    q = aci.adjust(fc.delay_q.transpose(1, 0, 2), horizons, step)
    seconds = q.transpose(1, 0, 2) * fc.work_ahead[:, :, None]
    if not np.all(np.isfinite(seconds)):
        raise RequestError("ranks", "forecast seconds overflow for this window")
    return seconds
