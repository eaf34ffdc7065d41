"""The service's OpenAPI schema, completed with what the route declarations cannot state.

FastAPI derives the schema from the pydantic models and the routes; three facts depend on how
the service runs and are added here:

- **the window minimum**: every per-rank history (``compute_s``, ``work``, ``tokens``,
  ``layers``) must hold at least the served model's ``min_window`` steps (60 for a model
  trained with the default dataset config); shorter windows get a 422 naming the field;
- **the bearer token**: every route except ``/healthz`` and ``/readyz`` answers 401 without
  it, GET routes included; with a token configured the schema declares the bearer scheme
  and requires it on those routes;
- **503** while no model is loaded yet, on the routes that need one.

The schema is rebuilt only when the window minimum changes (a reload of another model).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

#: The window minimum of a model trained with the default dataset config (its longest
#: rolling window), stated while no model is loaded yet.
DEFAULT_MIN_WINDOW = 60
WINDOW_FIELDS = ("compute_s", "work", "tokens", "layers")
#: Routes that answer 503 until a model is loaded.
NEED_MODEL = frozenset({"/v1/forecast", "/v1/recommend", "/v1/model", "/v1/admin/reload"})
_ERROR_REF = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}


def _window_minimum(schema: dict[str, Any], min_window: int) -> None:
    """``minItems`` of every per-rank history list, with the rule in its description."""
    props = schema["components"]["schemas"]["RankWindow"]["properties"]
    for name in WINDOW_FIELDS:
        prop = props[name]
        for branch in prop.get("anyOf", [prop]):
            if branch.get("type") == "array":
                branch["minItems"] = max(int(branch.get("minItems", 1)), min_window)
        prop["description"] = (f"{prop.get('description', '')}; at least {min_window} steps "
                               "(the served model's window minimum, 60 with the default "
                               "dataset config), all lists of a rank the same length")


def _responses(schema: dict[str, Any], open_routes: frozenset[str], token: bool) -> None:
    """401 on every route that needs the token (and the bearer scheme when one is set); 503
    on the routes that need a model."""
    if token:
        schema.setdefault("components", {}).setdefault("securitySchemes", {})["bearer"] = {
            "type": "http", "scheme": "bearer",
            "description": "the token given to `bubblecast serve --token-file`"}
    for path, ops in schema.get("paths", {}).items():
        for op in ops.values():
            responses = op.setdefault("responses", {})
            if path not in open_routes:
                responses["401"] = {"description": "missing or wrong bearer token",
                                    "content": copy.deepcopy(_ERROR_REF)}
                if token:
                    op["security"] = [{"bearer": []}]
            if path in NEED_MODEL:
                responses.setdefault("503", {"description": "no model loaded yet",
                                             "content": copy.deepcopy(_ERROR_REF)})


def service_openapi(app: FastAPI, open_routes: frozenset[str], token: bool,
                    min_window: Callable[[], int | None]) -> Callable[[], dict[str, Any]]:
    """An ``app.openapi`` replacement: FastAPI's schema completed as the module says;
    ``min_window()`` is the served model's (None before one is loaded)."""
    cache: dict[int, dict[str, Any]] = {}

    def openapi() -> dict[str, Any]:
        need = min_window() or DEFAULT_MIN_WINDOW
        if need not in cache:
            schema = get_openapi(title=app.title, version=app.version,
                                 description=app.description, routes=app.routes)
            _window_minimum(schema, need)
            _responses(schema, open_routes, token)
            cache.clear()
            cache[need] = schema
        return cache[need]

    return openapi
