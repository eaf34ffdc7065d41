"""On simulated runs the delay signal is the ground-truth slowdown, whatever the schedule,
chunking or partition (and across a repartition in the middle of a run)."""

from __future__ import annotations

import numpy as np
import pytest

from bubblecast.dataset import step_series
from bubblecast.sim.simulator import SimConfig, simulate_events


@pytest.mark.parametrize(("schedule", "chunks", "partition"), [
    ("1f1b", 1, None),
    ("zb-h1", 1, lambda step: [2, 5, 3, 2] if step < 30 else [4, 2, 2, 4]),
    ("interleaved", 2, lambda step: [2, 1, 2, 1, 1, 2, 1, 2] if step < 30
     else [1, 1, 1, 1, 3, 2, 2, 1]),
])
def test_signal_equals_the_ground_truth_speed(schedule, chunks, partition):
    config = SimConfig(schedule=schedule, stages=4, microbatches=8, chunks=chunks,
                       model="uniform:12", partition=partition, steps=60, replicas=2,
                       scenario="failslow", seed=4)
    series = step_series(simulate_events(config))
    ratio = (series["y"] / series["speed"]).to_numpy()
    # Only the per-op noise (sigma 0.01, averaged over a step's ops) remains.
    assert abs(np.median(ratio) - 1.0) < 0.003 and ratio.std() < 0.01
    if partition is not None:
        assert series["layers"].nunique() > 1  # the repartition is seen


def test_seqlen_signal_keeps_only_the_superlinear_token_cost():
    config = SimConfig(schedule="1f1b", stages=4, microbatches=8, model="uniform:8", steps=40,
                       scenario="seqlen", seed=2)
    series = step_series(simulate_events(config))
    ratio = (series["y"] / series["speed"]).to_numpy()
    # Work is linear in tokens; the quadratic (attention) share is left for the models, and it
    # grows with the step's mean tokens per microbatch, which the known-ahead inputs carry.
    per_mb = (series["tokens2"] / series["tokens"]).to_numpy()
    assert np.corrcoef(per_mb, ratio)[0, 1] > 0.9
