"""The one adapter from a forecast model to the policy's per-rank speed forecast.

A policy asks ``forecaster.forecast(state, horizons)`` for ``(len(horizons), P, 3)`` p10/p50/p90
quantiles of per-rank *speed*: compute seconds per microbatch per unit of layer cost, i.e.
``compute / (cost x M)``. A model forecasts the *delay signal* ``compute / (cost x load)``
(``bubblecast.dataset.series``), so speed = delay x load / M. :class:`ModelSpeeds` makes that
conversion for every caller, from one of two sources of the model's quantiles:

- **live** (the prediction service's ``/v1/recommend`` and the runtime controller): a served
  model (``predict_window``, :mod:`bubblecast.forecast.served`) asked on :attr:`ModelSpeeds.
  window`, the recent steps, set before each decision;
- **offline** (policy evaluation on recorded runs, :func:`model_forecaster`): the model's
  forecasts precomputed for every origin of a run (:attr:`ModelSpeeds.table`), looked up by
  ``state.t``; origins without a forecast fall back to another forecaster.

Either way the model is asked only at the horizons it knows; the others are interpolated
linearly between them and held flat outside (:func:`interpolate_horizons`). At its own
horizons the p10-p90 interval is recalibrated online by adaptive conformal inference
(:attr:`ModelSpeeds.aci`, :class:`bubblecast.forecast.conformal.AdaptiveConformal`): each
observed step scores the intervals issued for it and widens or narrows the next ones so that
their coverage tracks 80% on the run at hand (``aci = None`` turns it off), with the step
:data:`SERVED_ACI`. The last answer is
kept (:attr:`ModelSpeeds.asked`, :attr:`ModelSpeeds.last`) for callers that report it.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from bubblecast.errors import BubblecastError

if TYPE_CHECKING:  # annotations only: importing bubblecast.dataset loads pandas
    from bubblecast.dataset.window import Window


#: The adaptive conformal step the policy layer serves intervals with (the keywords of
#: :class:`~bubblecast.forecast.conformal.AdaptiveConformal`): 0.3 on a horizon's first update,
#: decaying exponentially (scale 60 updates) to 0.02, so that a run's intervals reach their
#: coverage within its first hundred or so steps and then move slowly. The calibration and
#: decision benchmarks that chose it are on the results page.
SERVED_ACI: Mapping[str, float] = MappingProxyType(
    {"gamma": 0.02, "gamma_start": 0.3, "decay": 60.0})


class ForecastUnavailable(Exception):
    """No forecast possible (yet, or in time); the message says why. Callers that must keep
    going (the runtime controller) turn it into "keep the current plan"."""


class UnusableForecast(BubblecastError):
    """The model gave no usable forecast for this window; ``field`` names the input."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def checked_quantiles(q: np.ndarray, stages: int, horizons: int) -> np.ndarray:
    """Model output as finite, non-negative, sorted ``(stages, horizons, 3)``;
    :class:`UnusableForecast` otherwise (a model that cannot forecast this window)."""
    q = np.asarray(q, dtype=np.float64)
    expect = (stages, horizons, 3)
    if q.shape != expect or not np.all(np.isfinite(q)):
        raise UnusableForecast("ranks", "the model gave no finite forecast for this window "
                               f"(shape {q.shape}, expected {expect})")
    return np.sort(np.maximum(q, 0.0), axis=2)


def interpolate_horizons(q: np.ndarray, known: Sequence[int] | np.ndarray,
                         horizons: Sequence[int] | np.ndarray) -> np.ndarray:
    """``(len(horizons), ...)`` from ``q`` ``(len(known), ...)`` forecast at the sorted
    ``known`` horizons: linear in between, held flat before the first and after the last."""
    hm = np.asarray(known, dtype=np.float64)
    hz = np.asarray(horizons, dtype=np.float64)
    if len(hm) == 1:
        return np.repeat(q[:1], len(hz), axis=0)
    idx = np.clip(np.searchsorted(hm, hz), 1, len(hm) - 1)
    lo, hi = hm[idx - 1], hm[idx]
    span = np.where(hi > lo, hi - lo, 1.0)
    frac = np.clip((hz - lo) / span, 0.0, 1.0).reshape((-1,) + (1,) * (q.ndim - 1))
    return q[idx - 1] * (1 - frac) + q[idx] * frac


class ModelSpeeds:
    """A forecast model as the policy's ``SpeedForecaster`` (see the module docstring).

    Live: ``ModelSpeeds(model, name=..., window=...)``; set :attr:`window` before each
    decision. Offline: ``ModelSpeeds(table=..., table_horizons=..., fallback=...)``, built by
    :func:`model_forecaster`; ``table[t]`` holds the ``(H_model, P, 3)`` speed quantiles made
    at origin step index ``t`` (NaN where the model had none; ``fallback`` serves those).
    """

    def __init__(self, model: Any = None, *, name: str = "served-model",
                 window: Window | None = None, table: np.ndarray | None = None,
                 table_horizons: Sequence[int] | np.ndarray | None = None,
                 fallback: Any = None) -> None:
        if (model is None) == (table is None):
            raise BubblecastError("ModelSpeeds: give either a served model or a forecast table")
        if table is not None and (table_horizons is None or fallback is None):
            raise BubblecastError("ModelSpeeds: a forecast table needs its horizons and a "
                                  "fallback forecaster")
        self.model = model
        self.name = name
        self.window = window
        self.table = table
        self.horizons_model = None if table_horizons is None else np.asarray(table_horizons)
        self.fallback = fallback
        self.asked: np.ndarray = np.zeros(0)
        self.last: np.ndarray | None = None
        from bubblecast.forecast.conformal import AdaptiveConformal

        self.aci: AdaptiveConformal | None = AdaptiveConformal(**SERVED_ACI)
        self.offset = 0  # absolute step index of history row 0 (a live history drops rows)

    @property
    def min_window(self) -> int:
        """The fewest steps of history the live model needs."""
        return int(getattr(self.model, "min_window", 1))

    def forecast(self, state: Any, horizons: Sequence[int] | np.ndarray) -> np.ndarray:
        """``(H, P, 3)`` sorted speed quantiles at ``horizons`` after ``state``."""
        history = getattr(state, "history", None)
        if self.aci is not None and history is not None and len(history):
            self.aci.observe(history, int(state.t) + self.offset)
        if self.table is not None:
            out = self._from_table(state, horizons)
        else:
            out = self._from_window(horizons, getattr(state, "t", None))
        self.asked, self.last = np.asarray(horizons, dtype=np.int64), out
        return out

    def _from_window(self, horizons: Sequence[int] | np.ndarray, t: int | None = None
                     ) -> np.ndarray:
        """From :attr:`window`, cut after its step index ``t`` when the state is an earlier
        origin than the window's end (the forecast guard's backtests)."""
        hz = np.asarray(horizons, dtype=np.int64)
        w = self.window
        if w is not None and t is not None and 0 <= int(t) < w.steps - 1:
            w = _window_head(w, int(t) + 1)
        if w is None or w.steps < self.min_window:
            have = 0 if w is None else w.steps
            raise ForecastUnavailable(f"model '{self.name}' needs {self.min_window} steps of "
                                      f"history, has {have}")
        known = self.model.horizons
        ask = hz if known is None else np.array(sorted(known), dtype=np.int64)
        q = checked_quantiles(self.model.predict_window(w, ask.tolist()), w.stages, len(ask))
        speed = q * (w.load[-1] / w.microbatches)[:, None, None]  # (P, Ha, 3)
        speed = np.transpose(speed, (1, 0, 2))  # (Ha, P, 3)
        if self.aci is not None and t is not None:
            speed = self.aci.adjust(speed, ask, int(t) + self.offset)
        if known is not None:
            speed = interpolate_horizons(speed, ask, hz)
        return np.sort(speed, axis=2)

    def _from_table(self, state: Any, horizons: Sequence[int] | np.ndarray) -> np.ndarray:
        hz = np.asarray(horizons, dtype=np.float64)
        t = int(state.t)
        table = self.table
        if t >= len(table) or not np.all(np.isfinite(table[t])):  # type: ignore[arg-type]
            return self.fallback.forecast(state, hz)
        q = table[t]  # type: ignore[index]
        if self.aci is not None:
            q = self.aci.adjust(q, self.horizons_model, t)  # type: ignore[arg-type]
        return np.sort(interpolate_horizons(q, self.horizons_model, hz), axis=2)


def _window_head(w: Window, n: int) -> Window:
    """The first ``n`` steps of ``w`` (tokens known ahead are dropped: they were for its end)."""
    from dataclasses import replace

    def cut(a: np.ndarray | None) -> np.ndarray | None:
        return None if a is None else a[:n]

    return replace(w, compute=w.compute[:n], cost=w.cost[:n], tokens=cut(w.tokens),
                   layers=cut(w.layers), next_tokens=None)


class CachingForecaster:
    """Any ``SpeedForecaster`` that remembers its last answer (for the predicted saving)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = str(getattr(inner, "name", type(inner).__name__))
        self.last: tuple[np.ndarray, np.ndarray] | None = None  # (horizons, (H, P, 3))

    def forecast(self, state: Any, horizons: np.ndarray) -> np.ndarray:
        q = np.asarray(self.inner.forecast(state, horizons), dtype=np.float64)
        self.last = (np.asarray(horizons), q)
        return q


def model_dataset_config(model: Any, horizons: list[int]) -> Any:
    """The features config the model was trained with (as carried by it), else the default
    one for its horizons: features must be built as for training."""
    from bubblecast.dataset import DatasetConfig

    config = getattr(model, "dataset_config_", None) \
        or (getattr(model, "metadata_", None) or {}).get("dataset_config")
    if isinstance(config, dict):
        try:
            config = DatasetConfig(**config)
        except (TypeError, ValueError):
            config = None
    if not isinstance(config, DatasetConfig):
        config = DatasetConfig(horizons=tuple(horizons))
    return config


def model_forecaster(model: Any, events: Any, run_id: str, steps: np.ndarray,
                     unit: np.ndarray, fallback: Any = None, metrics: Any = None
                     ) -> ModelSpeeds:
    """Precompute ``model``'s forecasts for every origin of one run (offline
    :class:`ModelSpeeds`; ``fallback`` defaults to the built-in trend forecaster).
    ``metrics``: the run's ``device_metrics`` rows, for a model trained with covariates
    (features are built as for training; None: none).

    ``steps`` are the run's step numbers in order and ``unit`` the ``(T, D, P)`` observed
    per-rank speeds the policy works in; the model's delay signal is rescaled to that unit by
    the median ratio over the run's rows (the two differ only by the work unit), and the
    replicas are reduced by their maximum (the slowest replica paces the step).
    """
    from bubblecast.dataset import build_dataset
    from bubblecast.policy.forecasting import TrendForecaster

    horizons = [int(h) for h in getattr(model, "horizons_", [1, 5, 10])]
    config = model_dataset_config(model, horizons)
    try:
        frame, _ = build_dataset(events.run(run_id) if len(events.run_ids) > 1 else events,
                                 config, metrics=metrics)
        pred = model.predict(frame, horizons)
    except (BubblecastError, ValueError, KeyError) as exc:
        raise BubblecastError(f"run '{run_id}': cannot forecast with the model: {exc}") from None
    t_index = {int(s): i for i, s in enumerate(steps)}
    T, D, P = unit.shape
    table = np.full((T, len(horizons), D, P, 3), np.nan)
    ti = pred["step"].map(t_index).to_numpy()
    ok = ~np.isnan(ti.astype(np.float64))
    pred = pred.loc[ok]
    ti = ti[ok].astype(np.int64)
    hi = np.searchsorted(np.array(horizons), pred["horizon"].to_numpy())
    rep = pred["replica"].to_numpy(np.int64)
    stg = pred["stage"].to_numpy(np.int64)
    table[ti, hi, rep, stg] = pred[["p10", "p50", "p90"]].to_numpy(np.float64)
    scale = _unit_scale(frame, t_index, unit)
    if D > 1:
        with warnings.catch_warnings():  # origins without forecasts stay NaN (fallback)
            warnings.simplefilter("ignore", RuntimeWarning)
            table = np.nanmax(table, axis=2) * scale
    else:
        table = table[:, :, 0] * scale
    return ModelSpeeds(table=table, table_horizons=np.array(horizons),
                       fallback=fallback or TrendForecaster(),
                       name=getattr(model, "kind", "model"))


def _unit_scale(frame: Any, t_index: dict[int, int], unit: np.ndarray) -> float:
    """Median ratio of the policy's speed to the model's signal at the same rows (1 when the
    frame has no signal column)."""
    if "y" not in frame.columns:
        return 1.0
    fy = frame[["step", "replica", "stage", "y"]].copy()
    fy["ti"] = fy["step"].map(t_index)
    fy = fy.dropna(subset=["ti"])
    ours = unit[fy["ti"].to_numpy(np.int64), fy["replica"].to_numpy(np.int64),
                fy["stage"].to_numpy(np.int64)]
    theirs = fy["y"].to_numpy(np.float64)
    good = np.isfinite(ours) & np.isfinite(theirs) & (theirs > 0)
    return float(np.median(ours[good] / theirs[good])) if good.any() else 1.0
