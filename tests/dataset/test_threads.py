"""Features on every core: the same bits for any thread count, block size or company of runs,
and the values of the pandas implementation they replaced (issue 26 item 1)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from bubblecast.dataset import DatasetConfig, build_features, step_series
from bubblecast.dataset import threads as threads_mod
from bubblecast.dataset.features import history_frame, history_names
from bubblecast.dataset.threads import resolve_jobs, series_blocks, usable_cpus
from tests.dataset.features_reference import build_features as reference_features
from tests.dataset.synth import make_events

CONFIG = DatasetConfig(horizons=(1, 3), windows=(4, 10, 24), lags=8, max_period=10)


@pytest.fixture(scope="module")
def series() -> pd.DataFrame:
    """Three runs of two replicas with drift, periodic spikes, a lasting slowdown and tokens;
    one run shorter than the others (series of unequal length)."""
    a = make_events(runs=2, steps=90, replicas=2, tokens=True, seed=3)
    b = make_events(runs=1, steps=61, replicas=2, tokens=False, seed=5, prefix="short")
    frame = pd.concat([a.frame, b.frame], ignore_index=True)
    from bubblecast.telemetry import from_frame

    return step_series(from_frame(frame, {**a.runs, **b.runs}))


def test_thread_counts_give_the_same_bits(series, monkeypatch):
    """Blocks of 64 rows (the frame is smaller than one default block, which is built on this
    thread), so threads do share the work."""
    from bubblecast.dataset import features as features_mod

    monkeypatch.setattr(threads_mod, "BLOCK_ROWS", 64)
    runs, run = [], features_mod.run_tasks
    monkeypatch.setattr(features_mod, "run_tasks",
                        lambda tasks, jobs: (runs.append((len(tasks), jobs)), run(tasks, jobs)))
    one = build_features(series, CONFIG, n_jobs=1)
    for jobs in (2, 3, -1, None):
        pd.testing.assert_frame_equal(build_features(series, CONFIG, n_jobs=jobs), one,
                                      check_exact=True)
    assert runs[0][1] == 1 and runs[1] == (runs[0][0], 2) and runs[0][0] > 10


@pytest.mark.parametrize("block_rows", [1, 50, 10**9])
def test_block_sizes_give_the_same_bits(series, monkeypatch, block_rows):
    """A block per series, a few series a block, one block: every value reads its own series
    only, so the cut of the rows into blocks never shows."""
    base = build_features(series, CONFIG, n_jobs=2)
    monkeypatch.setattr(threads_mod, "BLOCK_ROWS", block_rows)
    pd.testing.assert_frame_equal(build_features(series, CONFIG, n_jobs=2), base,
                                  check_exact=True)


def test_a_run_alone_gets_the_bits_it_gets_among_others(series):
    """What a partitioned build relies on: a run's rows do not depend on the other runs."""
    whole = build_features(series, CONFIG)
    for run in ("run1", "short0"):
        alone = series.loc[series["run_id"] == run].reset_index(drop=True)
        alone = alone.assign(run_id=alone["run_id"].cat.remove_unused_categories())
        part = build_features(alone, CONFIG)
        rows = whole.loc[whole["run_id"] == run].reset_index(drop=True)
        rows = rows.assign(run_id=rows["run_id"].cat.remove_unused_categories())
        pd.testing.assert_frame_equal(part, rows, check_exact=True)


def test_values_equal_the_pandas_implementation(series):
    """Same columns in the same order; discrete features exactly, the rest to float32
    resolution (summation order differs: pairwise window sums instead of running sums)."""
    new = build_features(series, CONFIG, n_jobs=2)
    old = reference_features(series, CONFIG)
    assert list(new.columns) == list(old.columns)
    exact = ("f_spike", "f_since_spike", "f_spike_period", "f_spike_regular", "f_spike_count",
             "f_acf_period", "f_period", "f_layers", "f_since_repartition", "step", "stage")
    for col in new.columns:
        a, b = new[col].to_numpy(), old[col].to_numpy()
        if col in exact or col.endswith(("_spike_due", "_spike_phase", "_seasonal")) \
                or not np.issubdtype(a.dtype, np.floating):
            np.testing.assert_array_equal(a, b, err_msg=col)
        else:
            np.testing.assert_allclose(a.astype(float), b.astype(float), rtol=1e-5, atol=1e-7,
                                       equal_nan=True, err_msg=col)


def test_history_frame_is_the_features_columns(series):
    frame = build_features(series, CONFIG)
    hist = history_frame(series, CONFIG, n_jobs=2)  # one block here: built on this thread
    names = history_names(CONFIG)
    assert list(hist.columns) == ["run_id", "replica", "stage", "step"] + names
    pd.testing.assert_frame_equal(hist[names], frame[names], check_exact=True)
    assert len(names) == CONFIG.lags + 7 * len(CONFIG.windows) + len(CONFIG.ewm_alphas)


def test_ewm_restarts_at_each_series_as_pandas():
    from bubblecast.dataset.windows import ewm_restarting

    rng = np.random.default_rng(0)
    lengths = [1, 2, 7, 64, 300]
    y = rng.lognormal(size=sum(lengths))
    pos = np.concatenate([np.arange(n) for n in lengths])
    sid = np.repeat(np.arange(len(lengths)), lengths)
    got = ewm_restarting(y, pos, (0.5, 0.05, 1.0))
    for row, a in zip(got, (0.5, 0.05, 1.0), strict=True):
        want = pd.Series(y).groupby(sid).ewm(alpha=a, adjust=False).mean().to_numpy()
        np.testing.assert_allclose(row, want, rtol=1e-12)


def test_n_jobs_follows_scikit_learn():
    cpus = usable_cpus()
    assert resolve_jobs(None) == resolve_jobs(-1) == cpus
    assert resolve_jobs(3) == 3
    assert resolve_jobs(-2) == max(1, cpus - 1)
    assert resolve_jobs(-10**6) == 1
    for bad in (0, 1.5, True, "2"):
        with pytest.raises(ValueError, match="n_jobs"):
            resolve_jobs(bad)


def test_blocks_hold_whole_series():
    first = np.zeros(100, dtype=bool)
    first[[0, 10, 35, 40, 90]] = True
    assert series_blocks(first, 30) == [(0, 35), (35, 90), (90, 100)]
    assert series_blocks(first, 1) == [(0, 10), (10, 35), (35, 40), (40, 90), (90, 100)]
    assert series_blocks(np.zeros(0, dtype=bool), 30) == []


def test_dataset_threads_option(tmp_path):
    from bubblecast.cli import main
    from bubblecast.dataset import read_features
    from bubblecast.telemetry.io import write_events

    events = make_events(runs=1, steps=80, seed=2)
    src = tmp_path / "ev.parquet"
    write_events(events, src)
    args = ["dataset", str(src), "--horizons", "1,3", "--windows", "4,10,24", "--lags", "8",
            "--json"]
    assert main([*args, "--out", str(tmp_path / "a.parquet"), "--threads", "1"]) == 0
    assert main([*args, "--out", str(tmp_path / "b.parquet"), "--threads", "2"]) == 0
    a, _ = read_features(tmp_path / "a.parquet")
    b, _ = read_features(tmp_path / "b.parquet")
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    assert main([*args, "--out", str(tmp_path / "c.parquet"), "--threads", "0"]) == 2
    assert not (tmp_path / "c.parquet").exists()


def test_missing_and_infinite_values_count_as_missing_like_pandas(series):
    """A NaN or infinite delay signal (a stage holding no work, say) leaves NaN in the windows
    that hold it, as pandas' rolling statistics do; EWMs decay over it as pandas' do."""
    t = series.copy()
    y = t["y"].to_numpy().copy()
    first = np.flatnonzero(t["step"].to_numpy() == 0)
    y[[first[1], first[2] + 30, first[3] + 40]] = [np.nan, np.inf, -np.inf]
    t["y"] = y
    new = build_features(t, CONFIG, n_jobs=2)
    old = reference_features(t, CONFIG)
    for col in [c for c in new.columns if c.startswith("f_u_") or c == "f_peer_ratio_m5"]:
        a, b = new[col].to_numpy(np.float64), old[col].to_numpy(np.float64)
        np.testing.assert_array_equal(np.isnan(a), np.isnan(b), err_msg=col)
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7, equal_nan=True, err_msg=col)
