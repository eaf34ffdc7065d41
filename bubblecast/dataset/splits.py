"""Run-grouped splits and rolling-origin backtests of a features frame.

A run never straddles train and test (rows of one run are strongly correlated, so a split
within a run would leak). Rolling-origin folds move a cut-off through each run's steps: train
on rows whose targets are all known by the cut-off, test on the rows after it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from bubblecast.dataset.features import horizons_of


def _runs_in_order(frame: pd.DataFrame, seed: int) -> list[str]:
    """Runs shuffled with ``seed``, interleaved across scenarios so every split sees each."""
    rng = np.random.default_rng(seed)
    by_run = frame.groupby("run_id", observed=True)["scenario"].first() if "scenario" in \
        frame.columns else pd.Series("all", index=pd.unique(frame["run_id"].astype(str)))
    groups: dict[str, list[str]] = {}
    for run, scen in sorted((str(r), str(s)) for r, s in by_run.items()):
        groups.setdefault(scen, []).append(run)
    queues = [list(rng.permutation(runs)) for _, runs in sorted(groups.items())]
    order: list[str] = []
    while any(queues):
        for q in queues:
            if q:
                order.append(str(q.pop()))
    return order


def split_runs(frame: pd.DataFrame, fractions: dict[str, float], seed: int = 0
               ) -> dict[str, np.ndarray]:
    """Boolean row masks, one per named split, assigning whole runs by ``fractions``.

    Every split with a positive fraction gets at least one run when there are enough runs;
    the first split takes the rounding remainder.
    """
    if not fractions or any(v < 0 for v in fractions.values()) or sum(fractions.values()) <= 0:
        raise ValueError(f"split fractions must be non-negative with a positive sum: {fractions}")
    runs = _runs_in_order(frame, seed)
    total = sum(fractions.values())
    names = list(fractions)
    counts = {n: int(np.floor(fractions[n] / total * len(runs))) for n in names}
    for n in names[1:]:
        if fractions[n] > 0 and counts[n] == 0 and len(runs) > sum(counts.values()) + 1:
            counts[n] = 1
    counts[names[0]] = len(runs) - sum(counts[n] for n in names[1:])
    run_ids = frame["run_id"].astype(str).to_numpy()
    masks, at = {}, 0
    for n in names:
        chosen = set(runs[at:at + counts[n]])
        at += counts[n]
        masks[n] = np.isin(run_ids, list(chosen))
    return masks


def run_folds(frame: pd.DataFrame, n_folds: int, seed: int = 0
              ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Group k-fold by run: ``(train_mask, test_mask)`` per fold."""
    runs = _runs_in_order(frame, seed)
    if not 2 <= n_folds <= len(runs):
        raise ValueError(f"n_folds must be in 2..{len(runs)} (the number of runs), got {n_folds}")
    run_ids = frame["run_id"].astype(str).to_numpy()
    folds = []
    for k in range(n_folds):
        test = np.isin(run_ids, runs[k::n_folds])
        folds.append((~test, test))
    return folds


def rolling_origin(frame: pd.DataFrame, n_folds: int = 3, test_runs: list[str] | None = None
                   ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Rolling-origin folds: ``(train_mask, test_mask)`` with cut-offs moving through each run.

    Fold k cuts each run at the k-th of ``n_folds + 1`` equal parts of its steps; train rows
    are those whose every target step (origin + largest horizon) is at or before the cut-off,
    test rows those with an origin in the next part. With ``test_runs`` the train rows come
    from the other runs only and the test rows from ``test_runs`` only (run-grouped as well).
    """
    if n_folds < 1:
        raise ValueError(f"n_folds must be >= 1, got {n_folds}")
    h_max = max(horizons_of(frame.columns), default=0)
    step = frame["step"].to_numpy()
    grp = frame.groupby("run_id", observed=True)["step"]
    lo = grp.transform("min").to_numpy()
    hi = grp.transform("max").to_numpy()
    run_ids = frame["run_id"].astype(str).to_numpy()
    in_test = np.isin(run_ids, test_runs) if test_runs is not None else np.ones(len(step), bool)
    in_train = ~in_test if test_runs is not None else np.ones(len(step), bool)
    folds = []
    for k in range(1, n_folds + 1):
        cut = lo + (hi - lo) * k / (n_folds + 1)
        nxt = lo + (hi - lo) * (k + 1) / (n_folds + 1)
        train = in_train & (step + h_max <= cut)
        test = in_test & (step > cut) & (step <= nxt)
        folds.append((train, test))
    return folds
