"""``/v1/recommend``: the predictive policy's decision for one pipeline, with its numbers.

The decision is :class:`bubblecast.policy.policies.PredictivePolicy` itself (the policy
evaluated offline), fed by the served model through :class:`bubblecast.policy.speeds.
ModelSpeeds` (the model's delay signal turned into the policy's speed). The response records
the policy's :class:`~bubblecast.policy.decision.Decision` as it is: the action, the predicted
mean step time over its horizon with and without it, the migration pause and the reason.
When the policy keeps the plan before predicting anything (collecting history, holding after
a move, no imbalance worth a move), the service adds the predicted step time of the current
plan (the timing engine, via :func:`bubblecast.sim.steptime.predicted_step`).

The p10-p90 intervals the policy plans on are the model's own, or, for a request naming its
``run_id`` and ``step``, adapted to that run across its requests
(:mod:`bubblecast.serve.run_intervals`; the response's ``intervals`` says which).

The policy's forecast guard (:mod:`bubblecast.policy.forecast_guard`) has no memory across requests:
each request's policy backtests the model at up to 16 past origins of the request's own window (the
window cut at each origin) and falls back to reactive when the model's realised error there is worse
than the naive forecast's; its verdict is in the reason.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from bubblecast.dataset.window import Window
from bubblecast.errors import BubblecastError
from bubblecast.forecast.conformal import AdaptiveConformal
from bubblecast.policy.actions import Repartition, action_to_json
from bubblecast.policy.cost import MigrationConstants, MigrationCost
from bubblecast.policy.decision import Decision
from bubblecast.policy.policies import PolicyState, PredictivePolicy
from bubblecast.policy.solver import stage_work
from bubblecast.policy.speeds import ModelSpeeds
from bubblecast.serve.inputs import Loaded, check_servable, request_shape, request_window
from bubblecast.serve.run_intervals import RunIntervals
from bubblecast.serve.schemas import RecommendRequest, RecommendResponse, RequestError
from bubblecast.sim.schedules import vstage_ranks
from bubblecast.sim.steptime import predicted_step


class TokensAhead:
    """The served model with the request's tokens known ahead re-aligned to the horizons it
    is asked at. ``next_tokens`` follows the request's ``horizons`` (any order), while the
    policy asks the model at its own horizons (the model's sorted ones, or the policy's): each
    asked horizon gets its known value, NaN (not known) for the others; windows cut at an
    earlier origin (the forecast guard's backtests) get none, as before."""

    def __init__(self, model: Any, ahead: dict[int, float], steps: int) -> None:
        self.model = model
        self.ahead = ahead
        self.steps = steps
        self.horizons = model.horizons
        self.min_window = model.min_window

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def predict_window(self, window: Window, horizons: list[int]) -> np.ndarray:
        if window.steps == self.steps and window.tokens is not None:
            values = np.array([self.ahead.get(int(h), np.nan) for h in horizons])
            if np.isfinite(values).any():
                window = replace(window, next_tokens=values)
        return self.model.predict_window(window, horizons)


#: Response number -> the request field it is computed from (named when it overflows).
_SOURCES = {"step_time_s": "ranks", "step_time_with_action_s": "ranks",
            "migration_s": "migration", "saving_s": "policy.horizon"}


def _checked(numbers: dict[str, float]) -> dict[str, float]:
    """``numbers`` when all are finite; RequestError naming the request field otherwise
    (a non-finite float would leave as JSON null)."""
    for name, value in numbers.items():
        if not math.isfinite(value):
            raise RequestError(_SOURCES[name], f"{name} overflows for this request")
    return numbers


def _costs(req: RecommendRequest) -> np.ndarray:
    """``(L, 3)`` per-layer F, B, W cost; single costs split by the pipeline's op weights."""
    first = req.layer_costs[0]
    if isinstance(first, tuple):
        return np.asarray(req.layer_costs, dtype=np.float64)
    w = np.asarray(req.pipeline.op_weights, dtype=np.float64)
    return np.asarray(req.layer_costs, dtype=np.float64)[:, None] * (w / w.sum())[None, :]


def _state(req: RecommendRequest, speeds: np.ndarray, costs: np.ndarray) -> PolicyState:
    pipe = req.pipeline
    mig = req.migration
    layers = costs.shape[0]
    param_bytes = np.zeros(layers) if mig.param_bytes is None else np.asarray(mig.param_bytes)
    constants = MigrationConstants(bandwidth_Bps=mig.bandwidth_bytes_per_s,
                                   fixed_pause_s=mig.pause_s,
                                   optimizer_factor=mig.optimizer_factor,
                                   parallel_links=mig.parallel_links)
    t = speeds.shape[0] - 1
    last = None if req.steps_since_action is None else t - req.steps_since_action
    shape = request_shape(pipe)
    return PolicyState(t=t, history=speeds, partition=tuple(req.partition), costs=costs,
                       pipeline=shape,
                       migration=MigrationCost.for_shape(param_bytes, constants, shape),
                       last_action=last)


def _keep_numbers(state: PolicyState, forecaster: ModelSpeeds, req: RecommendRequest,
                  decision: Decision) -> Decision:
    """``decision`` (a keep) with the predicted step time of the current plan over the
    policy's horizon, from the forecast the policy made (or one at ``[1, horizon]`` when it
    decided before forecasting)."""
    p = req.policy
    if forecaster.last is None:
        forecaster.forecast(state, np.array([1, p.horizon]))
    quant, hz = forecaster.last, forecaster.asked
    plan = (1.0 - p.risk) * quant[:, :, 1] + p.risk * quant[:, :, 2]  # type: ignore[index]
    weight = np.diff(np.r_[0, hz]).astype(np.float64)
    current = tuple(req.partition)
    step, _ = predicted_step(state.pipeline, [current], state.costs, plan)  # (1, H)
    mean = float((step @ weight / weight.sum())[0])
    return Decision(decision.action, mean, mean, state.migration.seconds(current, current),
                    decision.reason or "keep the current plan")


def recommend(loaded: Loaded, req: RecommendRequest, runs: RunIntervals) -> RecommendResponse:
    """The predictive policy's decision for ``req`` under ``loaded``'s forecasts; a request
    giving ``run_id`` and ``step`` is served its run's adapted intervals from ``runs``
    (:mod:`bubblecast.serve.run_intervals`)."""
    with runs.for_request("recommend", loaded.ref.version, req.run_id, req.step,
                          req.pipeline.stages) as aci:
        return _recommend(loaded, req, aci)


def _recommend(loaded: Loaded, req: RecommendRequest, aci: AdaptiveConformal | None
               ) -> RecommendResponse:
    """:func:`recommend` with ``aci`` the run's adaptive state (None: a fresh one, the
    model's own intervals)."""
    model = loaded.model
    check_servable(model, req)
    costs = _costs(req)
    pipe = req.pipeline
    # Work a rank holds now: the layer cost of its stage(s) under the current partition.
    held = stage_work(tuple(req.partition), costs.sum(axis=1))
    held = np.bincount(vstage_ranks(pipe.schedule, pipe.stages, pipe.chunks), weights=held,
                       minlength=pipe.stages)  # virtual stages summed per rank, any layout
    _, window = request_window(req, default_cost=np.maximum(held, 1e-12))
    ahead = {} if req.next_tokens is None else dict(zip(req.horizons, req.next_tokens,
                                                       strict=True))
    window = replace(window, next_tokens=None)  # TokensAhead gives them per asked horizon
    speeds = window.compute / (window.cost * pipe.microbatches)  # (T, P) the policy's unit
    forecaster = ModelSpeeds(TokensAhead(model, ahead, window.steps), window=window)
    if aci is not None:  # the run's state; its steps are the request's step numbers
        forecaster.aci = aci
        forecaster.offset = int(req.step) - (window.steps - 1)  # type: ignore[arg-type]
    p = req.policy
    policy = PredictivePolicy(forecaster=forecaster, horizon=p.horizon, risk=p.risk,
                              margin=p.margin, min_gain=p.min_gain, hold=p.hold,
                              min_history=p.min_history)
    try:  # overflow is checked on the numbers that come out, not warned about on the way
        with np.errstate(over="ignore", invalid="ignore"):
            state = _state(req, speeds, costs)
            decision = policy.decide(state)
            if decision.predicted_step_s is None:  # kept the plan before predicting it
                decision = _keep_numbers(state, forecaster, req, decision)
    except RequestError:
        raise
    except BubblecastError as exc:
        if str(exc).startswith("decision "):  # a predicted number that is not finite
            raise RequestError("ranks", f"predicted step times overflow for this request "
                               f"({exc})") from None
        field = getattr(exc, "field", None) or "partition"
        raise RequestError(field, str(exc)) from None
    step, after = decision.predicted_step_s, decision.predicted_step_with_action_s
    migration = decision.migration_s
    moves = isinstance(decision.action, Repartition)
    saving = (step - after) * p.horizon - migration if moves else 0.0  # type: ignore[operator]
    numbers = _checked({"step_time_s": float(step), "step_time_with_action_s": float(after),
                        "migration_s": float(migration), "saving_s": float(saving)})
    return RecommendResponse(model=loaded.ref, action=action_to_json(decision.action),
                             horizon=p.horizon, reason=decision.reason, **numbers,
                             intervals="model" if aci is None else "run")
