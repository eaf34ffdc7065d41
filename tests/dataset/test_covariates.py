"""Covariate features are leakage-free: observed ones read only the past of the origin,
known-future ones (announced tokens, the calendar) read up to the horizon, never beyond."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from bubblecast.dataset import DatasetConfig
from bubblecast.dataset.builder import build_dataset
from bubblecast.dataset.covariates import covariate_columns
from bubblecast.sim.device_metrics import simulated_metrics
from bubblecast.sim.simulator import SimConfig, simulate_events

CONFIG = DatasetConfig(horizons=(1, 5, 10), windows=(5, 20, 40), lags=8, max_period=20,
                       covariates="auto")
ORIGIN = 70


@pytest.fixture(scope="module")
def thermal():
    sim = SimConfig(schedule="1f1b", stages=2, microbatches=4, steps=160, scenario="thermal",
                    seed=1)
    return simulate_events(sim), simulated_metrics(sim)


@pytest.fixture(scope="module")
def seqlen():
    sim = SimConfig(schedule="1f1b", stages=2, microbatches=4, steps=160, scenario="seqlen",
                    seed=2)
    return simulate_events(sim), simulated_metrics(sim)


def _at(frame: pd.DataFrame, cols: list[str], upto: int = ORIGIN) -> np.ndarray:
    rows = frame[frame["step"] <= upto].sort_values(["run_id", "replica", "stage", "step"])
    return rows[cols].to_numpy(dtype=np.float64)


def test_observed_covariates_ignore_the_future(thermal):
    events, metrics = thermal
    frame, _ = build_dataset(events, CONFIG, metrics=metrics)
    cols = [c for c in covariate_columns(frame.columns) if c.startswith("f_cov_")]
    assert {"f_cov_temperature_c", "f_cov_sm_clock_mhz_d5", "f_cov_power_w_peer"} <= set(cols)
    noisy = metrics.copy()
    future = noisy["step"] > ORIGIN
    noisy.loc[future, "value"] = np.random.default_rng(0).normal(500, 50, future.sum())
    again, _ = build_dataset(events, CONFIG, metrics=noisy)
    np.testing.assert_array_equal(_at(frame, cols), _at(again, cols))
    # and the features do read the present: perturbing step ORIGIN changes them
    now = metrics.copy()
    now.loc[now["step"] == ORIGIN, "value"] += 7.0
    moved, _ = build_dataset(events, CONFIG, metrics=now)
    assert not np.array_equal(_at(frame, cols), _at(moved, cols))


def test_known_future_reads_up_to_the_horizon_not_beyond(seqlen):
    events, metrics = seqlen
    frame, _ = build_dataset(events, CONFIG, metrics=metrics)
    cols = {h: f"x{h}_cov_tokens_ratio" for h in CONFIG.horizons}
    assert set(cols.values()) <= set(frame.columns)
    beyond = metrics.copy()
    beyond.loc[beyond["step"] > ORIGIN + 10, "value"] *= 3.0
    again, _ = build_dataset(events, CONFIG, metrics=beyond)
    np.testing.assert_array_equal(_at(frame, list(cols.values())),
                                  _at(again, list(cols.values())))
    inside = metrics.copy()
    inside.loc[inside["step"] == ORIGIN + 5, "value"] *= 3.0
    moved, _ = build_dataset(events, CONFIG, metrics=inside)
    row = lambda f, c: f.loc[(f["step"] == ORIGIN) & (f["stage"] == 0), c].to_numpy()  # noqa: E731
    assert np.allclose(row(moved, cols[5]), 3.0 * row(frame, cols[5]))  # allowed: t + 5
    np.testing.assert_array_equal(row(moved, cols[1]), row(frame, cols[1]))
    np.testing.assert_array_equal(row(moved, cols[10]), row(frame, cols[10]))


def test_calendar_marks_scheduled_steps_within_the_horizon(seqlen):
    events, _ = seqlen
    for meta in events.runs.values():
        meta.extra["calendar"] = {"checkpoint_every": 25}
    try:
        frame, _ = build_dataset(events, CONFIG)
    finally:
        for meta in events.runs.values():
            meta.extra.pop("calendar")
    one = frame[frame["stage"] == 0].set_index("step")
    # step 74 is scheduled (first = 24, every 25): due at h=5 from origin 69
    assert one.loc[69, "x5_cal_checkpoint_due"] == 1.0
    assert one.loc[70, "x5_cal_checkpoint_due"] == 0.0
    assert one.loc[70, "x5_cal_checkpoint_within"] == 1.0
    assert one.loc[74, "x5_cal_checkpoint_within"] == 0.0  # (74, 79]: none


def test_none_adds_nothing_and_keeps_the_fingerprint(thermal):
    events, metrics = thermal
    plain = DatasetConfig(horizons=(1, 5, 10), windows=(5, 20, 40), lags=8, max_period=20)
    a, meta_a = build_dataset(events, plain, metrics=metrics)
    b, meta_b = build_dataset(events, CONFIG, metrics=metrics)
    assert not covariate_columns(a.columns) and covariate_columns(b.columns)
    assert "covariates" not in plain.to_json()
    assert set(a.columns) < set(b.columns)
    pd.testing.assert_frame_equal(a, b[a.columns], check_like=False)
    assert meta_a.fingerprint != meta_b.fingerprint  # the config differs
