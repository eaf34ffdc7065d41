"""Prediction service: FastAPI app, request/response schemas, in-process predictor, client.

Importing this package is cheap; each name loads its module (and fastapi, httpx, pydantic)
on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "Client": "bubblecast.serve.client",
    "CircuitBreaker": "bubblecast.serve.client",
    "Predictor": "bubblecast.serve.predictor",
    "create_app": "bubblecast.serve.app",
    "ServeConfig": "bubblecast.serve.app",
    "ForecastModel": "bubblecast.forecast.served",
    "ModelInfo": "bubblecast.forecast.served",
    "ModelSource": "bubblecast.serve.registry",
    "ForecastRequest": "bubblecast.serve.schemas",
    "ForecastResponse": "bubblecast.serve.schemas",
    "PlanRequest": "bubblecast.serve.schemas",
    "PlanResponse": "bubblecast.serve.schemas",
    "RecommendRequest": "bubblecast.serve.schemas",
    "RecommendResponse": "bubblecast.serve.schemas",
    "RequestError": "bubblecast.serve.schemas",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'bubblecast.serve' has no attribute {name!r}")
    return getattr(import_module(module), name)
