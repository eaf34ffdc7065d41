"""Small assertions shared by several test modules."""

from __future__ import annotations

import math


def all_finite(obj: object) -> bool:
    """True when every float inside nested dicts and lists is finite."""
    if isinstance(obj, float):
        return math.isfinite(obj)
    if isinstance(obj, dict):
        return all(all_finite(v) for v in obj.values())
    if isinstance(obj, list):
        return all(all_finite(v) for v in obj)
    return True
