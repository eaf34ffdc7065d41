"""Rolling-origin backtests: refit at moving cut-offs, score on the steps after each one."""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from bubblecast.dataset.splits import rolling_origin
from bubblecast.forecast.base import Forecaster
from bubblecast.forecast.baselines import BASELINES
from bubblecast.forecast.forecast_evaluation import evaluate, unique_names


def rolling_backtest(frame: pd.DataFrame, make: Callable[[], Forecaster], n_folds: int = 3,
                     test_runs: list[str] | None = None, seed: int = 0) -> pd.DataFrame:
    """Metrics per fold (column ``fold``): fold k fits ``make()`` on rows whose targets are
    known by the k-th cut-off (from runs other than ``test_runs`` when given) and evaluates it,
    with the baselines, on the origins up to the next cut-off (see
    :func:`bubblecast.dataset.splits.rolling_origin`)."""
    parts = []
    for k, (train, test) in enumerate(rolling_origin(frame, n_folds, test_runs)):
        fit_frame = frame.loc[train].reset_index(drop=True)
        fit_frame.attrs = dict(frame.attrs)
        model = make().fit(fit_frame)
        name = unique_names([model.kind], taken=list(BASELINES))[0]
        ev = evaluate(frame.loc[test].reset_index(drop=True), {name: model}, seed=seed)
        parts.append(ev.table.assign(fold=k, train_rows=int(train.sum()),
                                     test_rows=int(test.sum())))
    return pd.concat(parts, ignore_index=True)
