"""Step series -> features and per-horizon targets, in blocks of whole series on every core.

Rows: one per (run, replica, stage, step) with at least ``config.history`` steps of history.
Every ``f_*`` feature at origin step t reads only values at steps <= t (the look-ahead test in
``tests/dataset`` perturbs the future and checks this); ``x{h}_*`` features are per-horizon:
the seasonal value and spike phase extrapolated from the past, and the known-ahead token load
of step t+h (a data loader knows it before the step runs). Targets: ``y_h{h}`` (the delay
signal at t+h), ``s_h{h}`` (compute seconds at t+h) and ``work_h{h}`` (work the stage will hold
at t+h with its current layers, used to turn a forecast of ``y`` back into seconds).

Naming: ``f_u_*`` and ``x{h}_u_*`` carry the unit of ``y`` (models divide them by ``level``,
the recent median, to be scale-free); other ``f_*`` / ``x{h}_*`` features are dimensionless.
All series are laid end to end in one array; windows never reach into the previous series
because only rows with ``pos >= history - 1`` are kept.

The per-series features are computed by :mod:`bubblecast.dataset.feature_blocks` over blocks
of whole series (:mod:`bubblecast.dataset.threads`) with the numpy kernels of
:mod:`bubblecast.dataset.windows`, whose every value reads its own window (or series) in an
order fixed by the window alone; the peers' features by pandas group medians over the frame.
So the frame has the same bits for any ``n_jobs``, any block size, and a run built alone or
among others. The online :mod:`bubblecast.dataset.online` path (one origin, the service and
the controller) is separate and single-threaded.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np
import pandas as pd

from bubblecast.dataset import threads
from bubblecast.dataset.config import DatasetConfig
from bubblecast.dataset.feature_blocks import (
    Inputs,
    Sink,
    block_features,
    history_features,
    peer_features,
)
from bubblecast.dataset.threads import resolve_jobs, run_tasks, series_blocks
from bubblecast.errors import BubblecastError

KEY_COLUMNS: list[str] = ["run_id", "replica", "stage", "step"]
INFO_COLUMNS: list[str] = ["scenario", "compute_s", "work", "layers", "y", "level"]


def _series_index(series: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(series id, position within series, start index of the row's series) per row."""
    run = series["run_id"].cat.codes.to_numpy().astype(np.int64)
    rep = series["replica"].to_numpy().astype(np.int64)
    stage = series["stage"].to_numpy().astype(np.int64)
    new = np.r_[True, (run[1:] != run[:-1]) | (rep[1:] != rep[:-1]) | (stage[1:] != stage[:-1])]
    sid = np.cumsum(new) - 1
    starts = np.flatnonzero(new)
    start = starts[sid]
    pos = np.arange(len(series)) - start
    return sid, pos, start


def check_lengths(series: pd.DataFrame, config: DatasetConfig) -> None:
    """Refuse runs shorter than the longest window plus the largest horizon (one line)."""
    steps = series.groupby("run_id", observed=True)["step"].nunique()
    short = steps[steps < config.min_steps]
    if len(short):
        run, n = str(short.index[0]), int(short.iloc[0])
        raise BubblecastError(
            f"run '{run}' has {n} steps; the dataset needs at least {config.min_steps} "
            f"(longest window {config.history} + largest horizon {config.horizons[-1]})"
        )


def _sorted(series: pd.DataFrame) -> pd.DataFrame:
    """``series`` ordered by the keys with a fresh index (step series come sorted: no copy)."""
    run = series["run_id"].cat.codes.to_numpy().astype(np.int64)
    keys = [run] + [series[c].to_numpy().astype(np.int64) for c in KEY_COLUMNS[1:]]
    ordered = True
    equal = np.ones(max(len(series) - 1, 0), dtype=bool)
    for key in keys:  # lexicographic: each key ascends where all earlier keys tie
        diff = np.diff(key)
        if (equal & (diff < 0)).any():
            ordered = False
            break
        equal &= diff == 0
    if ordered and isinstance(series.index, pd.RangeIndex) and series.index.start == 0 \
            and series.index.step == 1:
        return series
    return series.sort_values(KEY_COLUMNS, kind="stable").reset_index(drop=True)


def history_names(config: DatasetConfig) -> list[str]:
    """Lags, window statistics and EWMs of ``y``, in frame order."""
    names = [f"f_u_lag{k}" for k in range(config.lags)]
    for w in config.windows:
        names += [f"f_u_mean_w{w}", f"f_u_std_w{w}", f"f_u_min_w{w}", f"f_u_max_w{w}"]
        names += [f"f_u_q{round(q * 100)}_w{w}" for q in config.quantiles]
    return names + [f"f_u_ewm{a:g}" for a in config.ewm_alphas]


def feature_names(config: DatasetConfig) -> tuple[list[str], list[str]]:
    """(features in frame order, float64 columns written with them: ``level`` and targets)."""
    names = history_names(config)
    names += [f"f_slope_w{w}" for w in config.windows[1:]]
    names += ["f_spike", "f_since_spike", "f_spike_period", "f_spike_regular", "f_spike_count",
              "f_acf_peak", "f_acf_period", "f_period", "f_peer_ratio", "f_replica_ratio",
              "f_pipeline_ratio", "f_u_peer_med"]
    names += [f"f_u_peer_lag{k}" for k in range(config.lags)]
    names += ["f_peer_ratio_m5", "f_layers", "f_cost_share", "f_since_repartition",
              "f_tokens_ratio"]
    for h in config.horizons:
        names += [f"x{h}_{k}" for k in ("u_seasonal", "spike_due", "spike_phase",
                                         "tokens_ratio", "tokens2_ratio")]
    extra = ["level"] + [f"{t}_h{h}" for h in config.horizons for t in ("y", "s", "work")]
    return names, extra


def build_features(series: pd.DataFrame, config: DatasetConfig | None = None,
                   progress: Callable[[str], None] | None = None,
                   n_jobs: int | None = None) -> pd.DataFrame:
    """Features and targets from :func:`bubblecast.dataset.series.step_series` output.

    ``n_jobs``: threads (scikit-learn's convention: None or -1 every core, -2 all but one);
    the values are the same bits for any number, since each depends only on its own series
    (and the peers at its step), computed in blocks of whole series fixed by the data.
    """
    config = config or DatasetConfig()
    if 0.5 not in config.quantiles:
        raise BubblecastError("dataset config: 'quantiles' must include 0.5 (the level)")
    jobs = resolve_jobs(n_jobs)
    note = progress or (lambda _msg: None)
    check_lengths(series, config)
    series = _sorted(series)
    names, extra = feature_names(config)
    note("features and targets")
    sink, kept = _run_blocks(series, config, names, extra, block_features, jobs, peers=True)
    note("assembling rows")
    return _assemble(series, sink, kept, names, extra)


def history_frame(series: pd.DataFrame, config: DatasetConfig | None = None,
                  n_jobs: int | None = None) -> pd.DataFrame:
    """The keys and the lag, window and EWM features of ``y`` alone (the ones bubblecast
    shares with mlforecast's lag transforms), at the rows :func:`build_features` keeps and
    with its values; ``n_jobs`` as there."""
    config = config or DatasetConfig()
    if 0.5 not in config.quantiles:
        raise BubblecastError("dataset config: 'quantiles' must include 0.5 (the level)")
    jobs = resolve_jobs(n_jobs)
    check_lengths(series, config)
    series = _sorted(series)
    names = history_names(config)
    sink, kept = _run_blocks(series, config, names, [], history_features, jobs, peers=False)
    data: dict[str, object] = {c: series[c].to_numpy()[kept] for c in KEY_COLUMNS[1:]}
    cat = series["run_id"].cat
    data = {"run_id": pd.Categorical.from_codes(cat.codes.to_numpy()[kept], cat.categories),
            **data}
    data.update((name, sink.arrays.pop(name)) for name in names)
    return pd.DataFrame(data, copy=False)


def _run_blocks(series: pd.DataFrame, config: DatasetConfig, names: list[str],
                extra: list[str], block: Callable[..., None], jobs: int,
                peers: bool) -> tuple[Sink, np.ndarray]:
    """``block(inputs, lo, hi, offset, config, sink)`` over the blocks of whole series (and
    the features across series with ``peers``) on ``jobs`` threads; the filled sink and the
    kept rows."""
    _, pos, _ = _series_index(series)
    kept = np.flatnonzero(pos >= config.history - 1)
    sink = Sink(names, extra, len(kept))
    inputs = Inputs.of(series, pos)
    blocks = series_blocks(pos == 0)
    offsets = np.searchsorted(kept, [lo for lo, _ in blocks])
    tasks = [partial(peer_features, series, inputs, kept, config, sink)] if peers else []
    tasks += [partial(block, inputs, lo, hi, int(at), config, sink)
              for (lo, hi), at in zip(blocks, offsets, strict=True)]
    # under a block of rows (a serving window, say) threads cost more than they save
    run_tasks(tasks, jobs if len(pos) >= threads.BLOCK_ROWS else 1)
    return sink, kept


def _assemble(series: pd.DataFrame, sink: Sink, kept: np.ndarray, names: list[str],
              extra: list[str]) -> pd.DataFrame:
    """The kept rows: keys, level, features (in :func:`feature_names` order), then targets."""
    data: dict[str, object] = {c: series[c].to_numpy()[kept] for c in
                               KEY_COLUMNS + ["scenario", "compute_s", "work", "layers", "y"]}
    for col in ("run_id", "scenario"):
        cat = series[col].cat
        data[col] = pd.Categorical.from_codes(cat.codes.to_numpy()[kept], cat.categories)
    data["level"] = sink.arrays.pop("level")
    if "speed" in series.columns:
        data["speed"] = series["speed"].to_numpy()[kept]
    for name in names + extra[1:]:
        data[name] = sink.arrays.pop(name)
    return pd.DataFrame(data, copy=False)


def feature_columns(columns: list[str] | pd.Index) -> list[str]:
    """Model inputs shared by all horizons (``f_*``), in frame order."""
    return [c for c in columns if c.startswith("f_")]


def horizon_columns(columns: list[str] | pd.Index, h: int) -> list[str]:
    """Per-horizon model inputs for horizon ``h`` (``x{h}_*``), in frame order."""
    prefix = f"x{h}_"
    return [c for c in columns if c.startswith(prefix)]


def is_scaled(name: str) -> bool:
    """True for features in the unit of ``y`` (divide by ``level`` to make them scale-free)."""
    return name.startswith("f_u_") or ("_u_" in name and name.startswith("x"))


def horizons_of(columns: list[str] | pd.Index) -> list[int]:
    """Horizons whose target column ``y_h{h}`` the frame holds, ascending."""
    return sorted(int(c[3:]) for c in columns if c.startswith("y_h") and c[3:].isdigit())
