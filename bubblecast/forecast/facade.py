"""``BubbleForecast``: build the dataset, fit forecasters, forecast, evaluate, save and load.

In the spirit of mlforecast's ``MLForecast``: one object holds the dataset settings and a list
of models. ``fit(runs)`` builds the leakage-free features frame with :mod:`bubblecast.dataset`
and fits each model; ``predict(window)`` forecasts from an online
:class:`~bubblecast.dataset.window.Window` (or recent events) through the same path the service
uses (:class:`~bubblecast.forecast.served.FeatureModel`); ``evaluate(runs)`` returns the
``evaluate --json`` object (the CLI's scoring,
:func:`~bubblecast.forecast.evaluation_run.score_models`, on the features and models in
memory); ``save``/``load`` use the model-directory format (:mod:`bubblecast.forecast.modeldir`),
so ``serve`` and ``evaluate`` accept what ``save`` writes. Estimator rules as scikit-learn:
``__init__`` stores parameters, ``fit`` returns self, fitted attributes end in ``_``.

The micro-batch cost model (kind ``cost``, :class:`~bubblecast.forecast.cost_model.CostModel`)
may be one of the models: it is fitted on the runs' events, not their features, forecasts no
delay signal (``predict`` leaves it out), and ``evaluate`` reports its error
(:meth:`~bubblecast.forecast.cost_model.CostModel.score`) under ``cost``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bubblecast.errors import BubblecastError

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

    from bubblecast.dataset.config import DatasetConfig
    from bubblecast.dataset.window import Window
    from bubblecast.forecast.base import Forecaster
    from bubblecast.forecast.cost_model import CostModel
    from bubblecast.telemetry.events import Events

Runs = Any  # Events, a path, or a list of paths / Events
QUANTILES = ("p10", "p50", "p90")


def as_events(runs: Runs, format: str = "auto") -> Events:
    """One ``Events`` from an ``Events``, a path (any format) or a list of them; refuses two
    inputs that share a run id (each run must come from one input)."""
    from bubblecast.telemetry.events import Events
    from bubblecast.telemetry.importers import load_events

    items = list(runs) if isinstance(runs, (list, tuple)) else [runs]
    if not items:
        raise BubblecastError("runs: no events given")
    parts = [r if isinstance(r, Events) else load_events(Path(r), format) for r in items]
    if len(parts) == 1:
        return parts[0]
    events = Events.concat(parts)
    if len(events.run_ids) != sum(len(p.run_ids) for p in parts):
        raise BubblecastError("runs: the inputs share run ids; each run must come from one input")
    return events


def window_from_events(events: Events, run_id: str | None = None, replica: int = 0) -> Window:
    """The online window of one replica of one run: its step series as ``(steps, stages)``
    matrices of compute seconds, layer cost held, tokens and layers (as the controller sees
    them live)."""
    import numpy as np

    from bubblecast.dataset.series import step_series
    from bubblecast.dataset.window import Window
    from bubblecast.sim.replay import select_run

    run_id, ev = select_run(events, run_id)
    series = step_series(ev)
    series = series.loc[series["replica"] == replica]
    if series.empty:
        raise BubblecastError(f"run '{run_id}': no replica {replica}")

    def matrix(col: str) -> np.ndarray:
        table = series.pivot_table(index="step", columns="stage", values=col, dropna=False)
        return table.sort_index().sort_index(axis=1).to_numpy(np.float64)

    tokens, layers = matrix("tokens"), matrix("layers")
    return Window(compute=matrix("compute_s"), cost=matrix("cost"),
                  microbatches=int(ev.runs[run_id].microbatches),
                  tokens=tokens if np.isfinite(tokens).any() else None,
                  layers=layers if np.isfinite(layers).any() else None)


def _sources(runs: Runs) -> list[str]:
    """The paths among ``runs`` (recorded with the features)."""
    return [str(r) for r in (runs if isinstance(runs, (list, tuple)) else [runs])
            if isinstance(r, (str, os.PathLike))]


def _horizons(forecasters: Sequence[Any]) -> list[int]:
    """The horizons every forecaster forecasts (none without forecasters)."""
    if not forecasters:
        return []
    return sorted(set.intersection(*(set(m.horizons_) for m in forecasters)))


class BubbleForecast:
    """Forecast each stage's delay signal ``horizons`` steps ahead with ``models``.

    ``models``: kinds (``lgbm``, ``seq``, ``last``, ``ewma``, ``rolling_median``,
    ``seasonal_naive``, and ``cost``: the micro-batch cost model), ``(kind, params)`` pairs
    such as ``("lgbm", {"n_estimators": 80})``, or unfitted forecaster (or cost model)
    instances (cloned at fit). ``horizons``,
    ``windows`` and ``lags`` configure the dataset as ``bubblecast dataset`` does; ``seed``
    seeds every model given by kind and the evaluation's cross-fitting; ``format`` is the input
    format of paths given as runs; ``n_jobs``: threads that build the features (scikit-learn's
    convention: None or -1 every core, -2 all but one); the values do not depend on it.
    """

    def __init__(self, models: Sequence[str | Forecaster] = ("lgbm",),
                 horizons: Sequence[int] = (1, 5, 10), windows: Sequence[int] = (5, 20, 60),
                 lags: int = 32, seed: int = 0, format: str = "auto",
                 n_jobs: int | None = None) -> None:
        self.models = models
        self.horizons = horizons
        self.windows = windows
        self.lags = lags
        self.seed = seed
        self.format = format
        self.n_jobs = n_jobs

    # -- scikit-learn style parameters ------------------------------------------------------
    def get_params(self, deep: bool = True) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("models", "horizons", "windows", "lags", "seed",
                                              "format", "n_jobs")}

    def set_params(self, **params: Any) -> BubbleForecast:
        for key, value in params.items():
            if key not in self.get_params():
                raise ValueError(f"BubbleForecast: unknown parameter '{key}'")
            setattr(self, key, value)
        return self

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"BubbleForecast({args})"

    # -- fitting ------------------------------------------------------------------------------
    def dataset_config(self) -> DatasetConfig:
        """The dataset configuration of the parameters (``max_period`` as the CLI: half the
        longest window, at most 30); one-line error when invalid."""
        from bubblecast.dataset.config import DatasetConfig

        try:
            ws = tuple(int(w) for w in self.windows)
            return DatasetConfig(horizons=tuple(self.horizons), windows=ws, lags=self.lags,
                                 max_period=min(30, max(2, max(ws or (2,)) // 2)))
        except ValueError as exc:
            raise BubblecastError(str(exc)) from None

    def features(self, runs: Runs) -> tuple[pd.DataFrame, Any]:
        """The features frame and its metadata of ``runs`` (the fitted dataset configuration
        once fitted, else the parameters')."""
        from bubblecast.dataset.builder import build_dataset

        config = getattr(self, "dataset_config_", None) or self.dataset_config()
        return build_dataset(as_events(runs, self.format), config, sources=_sources(runs),
                             n_jobs=self.n_jobs)

    def _unfitted(self) -> list[Forecaster | CostModel]:
        from bubblecast.forecast.base import Forecaster
        from bubblecast.forecast.cost_model import CostModel
        from bubblecast.forecast.modeldir import COST_KIND, make_model, model_class

        if isinstance(self.models, (str, Forecaster, CostModel)):
            raise BubblecastError("models: give a list, e.g. models=['lgbm']")
        out: list[Forecaster | CostModel] = []
        for spec in self.models:
            if isinstance(spec, str):
                out.append(CostModel(seed=self.seed) if spec == COST_KIND
                           else make_model(spec, seed=self.seed))
            elif isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[1], dict):
                kind, params = spec
                names = CostModel().get_params() if kind == COST_KIND else \
                    model_class(kind)._param_names()
                unknown = sorted(set(params) - set(names))
                if unknown:
                    raise BubblecastError(f"models: {kind} has no parameter '{unknown[0]}'")
                out.append(CostModel(**{"seed": self.seed, **params}) if kind == COST_KIND
                           else make_model(kind, **{"seed": self.seed, **params}))
            elif isinstance(spec, (Forecaster, CostModel)):
                out.append(type(spec)(**spec.get_params()))  # a clone: the input stays unfitted
            else:
                raise BubblecastError(f"models: expected a kind, a (kind, params) pair or a "
                                      f"forecaster, got {spec!r}")
        if not out:
            raise BubblecastError("models: give at least one model")
        return out

    def fit(self, runs: Runs) -> BubbleForecast:
        """Build the features of ``runs`` and fit every forecaster on all of them; a cost model
        is fitted on their events."""
        from bubblecast.dataset.builder import build_dataset
        from bubblecast.forecast.cost_model import CostModel
        from bubblecast.forecast.forecast_evaluation import unique_names
        from bubblecast.forecast.training import MIN_RUNS

        models = self._unfitted()
        forecasters = [m for m in models if not isinstance(m, CostModel)]
        events = as_events(runs, self.format)
        config = getattr(self, "dataset_config_", None) or self.dataset_config()
        dataset: dict[str, Any] = {"runs": len(events.run_ids)}
        if forecasters:
            frame, meta = build_dataset(events, config, sources=_sources(runs),
                                        n_jobs=self.n_jobs)
            n_runs = int(frame["run_id"].nunique())
            for model in forecasters:
                need = MIN_RUNS.get(model.kind, 1)
                if n_runs < need:
                    raise BubblecastError(f"runs: {model.kind} needs at least {need} runs to "
                                          f"train, got {n_runs}")
                model.fit(frame)
            config = meta.config
            dataset = {"fingerprint": meta.fingerprint, "rows": len(frame), "runs": n_runs}
        for model in models:
            if isinstance(model, CostModel):
                model.fit(events, "runs")
        self.models_ = dict(zip(unique_names([m.kind for m in models]), models, strict=True))
        self.dataset_config_ = config
        self.horizons_ = _horizons(forecasters)
        self.dataset_ = dataset
        self._served: dict[str, Any] = {}
        return self

    def _check_fitted(self) -> None:
        if not hasattr(self, "models_"):
            raise BubblecastError("BubbleForecast is not fitted; call fit() or load() first")

    # -- forecasting --------------------------------------------------------------------------
    def predict(self, window: Window | Events, horizons: Sequence[int] | None = None,
                run_id: str | None = None, replica: int = 0) -> pd.DataFrame:
        """Forecasts from the last step of ``window`` (or of one replica of a run of events):
        one row per model, stage and horizon with quantiles ``p10``/``p50``/``p90`` of the delay
        signal and the same in seconds (``p10_s``...: times the work held ahead)."""
        import numpy as np
        import pandas as pd

        from bubblecast.dataset.window import Window

        self._check_fitted()
        names = self._forecasters()
        if not names:
            raise BubblecastError("predict: no forecaster among the models (a cost model "
                                  "prices micro-batches: models_['cost'].predict)")
        if not isinstance(window, Window):
            window = window_from_events(as_events(window, self.format), run_id, replica)
        hz = [int(h) for h in (horizons if horizons is not None else self.horizons_)]
        unknown = [h for h in hz if h not in self.horizons_]
        if unknown:
            raise BubblecastError(f"horizons: the models forecast {self.horizons_}, not {unknown}")
        work = window.cost[-1][:, None] * window.load_ahead(len(hz))  # (stages, H)
        stage, horizon = np.meshgrid(np.arange(window.stages), hz, indexing="ij")
        parts = []
        for name in names:
            q = np.sort(np.asarray(self._served_model(name).predict_window(window, hz),
                                   dtype=np.float64), axis=2)
            part = pd.DataFrame({"model": name, "stage": stage.ravel(),
                                 "horizon": horizon.ravel()})
            for j, col in enumerate(QUANTILES):
                part[col] = q[:, :, j].ravel()
            for j, col in enumerate(QUANTILES):
                part[f"{col}_s"] = (q[:, :, j] * work).ravel()
            parts.append(part)
        return pd.concat(parts, ignore_index=True)

    def _forecasters(self) -> list[str]:
        """Names of the fitted models that forecast the delay signal (all but cost models)."""
        from bubblecast.forecast.modeldir import COST_KIND

        return [n for n, m in self.models_.items() if m.kind != COST_KIND]

    def _served_model(self, name: str) -> Any:
        """The model behind the service's window protocol (built once per model)."""
        from bubblecast.forecast.served import FeatureModel

        if name not in self._served:
            self._served[name] = FeatureModel(self.models_[name], self.dataset_config_)
        return self._served[name]

    # -- evaluation, persistence --------------------------------------------------------------
    def evaluate(self, runs: Runs, seed: int | None = None) -> dict[str, Any]:
        """The ``evaluate --json`` object of the fitted models on ``runs`` (MAE, coverage and
        skill per model and horizon, with the best baseline): the CLI's own evaluation, run
        on these runs' features and the fitted models, in memory. A cost model's error
        (``evaluate EVENTS --model DIR``'s object) is the whole result when it is the only
        model, else under ``cost``."""
        from bubblecast.forecast.evaluation_run import (
            model_names,
            run_cost_evaluation,
            score_models,
        )

        self._check_fitted()
        names = self._forecasters()
        fitted = [self.models_[n] for n in names]
        costs = [m for n, m in self.models_.items() if n not in names]
        out: dict[str, Any] = {}
        if fitted:
            frame, meta = self.features(runs)
            models = dict(zip(model_names([m.kind for m in fitted]), fitted, strict=True))
            result, _ = score_models(frame, meta, models,
                                     seed=self.seed if seed is None else seed)
            out = result.summary()
        if costs:
            cost = run_cost_evaluation(as_events(runs, self.format), costs[0], "cost", "runs",
                                       track=False)
            out = {**out, "cost": cost} if fitted else cost
        return out

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write the fitted models as model directories: ``directory`` itself for one model
        (what ``serve`` and ``evaluate --model`` take), ``directory/<name>`` for several."""
        self._check_fitted()
        if len(self.models_) == 1:
            return self._save_one(next(iter(self.models_.values())), Path(directory))
        self._save_all(Path(directory))
        return Path(directory)

    def _save_one(self, model: Forecaster | CostModel, directory: Path) -> Path:
        from bubblecast.forecast.cost_model import CostModel
        from bubblecast.forecast.cost_modeldir import save_cost_model
        from bubblecast.forecast.modeldir import save_model

        if isinstance(model, CostModel):
            return save_cost_model(model, directory)
        return save_model(model, directory, metrics=(getattr(model, "metadata_", None) or {})
                          .get("metrics"), extra={"dataset": self.dataset_})

    def _save_all(self, directory: Path) -> list[Path]:
        return [self._save_one(m, directory / name) for name, m in self.models_.items()]

    @classmethod
    def load(cls, source: str | os.PathLike[str],
             tracking_uri: str | None = None) -> BubbleForecast:
        """A fitted ``BubbleForecast`` from a model directory, a directory of them (as
        :meth:`save` writes several) or an MLflow ``models:/NAME@ALIAS`` / ``runs:/`` URI."""
        from bubblecast.dataset.config import DatasetConfig
        from bubblecast.forecast.cost_modeldir import load_any_model
        from bubblecast.forecast.modeldir import COST_KIND, MODEL_FILE

        text = str(source)
        if text.startswith(("models:/", "runs:/")) or (Path(text) / MODEL_FILE).is_file():
            loaded = {"": load_any_model(text, tracking_uri=tracking_uri)}
        else:
            subdirs = sorted(d for d in Path(text).glob(f"*/{MODEL_FILE}")) \
                if Path(text).is_dir() else []
            if not subdirs:
                load_any_model(text)  # raises the model directory's own one-line error
            loaded = {d.parent.name: load_any_model(d.parent) for d in subdirs}
        models = list(loaded.values())
        forecasters = [m for m in models if m.kind != COST_KIND]
        first = forecasters[0] if forecasters else None
        config = getattr(first, "dataset_config_", None) or DatasetConfig(
            horizons=tuple(first.horizons_) if first is not None else (1,))
        out = cls(models=[m.kind for m in models], horizons=config.horizons,
                  windows=config.windows, lags=config.lags)
        names = list(loaded) if "" not in loaded else [models[0].kind]
        out.models_ = dict(zip(names, models, strict=True))
        out.dataset_config_ = config
        out.horizons_ = _horizons(forecasters)
        out.dataset_ = dict(((getattr(first, "metadata_", None) or {}).get("dataset")) or {})
        out._served = {}
        return out
