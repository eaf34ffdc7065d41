"""Features and targets: no look-ahead, correct targets, partition invariance, spikes."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from bubblecast.dataset import DatasetConfig, build_dataset, feature_columns, step_series
from bubblecast.errors import BubblecastError
from bubblecast.telemetry import RunMeta, from_frame
from tests.dataset.synth import make_events

CONFIG = DatasetConfig(horizons=(1, 3), windows=(4, 10, 24), lags=8, max_period=10)


def _perturb_after(events, t0: int, seed: int = 1):
    """Same events, with every duration, layer count and speed after step t0 changed."""
    frame = events.frame.copy()
    future = (frame["step"] > t0).to_numpy()
    rng = np.random.default_rng(seed)
    frame.loc[future, "duration_s"] *= rng.uniform(0.3, 3.0, size=future.sum())
    frame.loc[future, "speed"] = 7.0
    frame["layers"] = frame["layers"].astype("int32")
    frame.loc[future, "layers"] = 3
    return from_frame(frame, dict(events.runs))


def test_no_feature_looks_ahead():
    events = make_events(runs=2, steps=80, replicas=2, tokens=True, seed=4)
    t0 = 50
    base, _ = build_dataset(events, CONFIG)
    moved, _ = build_dataset(_perturb_after(events, t0), CONFIG)
    past = (base["step"] <= t0).to_numpy()
    assert past.sum() > 100
    inputs = feature_columns(base.columns) + [c for c in base.columns if c.startswith("x")]
    inputs = [c for c in inputs if "tokens" not in c]  # known-ahead inputs, tested below
    for col in inputs + ["y", "level", "work", "compute_s"]:
        np.testing.assert_allclose(moved.loc[past, col].to_numpy(dtype=float),
                                   base.loc[past, col].to_numpy(dtype=float),
                                   rtol=1e-5, atol=1e-12, equal_nan=True, err_msg=col)
    # The targets do see the future: rows whose target step moved must differ.
    crossing = past & (base["step"] + 3 > t0).to_numpy()
    assert not np.allclose(moved.loc[crossing, "y_h3"], base.loc[crossing, "y_h3"])


def test_known_ahead_inputs_depend_only_on_tokens():
    events = make_events(runs=1, steps=80, tokens=True, seed=2)
    base, _ = build_dataset(events, CONFIG)
    moved, _ = build_dataset(_perturb_after(events, 40), CONFIG)
    cols = [c for c in base.columns if c.startswith("x") and "tokens" in c]
    assert cols
    for col in cols:
        np.testing.assert_allclose(moved[col], base[col], rtol=1e-5, equal_nan=True)


def test_targets_are_the_signal_h_steps_later():
    events = make_events(runs=2, steps=60, replicas=2, seed=5)
    frame, _ = build_dataset(events, CONFIG)
    series = step_series(events).set_index(["run_id", "replica", "stage", "step"])["y"]
    for h in CONFIG.horizons:
        sample = frame.sample(50, random_state=h)
        keys = list(zip(sample["run_id"].astype(str), sample["replica"], sample["stage"],
                        sample["step"] + h, strict=True))
        expected = np.array([series.get(k, np.nan) for k in keys])
        np.testing.assert_allclose(sample[f"y_h{h}"].to_numpy(), expected, equal_nan=True)
    last = frame.groupby(["run_id", "replica", "stage"], observed=True).tail(1)
    assert last["y_h1"].isna().all()  # the future of the last step is unknown
    assert len(frame) == 2 * 2 * 4 * (60 - CONFIG.history + 1)


def _repartitioned_run(costs: list[float], before: list[int], after: list[int], at: int,
                       steps: int) -> tuple:
    rows = []
    rng = np.random.default_rng(0)
    speed = rng.uniform(0.8, 1.6, size=(steps, len(before)))
    for step in range(steps):
        part = before if step < at else after
        first = np.r_[0, np.cumsum(part)[:-1]]
        for stage, n in enumerate(part):
            held = sum(costs[first[stage]:first[stage] + n])
            for mb in range(2):
                rows.append(("r", step, stage, stage, 0, 0, mb, "F", 0.0,
                             held * speed[step, stage] * 1e-3, n))
    frame = pd.DataFrame(rows, columns=["run_id", "step", "rank", "stage", "replica", "chunk",
                                        "microbatch", "op", "start_s", "duration_s", "layers"])
    meta = RunMeta(schedule="gpipe", stages=len(before), microbatches=2,
                   extra={"layer_costs": costs})
    return from_frame(frame, {"r": meta}), speed


def test_signal_is_partition_invariant():
    costs = [1.0, 2.0, 0.5, 3.0, 1.5, 1.0, 2.5, 0.7]
    events, speed = _repartitioned_run(costs, [2, 2, 2, 2], [1, 3, 3, 1], at=30, steps=60)
    series = step_series(events)
    y = series.pivot(index="step", columns="stage", values="y").to_numpy()
    # y = compute / (cost held x microbatches) recovers the speed factor on both sides.
    np.testing.assert_allclose(y / 1e-3, speed, rtol=1e-9)
    layers = series.pivot(index="step", columns="stage", values="layers").to_numpy()
    assert (layers[:30] == 2).all() and (layers[30:] == [1, 3, 3, 1]).all()
    frame, _ = build_dataset(events, DatasetConfig(horizons=(1,), windows=(3, 6, 12), lags=4,
                                                   max_period=6))
    since = frame.loc[frame["step"] == 35, "f_since_repartition"].to_numpy()
    assert (since == 5).all()


def test_too_short_runs_are_refused_with_one_line():
    events = make_events(runs=1, steps=20, seed=0)
    with pytest.raises(BubblecastError, match=r"run 'run0' has 20 steps; .* at least 27") as exc:
        build_dataset(events, CONFIG)
    assert "\n" not in str(exc.value)


def test_periodic_spikes_give_the_period_and_the_next_spike():
    events = make_events(runs=2, steps=150, kind="periodic", noise=0.02, seed=7)
    frame, _ = build_dataset(events)
    series = step_series(events)
    spiky = series.groupby(["run_id", "stage"], observed=True)["y"].agg(
        lambda y: (y > 1.5 * y.median()).sum()).reset_index()
    spiky = spiky[spiky["y"] > 5]
    assert len(spiky) == 2
    for _, row in spiky.iterrows():
        rows = frame[(frame["run_id"] == row["run_id"]) & (frame["stage"] == row["stage"])]
        ys = series[(series["run_id"] == row["run_id"]) & (series["stage"] == row["stage"])]
        hi = ys["step"][ys["y"] > 1.5 * ys["y"].median()].to_numpy()
        period = int(np.median(np.diff(hi)))
        assert (rows["f_period"].tail(50) == period).all()
        for h in (1, 5, 10):
            due = rows[f"x{h}_spike_due"].to_numpy() == 1
            actual = np.isin(rows["step"].to_numpy() + h, hi)
            known = rows[f"y_h{h}"].notna().to_numpy()
            assert (due == actual)[known][-60:].all()


def test_peer_ratio_flags_the_slow_rank():
    events = make_events(runs=1, steps=100, kind="step", noise=0.01, seed=3)
    frame, _ = build_dataset(events)
    last = frame[frame["step"] == 99].set_index("stage")
    slow = int(last["f_peer_ratio"].idxmax())
    assert last.loc[slow, "f_peer_ratio"] > 1.4
    assert (last.drop(index=slow)["f_peer_ratio"].between(0.9, 1.1)).all()
