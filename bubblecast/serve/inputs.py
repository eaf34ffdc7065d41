"""From a validated request to what the model reads and what it answers, checked.

Shared by ``/v1/forecast`` (:mod:`bubblecast.serve.predictor`) and ``/v1/recommend``
(:mod:`bubblecast.serve.recommend`): the request's history as a
:class:`~bubblecast.dataset.window.Window` in stage order, the refusals that depend on the
loaded model (window too short, unknown horizon, no finite forecast), and the forecast in
delay per work and in seconds. A model trained with covariates is served the request's
``device_metrics`` (:func:`request_model`), or the request is refused naming the metric.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from bubblecast.dataset.window import Window
from bubblecast.errors import BubblecastError
from bubblecast.forecast.served import ForecastModel, ModelInfo
from bubblecast.policy import speeds
from bubblecast.serve.schemas import ForecastRequest, ModelRef, Pipeline, RequestError
from bubblecast.sim.shape import PipelineShape
from bubblecast.sim.steptime import timing_shape


@dataclass(frozen=True)
class Loaded:
    """A model and its facts, swapped as one object."""

    model: ForecastModel
    info: ModelInfo
    ref: ModelRef
    covariates: tuple[str, ...] = ()  # covariate columns the model reads (covariate_reads)


@dataclass(frozen=True)
class WindowForecast:
    """Forecast of one pipeline, stages in order: delay quantiles ``(P, H, 3)``, the work each
    stage will hold ``(P, H)`` and their product, quantiles in seconds ``(P, H, 3)``."""

    index: np.ndarray  # index[s]: position in request.ranks of the rank at stage s
    window: Window
    delay_q: np.ndarray
    work_ahead: np.ndarray
    seconds: np.ndarray


def request_shape(pipe: Pipeline) -> PipelineShape:
    """The request's pipeline as THE timeable :class:`PipelineShape` (what both routes time);
    RequestError naming the field (``pipeline.<name>``) when the engine cannot time it."""
    return _shape(pipe.schedule, pipe.stages, pipe.microbatches, pipe.chunks, pipe.comm_s)


@lru_cache(maxsize=256)
def _shape(schedule: str, stages: int, microbatches: int, chunks: int, comm_s: float
           ) -> PipelineShape:
    """:func:`request_shape` of these numbers, checked once per distinct shape (the schema's
    schedules are named ones, fixed for the process; refusals are not cached)."""
    try:
        return timing_shape(schedule, stages, microbatches, chunks, comm_s)
    except BubblecastError as exc:
        name, _, rest = str(exc).partition(": ")
        if name.startswith("--") and rest:
            raise RequestError(f"pipeline.{name[2:]}", rest) from None
        raise RequestError("pipeline", str(exc)) from None


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


def covariate_reads(model: ForecastModel) -> tuple[str, ...]:
    """The covariate feature columns a served model reads: those of a served feature model's
    forecaster (``FeatureModel``); none for any other model."""
    forecaster = getattr(model, "forecaster", None)
    if forecaster is None or not hasattr(model, "origin_rows"):
        return ()
    from bubblecast.dataset.covariates import covariate_columns
    from bubblecast.dataset.online_frame import model_columns

    return tuple(covariate_columns(sorted(model_columns(forecaster))))


def _rank_metrics(req: ForecastRequest, i: int) -> Any:
    """Device-metric rows (step = window row) of ``req.ranks[i]``; nulls are unsampled."""
    import pandas as pd

    r = req.ranks[i]
    parts = []
    for metric, values in (r.device_metrics or {}).items():
        v = np.array([np.nan if x is None else x for x in values], dtype=np.float64)
        steps = np.flatnonzero(np.isfinite(v))
        parts.append(pd.DataFrame({"step": steps.astype(np.int64), "rank": r.rank,
                                   "metric": metric, "value": v[steps]}))
    if not parts:
        return pd.DataFrame({"step": np.zeros(0, np.int64), "rank": np.zeros(0, np.int64),
                             "metric": pd.Series([], dtype=str), "value": np.zeros(0)})
    return pd.concat(parts, ignore_index=True)


def request_model(loaded: Loaded, req: ForecastRequest, index: np.ndarray) -> ForecastModel:
    """The model that answers ``req``: ``loaded.model``, or, when it reads covariates, the
    same model fed the covariate features of the request's ``device_metrics``
    (:class:`~bubblecast.dataset.online_frame.WithCovariates`, ranks in stage order
    ``index``). RequestError naming the field when the request lacks what the model reads:
    a device metric on some rank, the run calendar, or known-future metrics (neither of
    which a request carries)."""
    if not loaded.covariates:
        return loaded.model
    import pandas as pd

    from bubblecast.dataset.covariates import covariate_input, missing_inputs
    from bubblecast.dataset.online_frame import WithCovariates
    from bubblecast.telemetry.metrics import is_known_future

    name = loaded.info.name
    for column in loaded.covariates:
        source = str(covariate_input(column))
        if source.startswith("calendar:") or is_known_future(source):
            what = "the run calendar" if source.startswith("calendar:") else \
                f"known-future metric '{source}' beyond the window"
            raise RequestError("ranks", f"model '{name}' reads {what} ({column}), which a "
                               "request does not carry")
    parts = []
    for i in index.tolist():
        rows = _rank_metrics(req, i)
        gaps = missing_inputs(list(loaded.covariates), rows)
        if gaps:
            metric, columns = next(iter(gaps.items()))
            have = sorted(req.ranks[i].device_metrics or {})
            carries = f"it carries only {', '.join(have)}" if have else "it carries none"
            raise RequestError(f"ranks[{i}].device_metrics", f"model '{name}' needs device "
                               f"metric '{metric}' ({columns[0]}); {carries}")
        parts.append(rows)
    return WithCovariates(loaded.model, pd.concat(parts, ignore_index=True),
                          [req.ranks[i].rank for i in index.tolist()])


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
    try:
        return speeds.checked_quantiles(q, stages, horizons)
    except speeds.UnusableForecast as exc:
        raise RequestError(exc.field, exc.message) from None


def forecast_window(loaded: Loaded, req: ForecastRequest) -> WindowForecast:
    """Quantiles in delay per work and in seconds per rank and horizon for ``req``."""
    check_servable(loaded.model, req)
    index, window = request_window(req)
    model = request_model(loaded, req, index)
    hz = list(req.horizons)
    q = checked_quantiles(model.predict_window(window, hz), window.stages, len(hz))
    work_ahead = window.cost[-1][:, None] * window.load_ahead(len(hz))
    seconds = q * work_ahead[:, :, None]
    if not np.all(np.isfinite(seconds)):
        raise RequestError("ranks", "forecast seconds overflow for this window")
    return WindowForecast(index, window, q, work_ahead, seconds)
