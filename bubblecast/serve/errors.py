"""Error bodies of the service: every 4xx is JSON ``{"error", "field", "detail"}``.

Pydantic reports a field as a location tuple (``("body", "ranks", 0, "compute_s", 3)``); a
model-level check reports the field at the start of its message (``"ranks[1].stage: ..."``).
Both become one dotted name, ``ranks[0].compute_s[3]``, so a client sees which field to fix.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

MAX_DETAIL = 20  # errors listed per response

_FIELD_IN_MSG = re.compile(r"^(?:Value error, )?([A-Za-z_][\w.\[\]]*): (.*)$", re.DOTALL)


def field_name(loc: Sequence[Any]) -> str:
    """``("body", "ranks", 0, "stage")`` -> ``ranks[0].stage``."""
    out = ""
    for part in loc:
        if part == "body" and not out:
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            text = str(part)
            if text.startswith(("function-", "tagged-union", "list[", "tuple[")):
                continue
            out += f".{text}" if out else text
    return out


def describe(errors: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pydantic/FastAPI errors -> ``[{"field", "msg", "type"}]`` with readable field names."""
    out = []
    for err in errors[:MAX_DETAIL]:
        field = field_name(err.get("loc", ()))
        msg = str(err.get("msg", "invalid"))
        if err.get("type") == "json_invalid":
            loc = err.get("loc", ())
            at = f" at character {loc[-1]}" if loc and isinstance(loc[-1], int) else ""
            out.append({"field": "body", "msg": f"{msg}{at}", "type": "json_invalid"})
            continue
        match = _FIELD_IN_MSG.match(msg)
        if match and err.get("type") == "value_error":
            inner, msg = match.group(1), match.group(2)
            field = f"{field}.{inner}" if field else inner
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        out.append({"field": field or "body", "msg": msg, "type": str(err.get("type", ""))})
    return out


def error_body(message: str, field: str | None = None,
               detail: list[dict[str, Any]] | None = None) -> bytes:
    """The JSON bytes of an error response."""
    text = f"{field}: {message}" if field else message
    return json.dumps({"error": text, "field": field, "detail": detail or []}).encode()


def validation_body(errors: Sequence[dict[str, Any]]) -> bytes:
    """A 422 body: the first error in ``error``/``field``, all of them in ``detail``."""
    detail = describe(errors)
    first = detail[0] if detail else {"field": "body", "msg": "invalid request"}
    return error_body(first["msg"], first["field"], detail)
