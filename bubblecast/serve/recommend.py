"""``/v1/recommend``: the predictive policy's decision for one pipeline, with its numbers.

The decision is :class:`bubblecast.policy.policies.PredictivePolicy` itself (the policy
evaluated offline), fed by the served model through :class:`WindowSpeeds`. The policy works in
*speed*: compute seconds per microbatch per unit of layer cost, i.e. ``compute / (cost x M)``;
the model's delay signal is ``compute / (cost x load)``, so speed = delay x load / M. The
response adds what the policy does not return: the predicted mean step time over its horizon
with and without the action (the timing engine, via :func:`bubblecast.policy.pipeline.
predicted_step`), the migration cost (:class:`bubblecast.policy.cost.MigrationCost`) and a
short reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from bubblecast.dataset.window import Window
from bubblecast.errors import BubblecastError
from bubblecast.forecast.served import ForecastModel
from bubblecast.policy.actions import Repartition, action_to_json
from bubblecast.policy.cost import MigrationConstants, MigrationCost
from bubblecast.policy.pipeline import Pipeline, predicted_step
from bubblecast.policy.policies import PolicyState, PredictivePolicy
from bubblecast.policy.solver import stage_work
from bubblecast.serve.predictor import Loaded, check_servable, checked_quantiles, request_window
from bubblecast.serve.schemas import RecommendRequest, RecommendResponse, RequestError


class WindowSpeeds:
    """A ``SpeedForecaster`` for the policy over one request's window.

    Models that know only some horizons are asked at those and interpolated linearly in
    between, held flat outside (as the policy's own model adapter does). The last horizons
    asked are kept in ``asked``, the last answer in ``last``.
    """

    name = "served-model"

    def __init__(self, model: ForecastModel, window: Window) -> None:
        self.model = model
        self.window = window
        self.asked: np.ndarray = np.zeros(0)
        self.last: np.ndarray | None = None

    def forecast(self, state: Any, horizons: Sequence[int] | np.ndarray) -> np.ndarray:
        hz = np.asarray(horizons, dtype=np.int64)
        w = self.window
        known = self.model.horizons
        ask = hz if known is None else np.array(sorted(known), dtype=np.int64)
        q = checked_quantiles(self.model.predict_window(w, ask.tolist()), w.stages, len(ask))
        speed = q * (w.load[-1] / w.microbatches)[:, None, None]  # (P, Ha, 3)
        if known is not None:
            idx = np.searchsorted(ask, hz)
            lo = np.clip(idx - 1, 0, len(ask) - 1)
            hi = np.clip(idx, 0, len(ask) - 1)
            span = np.where(hi > lo, ask[hi] - ask[lo], 1)
            frac = np.clip((hz - ask[lo]) / span, 0.0, 1.0)[None, :, None]
            speed = speed[:, lo] * (1 - frac) + speed[:, hi] * frac
        out = np.sort(np.transpose(speed, (1, 0, 2)), axis=2)  # (H, P, 3)
        self.asked, self.last = hz, out
        return out


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
    return PolicyState(t=t, history=speeds, partition=tuple(req.partition), costs=costs,
                       pipeline=Pipeline(pipe.schedule, pipe.stages, pipe.microbatches,
                                         pipe.chunks, pipe.comm_s),
                       migration=MigrationCost(param_bytes, constants), last_action=last)


def recommend(loaded: Loaded, req: RecommendRequest) -> RecommendResponse:
    """The predictive policy's action for ``req`` under ``loaded``'s forecasts."""
    model = loaded.model
    check_servable(model, req)
    costs = _costs(req)
    pipe = req.pipeline
    # Work a rank holds now: the layer cost of its stage(s) under the current partition.
    held = stage_work(tuple(req.partition), costs.sum(axis=1))
    held = held.reshape(pipe.chunks, pipe.stages).sum(axis=0)
    _, window = request_window(req, default_cost=np.maximum(held, 1e-12))
    speeds = window.compute / (window.cost * pipe.microbatches)  # (T, P) the policy's unit
    forecaster = WindowSpeeds(model, window)
    p = req.policy
    policy = PredictivePolicy(forecaster=forecaster, horizon=p.horizon, risk=p.risk,
                              margin=p.margin, min_gain=p.min_gain, hold=p.hold,
                              min_history=p.min_history)
    try:
        state = _state(req, speeds, costs)
        action = policy.decide(state)
    except BubblecastError as exc:
        field = getattr(exc, "field", None) or "partition"
        raise RequestError(field, str(exc)) from None
    current = tuple(req.partition)
    if forecaster.last is None:  # the policy decided before forecasting (e.g. holding)
        forecaster.forecast(state, np.array([1, p.horizon]))
    quant = forecaster.last
    hz = forecaster.asked
    plan = (1.0 - p.risk) * quant[:, :, 1] + p.risk * quant[:, :, 2]  # (H, P)
    weight = np.diff(np.r_[0, hz]).astype(np.float64)
    target = action.partition if isinstance(action, Repartition) else current
    options = [current] if target == current else [current, target]
    step, _ = predicted_step(state.pipeline, options, costs, plan)  # (K, H)
    mean = step @ weight / weight.sum()
    migration = state.migration.seconds(current, target)
    saving = float((mean[0] - mean[-1]) * p.horizon - migration)
    if isinstance(action, Repartition):
        slow = int(np.argmax(plan.mean(axis=0)))
        ratio = float(plan.mean(axis=0)[slow] / plan.mean())
        reason = (f"stage {slow} forecast {ratio:.2f}x slower than the mean per layer cost; "
                  f"{list(current)} -> {list(target)} saves {mean[0] - mean[-1]:.4g} s/step "
                  f"over {p.horizon} steps, migration {migration:.4g} s")
    else:
        reason = action.reason or "keep the current plan"
    return RecommendResponse(
        model=loaded.ref, action=action_to_json(action), step_time_s=float(mean[0]),
        step_time_with_action_s=float(mean[-1]), migration_s=float(migration),
        saving_s=saving if isinstance(action, Repartition) else 0.0, horizon=p.horizon,
        reason=reason)
