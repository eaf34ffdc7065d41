"""Shared fixtures (paths to the real public data copied into the repository's data/) and the
Hypothesis profile every property test runs under."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests draw the same examples on every run (`make test` gives the same result for the
# same code, in CI as here); `make fuzz` runs them with fresh random examples to find new
# cases (HYPOTHESIS_PROFILE=explore). A case found that way becomes a fixed regression test.
settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data"
MEGATRON_TRACE = DATA / "megatron-ops" / "trace-ST.parquet"
MEGATRON_TIMELINE = DATA / "megatron-ops" / "timeline-ST.json.gz"
HTA_TRACES = DATA / "hta-gpu-traces"
PIPEDREAM_PROFILES = DATA / "pipedream-profiles"


@pytest.fixture(scope="session")
def megatron_trace() -> Path:
    """The real Megatron-LM trace (in the repository: tests never skip for it)."""
    return MEGATRON_TRACE
