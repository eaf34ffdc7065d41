"""Shared fixtures: paths to the real public data copied into the repository's data/."""

from __future__ import annotations

from pathlib import Path

import pytest

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
