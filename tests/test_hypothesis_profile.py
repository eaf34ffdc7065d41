"""The Hypothesis profile of tests/conftest.py: `make test` draws the same examples every run."""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st


def _drawn() -> list[int]:
    seen: list[int] = []

    @settings(max_examples=25, deadline=None)
    @given(st.integers(0, 10**9))
    def record(x: int) -> None:
        seen.append(x)

    record()
    return seen


def test_property_tests_draw_the_same_examples_on_every_run() -> None:
    if os.environ.get("HYPOTHESIS_PROFILE") == "explore":  # `make fuzz`: fresh examples
        assert not settings.default.derandomize
        return
    assert settings.default.derandomize
    first, second = _drawn(), _drawn()
    assert len(first) >= 10
    assert first == second
