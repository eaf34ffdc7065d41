"""The opt-in outlier queue: every document trained once, steps still full, outliers grouped."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bubblecast.errors import BubblecastError
from bubblecast.policy.outlier_delay import delayed_batches, mean_token_delay
from bubblecast.sim.documents import DocumentSource, draw_batches, next_fit

BUDGET, BINS, REPLICAS = 1024, 8, 2


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, BUDGET), min_size=50, max_size=400),
       st.sampled_from([0.25, 0.5, 0.9]), st.integers(1, 4))
def test_each_document_once_and_steps_full(lengths: list[int], share: float, wait: int) -> None:
    stream = np.asarray(lengths)
    steps, tokens, delays = delayed_batches(stream, BINS, BUDGET, REPLICAS, share, wait)
    for batch in steps:
        assert next_fit(batch, BUDGET)[-1] + 1 == BINS  # the loader's micro-batch count
    trained = np.sort(np.concatenate(steps)) if steps else np.zeros(0, np.int64)
    assert np.array_equal(np.sort(tokens), trained)
    # nothing invented: every trained document comes from the stream, at most as often
    values, counts = np.unique(trained, return_counts=True)
    have = dict(zip(*np.unique(stream, return_counts=True), strict=True))
    assert all(have.get(v, 0) >= c for v, c in zip(values, counts, strict=True))
    assert len(delays) == len(tokens)


def test_outliers_enter_in_rounds_of_one_per_replica() -> None:
    stream = np.concatenate(draw_batches(DocumentSource("long-tail", BUDGET * 4), 3, 40, BINS))
    steps, tokens, delays = delayed_batches(stream, BINS, BUDGET * 4, REPLICAS, 0.75, 8)
    counts = [int((b >= 0.75 * BUDGET * 4).sum()) for b in steps]
    assert sum(counts) > 0
    assert all(c % REPLICAS == 0 for c in counts)  # none overdue with max_wait 8 here
    outlier = tokens >= 0.75 * BUDGET * 4
    assert delays[outlier].max() >= 1  # some outliers did wait
    assert mean_token_delay(tokens[outlier], delays[outlier]) > 0


def test_without_outliers_the_cut_is_the_loaders() -> None:
    source = DocumentSource("lognormal", BUDGET)  # documents at most a quarter of the budget
    batches = draw_batches(source, 0, 30, BINS)
    steps, _, delays = delayed_batches(np.concatenate(batches), BINS, BUDGET, REPLICAS, 0.5)
    assert len(steps) >= len(batches) - 2  # the stream's last steps close on later documents
    assert all(np.array_equal(a, b) for a, b in zip(steps, batches, strict=False))
    assert not delays.any()


def test_bad_parameters() -> None:
    with pytest.raises(BubblecastError, match="min_share"):
        delayed_batches(np.ones(10, np.int64), BINS, BUDGET, REPLICAS, 0.0)
    with pytest.raises(BubblecastError, match="max_wait"):
        delayed_batches(np.ones(10, np.int64), BINS, BUDGET, REPLICAS, 0.5, 0)
