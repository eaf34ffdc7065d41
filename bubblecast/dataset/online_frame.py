"""A forecaster fed from :func:`~bubblecast.dataset.online.origin_matrix`: the service's
feature adapters (split from ``online.py``, which computes the features).

:class:`FastFeatures` predicts from the origin matrix by the forecaster's ``predict_matrix``
(no frame), or by its ``predict_signal`` on a :class:`ColumnFrame` (the slice of the
DataFrame API it reads) or on a small pandas frame.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from bubblecast.dataset.online import origin_matrix
from bubblecast.dataset.window import Window


def model_columns(forecaster: Any) -> set[str]:
    """Features-frame columns a fitted forecaster reads, as far as its fitted attributes
    (``features_``, ``horizon_features_`` per horizon, ``column_``) tell."""
    need = set(getattr(forecaster, "features_", []))
    for h in getattr(forecaster, "horizons_", []):
        need |= {f"x{h}_{g[2:]}" for g in getattr(forecaster, "horizon_features_", [])}
    need |= set(getattr(forecaster, "column_", {}).values())
    return need


class _Column:
    """One column of a :class:`ColumnFrame`: what ``frame[name].to_numpy(...)`` returns."""

    __slots__ = ("values",)

    def __init__(self, values: np.ndarray) -> None:
        self.values = values

    def to_numpy(self, dtype: Any = None, copy: bool = False, **_: Any) -> np.ndarray:
        return self.values.astype(dtype) if dtype is not None else self.values


class _Names(list):
    """Column names with an O(1) ``in``."""

    def __init__(self, names: list[str]) -> None:
        super().__init__(names)
        self._set = frozenset(names)

    def __contains__(self, name: object) -> bool:
        return name in self._set


class ColumnFrame:
    """The read-only slice of the pandas DataFrame API a forecaster's ``predict_signal``
    uses on its inputs (``columns``, ``frame[name].to_numpy()``, ``len``), over the origin
    matrix without building a DataFrame. Whether a model's ``predict_signal`` is content with
    it is checked when the model loads (:class:`bubblecast.forecast.served.FeatureModel`)."""

    def __init__(self, names: list[str], matrix: np.ndarray, level: np.ndarray) -> None:
        self._index = {n: i for i, n in enumerate(names)}
        self._matrix = matrix
        self._level = level
        self.columns = _Names(names + ["level"])

    def __len__(self) -> int:
        return int(self._level.shape[0])

    def __getitem__(self, name: str) -> _Column:
        if name == "level":
            return _Column(self._level)
        i = self._index.get(name)
        if i is None:
            raise KeyError(name)
        return _Column(self._matrix[i])


class FastFeatures:
    """Origin rows from :func:`origin_matrix`, predicted by the forecaster: straight from the
    matrix by its ``predict_matrix`` (``mode="matrix"``: no frame at all), or by its own
    ``predict_signal`` on a :class:`ColumnFrame` (``"light"``) or a small pandas frame
    (``"frame"``)."""

    MODES = ("matrix", "light", "frame")

    def __init__(self, forecaster: Any, cfg: Any, light: bool = True,
                 mode: str | None = None) -> None:
        mode = mode or ("light" if light else "frame")
        if mode not in self.MODES:
            raise ValueError(f"mode must be one of {self.MODES}, got {mode!r}")
        self.forecaster = forecaster
        self.cfg = cfg
        self.mode = mode
        self.light = mode != "frame"
        self._plans: dict[tuple[int, ...], np.ndarray] = {}
        self._predict_matrix = forecaster.predict_matrix if mode == "matrix" else None

    @staticmethod
    def needed(forecaster: Any) -> set[str]:
        """Input columns the forecaster reads (:func:`model_columns`)."""
        return model_columns(forecaster)

    @classmethod
    def covers(cls, forecaster: Any, cfg: Any) -> bool:
        """True when every column the forecaster names is computed here."""
        hz = [int(h) for h in forecaster.horizons_]
        t = cfg.history
        probe = Window(compute=1.0 + np.random.default_rng(0).random((t, 2)),
                       cost=np.ones((t, 2)), microbatches=2)
        need = cls.needed(forecaster)
        return bool(need) and need <= set(origin_matrix(probe, cfg, hz)[0])

    def _origin(self, window: Window, horizons: Sequence[int],
                extra: dict[str, np.ndarray] | None) -> tuple[list[str], np.ndarray, np.ndarray]:
        """:func:`origin_matrix` with the ``extra`` columns it lacks appended as rows."""
        names, matrix, level = origin_matrix(window, self.cfg, horizons)
        if extra:
            have = set(names)
            more = [c for c in extra if c not in have]
            if more:
                names = names + more
                matrix = np.concatenate([matrix, np.stack(
                    [np.asarray(extra[c], dtype=matrix.dtype) for c in more])])
        return names, matrix, level

    def rows(self, window: Window, horizons: Sequence[int],
             extra: dict[str, np.ndarray] | None = None) -> Any:
        """The origin rows (a :class:`ColumnFrame` or a pandas frame), with ``extra``
        ``{column: (P,) values}`` added (covariates the origin matrix does not compute)."""
        names, matrix, level = self._origin(window, horizons, extra)
        if self.light:
            return ColumnFrame(names, matrix, level)
        import pandas as pd

        frame = pd.DataFrame(matrix.T, columns=names)
        frame["level"] = level
        return frame

    def _plan(self, names: list[str], horizons: tuple[int, ...]) -> np.ndarray:
        """Rows of ``[origin matrix; level]`` in the forecaster's ``matrix_columns`` order
        (NaN row where the origin has no such column); cached per horizons."""
        plan = self._plans.get(horizons)
        if plan is None:
            where = {n: i for i, n in enumerate(names)}
            where["level"] = len(names)
            cols = self.forecaster.matrix_columns(list(horizons))
            plan = np.array([where.get(c, len(names) + 1) for c in cols], dtype=np.intp)
            self._plans[horizons] = plan
        return plan

    def predict(self, window: Window, horizons: Sequence[int],
                extra: dict[str, np.ndarray] | None = None) -> np.ndarray:
        """``(P, H, 3)`` forecasts from the origin rows, ``extra`` columns added
        (:meth:`rows`)."""
        if self.mode == "matrix":
            names, matrix, level = self._origin(window, horizons, extra)
            full = np.empty((matrix.shape[0] + 2, matrix.shape[1]))
            full[:-2] = matrix
            full[-2] = level
            full[-1] = np.nan
            X = full[self._plan(names, tuple(int(h) for h in horizons))].T
            return np.asarray(self._predict_matrix(X, list(horizons)), dtype=np.float64)
        preds = self.forecaster.predict_signal(self.rows(window, horizons, extra),
                                               list(horizons))
        return np.stack([np.asarray(preds[h], dtype=np.float64) for h in horizons], axis=1)


class WithCovariates:
    """A served feature model whose origin rows also get covariate features from device
    metrics (the prediction service, from a request's ``device_metrics``; the runtime
    controller, from the metrics it samples).

    ``model``: a :class:`bubblecast.forecast.served.FeatureModel` (what is read of it:
    ``origin_rows(window, horizons)``, ``forecaster``, ``config``, ``horizons``,
    ``min_window``); ``metrics``: device-metric rows (``step``, ``rank``, ``metric``,
    ``value``) where step ``first_step + i`` is the window's row ``i``; ``ranks``: the rank of
    each stage, in stage order; ``meta``: run metadata with a ``calendar``, if any. The
    covariates at the window's last step come from
    :func:`bubblecast.dataset.covariates.origin_covariates` (the dataset's code), so a window
    cut at an earlier origin (the forecast guard's backtests) reads no later metric.
    ``fill``: a covariate column the model reads that ``metrics`` cannot give (a metric no rank
    reports) is NaN, as the dataset gives a rank without the metric (the runtime controller:
    it names such metrics itself); False (the service: it refuses such a request first), it
    is left out.
    """

    def __init__(self, model: Any, metrics: Any, ranks: Sequence[int], first_step: int = 0,
                 meta: Any = None, fill: bool = False) -> None:
        self.model = model
        self.fill = fill
        self.metrics = metrics
        self.ranks = [int(r) for r in ranks]
        self.first_step = int(first_step)
        self.meta = meta
        self.horizons = model.horizons
        self.min_window = model.min_window

    def __getattr__(self, name: str) -> Any:
        if name == "model":  # not yet set (copy, unpickling)
            raise AttributeError(name)
        return getattr(self.model, name)

    def predict_window(self, window: Window, horizons: Sequence[int]) -> np.ndarray:
        """``(stages, len(horizons), 3)`` quantiles of the delay signal, as the model's own
        ``predict_window`` with the covariate columns added to its origin rows."""
        from bubblecast.dataset.covariates import origin_covariates

        hz = [int(h) for h in horizons]
        rows = self.model.origin_rows(window, hz)
        origin = self.first_step + window.steps - 1
        covariates = origin_covariates(self.metrics, self.ranks, origin, self.model.config,
                                       self.meta)
        import pandas as pd

        if self.fill:
            from bubblecast.dataset.covariates import covariate_columns

            nan = np.full(len(rows), np.nan, dtype=np.float32)
            for col in covariate_columns(sorted(model_columns(self.model.forecaster))):
                covariates.setdefault(col, nan)
        new = {k: v for k, v in covariates.items() if k not in rows.columns}
        rows = pd.concat([rows, pd.DataFrame(new, index=rows.index)], axis=1)
        preds = self.model.forecaster.predict_signal(rows, hz)
        return np.stack([np.asarray(preds[h], dtype=np.float64) for h in hz], axis=1)
