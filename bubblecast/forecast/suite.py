"""Simulated scenario suites for training and held-out evaluation of forecasters.

A suite is a set of simulator configs (``bubblecast.sim.simulator``), one per scenario and
pipeline shape, whose run seeds come from a suite seed: a training suite and a held-out suite
built with different seeds share no run. Used by the benchmarks and the skill tests.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from bubblecast.telemetry.events import Events

#: Scenarios of the held-out suite the skill targets are measured on.
HELD_OUT: tuple[str, ...] = ("throttle", "failslow", "periodic", "seqlen", "mixed")
#: Scenarios a forecaster is trained on (the held-out ones plus the stationary ones).
TRAINING: tuple[str, ...] = ("none", "jitter", "imbalance", *HELD_OUT)
#: Pipeline shapes cycled through: (schedule, stages, microbatches, chunks, model).
SHAPES: tuple[tuple[str, int, int, int, str], ...] = (
    ("1f1b", 4, 8, 1, "uniform:16"),
    ("zb-h1", 4, 8, 1, "uniform:16"),
    ("interleaved", 4, 8, 2, "uniform:16"),
)


@dataclass(frozen=True)
class SuiteConfig:
    """``runs`` runs per scenario of ``steps`` steps and ``replicas`` replicas, seeded by
    ``seed`` (the run seeds of two suites with different seeds never coincide)."""

    scenarios: tuple[str, ...] = HELD_OUT
    runs: int = 6
    steps: int = 400
    replicas: int = 2
    seed: int = 0

    def __post_init__(self) -> None:
        if self.runs < 1 or self.steps < 2 or self.replicas < 1:
            raise ValueError(f"suite: runs, steps and replicas must be positive, got {self}")
        if not self.scenarios:
            raise ValueError("suite: no scenarios")


def suite_events(config: SuiteConfig) -> Events:
    """Simulate the suite: run ids ``{scenario}-s{seed}-{k}`` with ``scenario`` in metadata."""
    from bubblecast.sim.simulator import SimConfig, simulate_events

    parts = []
    for i, scenario in enumerate(config.scenarios):
        seed = int(np.random.SeedSequence([config.seed, i]).generate_state(1)[0] % (2**31))
        for j in range(config.runs):
            schedule, stages, m, chunks, model = SHAPES[j % len(SHAPES)]
            sim = SimConfig(schedule=schedule, stages=stages, microbatches=m, chunks=chunks,
                            model=model, steps=config.steps, replicas=config.replicas,
                            scenario=scenario, seed=seed + j, runs=1,
                            run_id=f"{scenario}-s{config.seed}-{j}")
            parts.append(simulate_events(sim))
    events = Events.concat(parts)
    frame = events.frame
    for col, dtype in (("tokens", "Int64"), ("layers", "Int32")):
        # Runs without the column leave NaN after concat; keep the SPEC integer type.
        if col in frame.columns and not pd.api.types.is_integer_dtype(frame[col].dtype):
            frame[col] = frame[col].astype(dtype)
    return events
