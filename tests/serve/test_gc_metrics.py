"""Garbage collections are counted and timed on /metrics while the app runs, and only then."""

from __future__ import annotations

import gc
import re

from fastapi.testclient import TestClient

from bubblecast.serve.app import create_app
from bubblecast.serve.prometheus import Metrics


def _value(text: str, name: str, generation: int) -> float:
    m = re.search(rf'^{name}{{generation="{generation}"}} (\S+)$', text, re.MULTILINE)
    assert m, f"{name} generation {generation} missing"
    return float(m.group(1))


def test_tracked_collections_are_counted_and_timed():
    metrics = Metrics(("/healthz",))
    metrics.track_gc()
    metrics.track_gc()  # idempotent: one hook
    try:
        assert gc.callbacks.count(metrics._on_gc) == 1
        gc.collect()
        text = metrics.render()
    finally:
        metrics.untrack_gc()
    assert _value(text, "bubblecast_gc_collections_total", 2) == 1
    total = _value(text, "bubblecast_gc_pause_seconds_total", 2)
    assert total > 0
    assert _value(text, "bubblecast_gc_pause_max_seconds", 2) == total
    gc.collect()  # no longer tracked
    assert _value(metrics.render(), "bubblecast_gc_collections_total", 2) == 1


def test_the_app_tracks_while_running_and_unhooks_at_shutdown(predictor):
    app = create_app(predictor)
    svc = app.state.service
    with TestClient(app) as c:
        assert svc.metrics._on_gc in gc.callbacks
        before = _value(c.get("/metrics").text, "bubblecast_gc_collections_total", 2)
        gc.collect()
        after = _value(c.get("/metrics").text, "bubblecast_gc_collections_total", 2)
        assert after == before + 1
    assert svc.metrics._on_gc not in gc.callbacks
