"""Shared fixtures: paths to the real public data in ../shared/data."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
MEGATRON_TRACE = SHARED_DATA / "megatron-ops" / "trace-ST.parquet"


@pytest.fixture(scope="session")
def megatron_trace() -> Path:
    if not MEGATRON_TRACE.exists():
        pytest.skip(f"real data not found at {MEGATRON_TRACE}")
    return MEGATRON_TRACE
