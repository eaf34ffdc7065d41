"""The public, framework-neutral entry point of the per-step work planner:
:func:`plan_batch` (``bubblecast.plan_batch``).

A data loader of any stack (torchtitan, Megatron, a plain ``torch.utils.data`` loop, the
service's ``POST /v1/plan``) holds a step's document lengths before the step runs; it calls::

    plan = bubblecast.plan_batch(lengths, token_budget=4096, replicas=4, microbatches=8,
                                 stages=4, cost=None)      # None: balance token counts
    plan.microbatches[r][j]     # indices into `lengths` of replica r's j-th micro-batch

and packs each replica's micro-batches in that order. Every document is placed exactly once,
no micro-batch exceeds ``token_budget`` tokens and the plan has ``replicas * microbatches``
micro-batches in all (a replica forecast slower may run fewer, the others more). With the
loss normalised by the global batch's tokens the gradient does not depend on the plan.

``cost`` says what a micro-batch costs (:func:`resolve_cost`): ``None`` (token counts: the
hand-written heuristic), a :class:`~bubblecast.sim.documents.WorkCost`, a dict of its
coefficients, or a learned cost model (a directory, a ``models:/`` URI, or a loaded model
exposing ``.work_cost()`` and ``.kind_weights()``; one trained without ``tokens_sq`` is
refused). Bad input raises :class:`~bubblecast.errors.BubblecastError` with one line naming
the value. A plan that falls back to the loader's packing says so in ``plan.fallback`` and
in a logged warning.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from bubblecast.errors import BubblecastError
from bubblecast.policy import work_plan
from bubblecast.policy.work_plan import TOKENS, PlanConfig, WorkPlan
from bubblecast.sim.documents import WorkCost

log = logging.getLogger("bubblecast.plan")

#: The coefficients a cost dict may name (those of :class:`WorkCost`).
COEFFICIENTS: tuple[str, ...] = ("per_token", "per_token_sq", "per_document", "per_microbatch")


def _cost_from_mapping(obj: Mapping[str, Any], where: str) -> WorkCost:
    """A :class:`WorkCost` from a dict of coefficients, refusing unknown names and
    non-numbers (booleans included)."""
    unknown = sorted(set(obj) - set(COEFFICIENTS))
    if unknown:
        raise BubblecastError(f"{where}.{unknown[0]}: unknown cost coefficient (known: "
                              f"{', '.join(COEFFICIENTS)})")
    values: dict[str, float] = {}
    for name, value in obj.items():
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer,
                                                             np.floating)):
            raise BubblecastError(f"{where}.{name}: must be a number, got {value!r}")
        values[name] = float(value)
    values.setdefault("per_token", 0.0)
    return WorkCost(**values)


def _from_model(model: Any, where: str) -> tuple[WorkCost, tuple[float, float, float]]:
    """A loaded cost model's per-layer cost and F/B/W weights; refused (its own message,
    naming the model's source) when it was trained without ``tokens_sq``."""
    from bubblecast.forecast.cost_modeldir import require_tokens_sq

    require_tokens_sq(model, str(getattr(model, "source_", None) or where))
    work = model.work_cost()
    if not isinstance(work, WorkCost):
        raise BubblecastError(f"{where}: the cost model's work_cost() is not a WorkCost")
    weights = tuple(float(w) for w in model.kind_weights())
    if len(weights) != 3:
        raise BubblecastError(f"{where}: the cost model's kind_weights() must give 3 values "
                              f"(F, B, W), got {len(weights)}")
    return work, weights  # type: ignore[return-value]


def load_cost(source: str | os.PathLike[str], tracking_uri: str | None = None) -> Any:
    """A learned cost model from its directory or a ``models:/`` URI
    (``bubblecast.forecast.cost_modeldir.load_cost_model``), refused when it was trained
    without ``tokens_sq``."""
    from bubblecast.forecast.cost_modeldir import load_cost_model

    model = load_cost_model(str(source), tracking_uri)
    _from_model(model, str(source))
    return model


def resolve_cost(cost: Any, where: str = "cost"
                 ) -> tuple[WorkCost, tuple[float, float, float] | None, str]:
    """``(work cost, F/B/W weights or None, method label)`` for a ``cost`` argument (see the
    module doc): ``None`` is token balancing (label ``tokens``), anything else ``balance``.
    A string or path is loaded with :func:`load_cost`."""
    if cost is None:
        return TOKENS, None, "tokens"
    if isinstance(cost, WorkCost):
        return cost, None, "balance"
    if isinstance(cost, Mapping):
        return _cost_from_mapping(cost, where), None, "balance"
    if isinstance(cost, (str, os.PathLike)):
        cost = load_cost(cost)
    if callable(getattr(cost, "work_cost", None)) and callable(getattr(cost, "kind_weights",
                                                                       None)):
        work, weights = _from_model(cost, where)
        return work, weights, "balance"
    raise BubblecastError(f"{where}: expected None, a WorkCost, a dict of coefficients, a cost "
                          f"model directory or models:/ URI, or a loaded cost model; got "
                          f"{type(cost).__name__}")


def plan_config(*, token_budget: int, replicas: int = 1, microbatches: int = 8,
                stages: int = 1, schedule: str = "1f1b",
                kind_weights: tuple[float, float, float] | None = None) -> PlanConfig:
    """The planner's :class:`PlanConfig` (BubblecastError naming a bad field)."""
    if kind_weights is None:
        return PlanConfig(token_budget, replicas, microbatches, stages, schedule)
    return PlanConfig(token_budget, replicas, microbatches, stages, schedule, kind_weights)


def warn_fallback(plan: WorkPlan) -> WorkPlan:
    """Log a warning when ``plan`` is the loader's packing instead of a planned one."""
    if plan.fallback:
        log.warning("bubblecast plan_batch fell back: %s", plan.fallback)
    return plan


def plan_batch(lengths: Sequence[int] | np.ndarray, *, token_budget: int, replicas: int = 1,
               microbatches: int = 8, stages: int = 1, schedule: str = "1f1b",
               cost: Any = None, speeds: Any = None) -> WorkPlan:
    """Plan one step's documents: which go into which micro-batch of which data-parallel
    replica, in what order, and how many micro-batches each replica runs.

    ``lengths``: the step's document lengths (tokens; integers in ``1..token_budget``, at
    least ``replicas * microbatches`` of them); ``replicas`` data-parallel pipelines of
    ``stages`` stages under ``schedule``, ``microbatches`` each on average; ``cost``: see
    :func:`resolve_cost`; ``speeds``: per-replica time multipliers (1.5 = 50% slower; or
    ``replicas x stages``), None for equal. Returns the :class:`WorkPlan`
    (``microbatches[r][j]`` = indices into ``lengths``). BubblecastError, one line naming the
    value, on bad input: a document longer than the budget, an empty batch or fewer documents
    than micro-batches, negative or non-integer lengths, a bad cost or config field.
    """
    work, weights, method = resolve_cost(cost)
    config = plan_config(token_budget=token_budget, replicas=replicas,
                         microbatches=microbatches, stages=stages, schedule=schedule,
                         kind_weights=weights)
    return warn_fallback(work_plan.plan_batch(lengths, config, work, speeds, method))
