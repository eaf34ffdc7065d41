"""A trained forecaster served from a raw window of recent steps (service and controller).

A served model answers :meth:`ForecastModel.predict_window` with a
:class:`~bubblecast.dataset.window.Window` (one pipeline replica, oldest step first) and
returns quantiles of the *delay signal* per rank and horizon (compute seconds per unit of work
held). :func:`load_served` loads a model directory or ``models:/`` URI into one, with the
:class:`ModelInfo` facts ``/v1/model`` reports.

Forecasters read a features frame (``bubblecast.dataset``). :class:`FeatureModel` turns a
window into the same step series the dataset builder makes from events, appends
``max(horizons)`` empty future steps (carrying only the tokens known ahead), runs the
dataset's own :func:`~bubblecast.dataset.features.build_features` and predicts from the origin
row of each stage. Features never look ahead, so the padding changes nothing but the
known-ahead inputs. That exact path costs tens of milliseconds; with ``fast=True`` (default)
and a model whose inputs :mod:`bubblecast.dataset.online` computes, the origin row comes from
numpy instead (under a millisecond), fed to the model's ``predict_matrix`` when it has one
(LightGBM), else to its ``predict_signal`` on a light column frame. The fast path is used
only if, when the model loads, it reproduces the exact path's input columns and forecasts on
probe windows; otherwise a warning is logged and the path stays exact (``feature_path``).
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from bubblecast.dataset.window import Window
from bubblecast.errors import BubblecastError

RUN_ID = "live"
log = logging.getLogger("bubblecast.serve")


@runtime_checkable
class ForecastModel(Protocol):
    """A loaded forecaster as the service uses it.

    ``min_window``: the fewest steps of history it needs. ``horizons``: the horizons it can
    forecast, or None for any. ``predict_window(window, horizons)`` returns
    ``(stages, len(horizons), 3)`` quantiles p10 <= p50 <= p90 of the delay signal.
    """

    min_window: int
    horizons: tuple[int, ...] | None

    def predict_window(self, window: Window, horizons: Sequence[int]) -> np.ndarray: ...


@dataclass(frozen=True)
class ModelInfo:
    """What ``/v1/model`` reports about the model being served."""

    name: str
    version: str
    source: str
    alias: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    loaded_at: float = field(default_factory=time.time)


def check_model(model: object) -> ForecastModel:
    """``model`` if it follows the protocol, else a TypeError naming what is missing."""
    missing = [a for a in ("min_window", "horizons", "predict_window") if not hasattr(model, a)]
    if missing:
        raise TypeError(f"{type(model).__name__} is not a ForecastModel (missing: "
                        f"{', '.join(missing)})")
    if int(model.min_window) < 1:  # type: ignore[attr-defined]
        raise TypeError(f"{type(model).__name__}.min_window must be >= 1")
    return model  # type: ignore[return-value]


def window_series(window: Window, pad: int) -> Any:
    """The step-series frame (``bubblecast.dataset.series`` columns) of ``window`` plus
    ``pad`` future steps with unknown compute."""
    import pandas as pd

    t, p = window.compute.shape
    n = t + pad
    compute = np.full((n, p), np.nan)
    compute[:t] = window.compute
    cost = np.vstack([window.cost, np.repeat(window.cost[-1:], pad, axis=0)])
    tokens = np.full((n, p), np.nan)
    if window.tokens is not None:
        tokens[:t] = window.tokens
    layers = np.full((n, p), np.nan)
    if window.layers is not None:
        layers[:t] = window.layers
        layers[t:] = window.layers[-1]
    mb = float(window.microbatches)
    load = np.where(np.isfinite(tokens), tokens, mb)
    work = cost * load
    order = "F"  # stage-major: each stage's series is contiguous and ordered by step
    return pd.DataFrame({
        "run_id": pd.Categorical([RUN_ID] * (n * p)),
        "replica": np.zeros(n * p, dtype=np.int32),
        "stage": np.repeat(np.arange(p, dtype=np.int32), n),
        "step": np.tile(np.arange(n, dtype=np.int64), p),
        "compute_s": compute.ravel(order),
        "microbatches": np.full(n * p, mb),
        "layers": layers.ravel(order),
        "cost": cost.ravel(order),
        "tokens": tokens.ravel(order),
        "tokens2": (tokens**2 / mb).ravel(order),
        "work": work.ravel(order),
        "y": (compute / work).ravel(order),
        "scenario": pd.Categorical(["live"] * (n * p)),
    })


def set_known_ahead(series: Any, window: Window, horizons: Sequence[int]) -> None:
    """Write the tokens known ahead (one value per requested horizon) into the padding."""
    if window.next_tokens is None or window.tokens is None:
        return
    t, p = window.compute.shape
    n = len(series) // p
    tokens = series["tokens"].to_numpy().reshape(p, n).copy()
    for h, value in zip(horizons, window.next_tokens, strict=True):
        if t - 1 + h < n:
            tokens[:, t - 1 + h] = value
    series["tokens"] = tokens.ravel()
    series["tokens2"] = tokens.ravel() ** 2 / float(window.microbatches)


def probe_window(steps: int, seed: int, stages: int = 3, tokens: bool = False) -> Window:
    """A synthetic window with noise, a drift, periodic spikes and (optionally) tokens."""
    rng = np.random.default_rng(seed)
    t = np.arange(steps)[:, None]
    y = (1.0 + 0.2 * np.arange(stages))[None, :] * (1.0 + 0.003 * t * (seed % 2))
    y = y * (1.0 + 0.05 * rng.standard_normal((steps, stages)))
    y[:: 7 + seed, 0] *= 1.6
    tok = np.repeat(rng.integers(500, 1500, (steps, 1)).astype(float), stages, axis=1) \
        if tokens else None
    load = tok if tok is not None else 4.0
    layers = np.full((steps, stages), 2.0)
    layers[steps - 5 - 20 * seed:, 0] += 1  # a repartition, recent or older than the history
    layers[steps - 5 - 20 * seed:, 1] -= 1
    return Window(compute=np.abs(y) * layers * load, cost=layers.copy(), microbatches=4,
                  tokens=tok, layers=layers,
                  next_tokens=None if tok is None else rng.integers(500, 1500, 3).astype(float))


class FeatureModel:
    """A fitted ``bubblecast.forecast`` forecaster behind the service's window protocol."""

    def __init__(self, forecaster: Any, config: Any = None, fast: bool = True) -> None:
        from bubblecast.dataset.config import DatasetConfig

        if not hasattr(forecaster, "horizons_"):
            raise BubblecastError("model: the forecaster is not fitted")
        self.forecaster = forecaster
        self.horizons = tuple(int(h) for h in forecaster.horizons_)
        cfg = config or getattr(forecaster, "dataset_config_", None)
        self.config = cfg if isinstance(cfg, DatasetConfig) else DatasetConfig(
            horizons=self.horizons)
        self.min_window = int(self.config.history)
        meta = getattr(forecaster, "metadata_", None) or {}
        self.name = str(getattr(forecaster, "kind", "model"))
        self.metrics = dict(meta.get("metrics") or {})
        self.fast = None
        if fast:
            from bubblecast.dataset.online_frame import FastFeatures

            if FastFeatures.covers(forecaster, self.config):
                # Lightest first; each is kept only if it forecasts exactly as the pandas path.
                for mode in self._fast_modes(forecaster):
                    self.fast = FastFeatures(forecaster, self.config, mode=mode)
                    if self._fast_agrees():
                        break
                    self.fast = None
            if self.fast is None:
                log.warning("model %s: served through the pandas feature path (slower)",
                            self.name)

    @staticmethod
    def _fast_modes(forecaster: Any) -> list[str]:
        """Fast paths to try, lightest first: the frame-free ``predict_matrix`` only for a
        forecaster that implements it (the base class raises NotImplementedError)."""
        modes = ["light", "frame"]
        try:
            forecaster.matrix_columns([int(h) for h in forecaster.horizons_])
        except Exception:  # noqa: BLE001 - no matrix path: NotImplementedError, missing attrs
            return modes
        return ["matrix", *modes]

    @property
    def predict_path(self) -> str:
        """How the forecaster is called: ``matrix`` (its ``predict_matrix`` on a float
        array) or ``signal`` (its ``predict_signal`` on a frame)."""
        return "matrix" if self.fast is not None and self.fast.mode == "matrix" else "signal"

    @property
    def feature_path(self) -> str:
        """How origin features are computed: ``numpy`` (light frame), ``numpy+pandas`` (a
        small DataFrame) or ``pandas`` (the dataset's build_features on the window)."""
        if self.fast is None:
            return "pandas"
        return "numpy" if self.fast.light else "numpy+pandas"

    def origin_rows(self, window: Window, horizons: Sequence[int]) -> Any:
        """The features frame rows at the window's last step, one per stage in stage order."""
        from bubblecast.dataset.features import build_features

        pad = max(self.config.horizons)
        series = window_series(window, pad)
        set_known_ahead(series, window, horizons)
        frame = build_features(series, self.config)
        rows = frame.loc[frame["step"] == window.steps - 1].sort_values("stage")
        return rows.reset_index(drop=True)

    def _fast_agrees(self) -> bool:
        """The fast path against the exact one on probe windows (spikes, drift, tokens,
        a repartition): every input column the model reads, and the forecasts."""
        from bubblecast.dataset.online import origin_features
        from bubblecast.dataset.online_frame import FastFeatures

        hz = list(self.horizons)
        need = sorted(FastFeatures.needed(self.forecaster) | {"level"})
        for seed in range(3):
            window = probe_window(self.min_window + 7 * seed, seed, tokens=seed == 2)
            try:
                fast = self.fast.predict(window, hz)  # type: ignore[union-attr]
                mine = origin_features(window, self.config, hz)
            except Exception as exc:  # noqa: BLE001 - any failure means: not this path
                log.info("fast feature path unavailable: %s: %s", type(exc).__name__, exc)
                return False
            rows = self.origin_rows(window, hz)
            for col in need:
                a = rows[col].to_numpy(dtype=np.float64)
                b = np.asarray(mine[col], dtype=np.float64)
                if not np.allclose(b, a, rtol=2e-6, atol=1e-9, equal_nan=True):
                    log.info("fast feature path differs on column %s", col)
                    return False
            exact = self._exact(window, hz)
            if not np.allclose(fast, exact, rtol=1e-6, atol=1e-12, equal_nan=True):
                return False
        return True

    def predict_window(self, window: Window, horizons: Sequence[int]) -> np.ndarray:
        hz = [int(h) for h in horizons]
        if self.fast is not None:
            return self.fast.predict(window, hz)
        return self._exact(window, hz)

    def _exact(self, window: Window, hz: list[int]) -> np.ndarray:
        rows = self.origin_rows(window, hz)
        preds = self.forecaster.predict_signal(rows, hz)
        return np.stack([np.asarray(preds[h], dtype=np.float64) for h in hz], axis=1)

    def check(self) -> FeatureModel:
        """Forecast a synthetic window once, so a model the service cannot serve fails at
        load time, not on the first request."""
        t, p = self.min_window, 2
        rng = np.random.default_rng(0)
        compute = 1.0 + 0.05 * rng.random((t, p))
        window = Window(compute=compute, cost=np.ones((t, p)), microbatches=4)
        model: Any = self
        probe = self._covariate_probe(t, p)
        if probe is not None:  # a model trained with covariates: synthetic device metrics
            from bubblecast.dataset.online_frame import WithCovariates

            model = WithCovariates(self, probe[0], list(range(p)), meta=probe[1])
        try:
            q = model.predict_window(window, list(self.horizons))
        except BubblecastError:
            raise
        except Exception as exc:
            raise BubblecastError(f"model: cannot forecast from a window ({type(exc).__name__}: "
                                  f"{exc})") from None
        if q.shape != (p, len(self.horizons), 3) or not np.all(np.isfinite(q)):
            raise BubblecastError(f"model: forecast of a test window has shape {q.shape} or "
                                  "non-finite values")
        return self

    def _covariate_probe(self, t: int, p: int) -> tuple[Any, Any] | None:
        """Synthetic device metrics (rows for ranks ``0..p-1`` over ``t`` steps and the
        horizons) and run metadata (a calendar) for the covariates the forecaster reads; None
        when it reads none."""
        import pandas as pd

        from bubblecast.dataset.covariates import covariate_columns, covariate_input
        from bubblecast.dataset.online_frame import model_columns

        reads = covariate_columns(sorted(model_columns(self.forecaster)))
        sources = sorted({str(covariate_input(c)) for c in reads})
        if not sources:
            return None
        metrics = [m for m in sources if not m.startswith("calendar:")]
        kinds = [m.split(":", 1)[1] for m in sources if m.startswith("calendar:")]
        steps = np.arange(t + max(self.horizons), dtype=np.int64)
        n = len(steps) * p
        frame = pd.concat([pd.DataFrame({"step": np.tile(steps, p),
                                         "rank": np.repeat(np.arange(p), len(steps)),
                                         "metric": m, "value": 1.0 + 0.01 * np.arange(n)})
                           for m in metrics] or [pd.DataFrame(
                               {"step": [], "rank": [], "metric": [], "value": []})],
                          ignore_index=True)
        meta = None
        if kinds:
            from types import SimpleNamespace

            meta = SimpleNamespace(extra={"calendar": {f"{k}_every": 10 for k in kinds}})
        return frame, meta


def serve_forecaster(obj: Any, fast: bool = True) -> FeatureModel:
    """Wrap a loaded forecaster for serving, checked on a synthetic window."""
    return FeatureModel(obj, fast=fast).check()


_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/@]+)|/(?P<version>[^/@]+))$")

#: ``load(uri) -> model object`` for a directory or a pinned ``models:/name/N`` URI.
ModelLoader = Callable[[str], Any]


def parse_uri(uri: str) -> tuple[str, str | None, str | None] | None:
    """``(name, alias, version)`` of a ``models:/`` URI, None for anything else."""
    m = _URI.match(uri)
    if m is None:
        if uri.startswith("models:/"):
            raise BubblecastError(f"--model: '{uri}' is not models:/NAME@ALIAS or models:/NAME/N")
        return None
    return m.group("name"), m.group("alias"), m.group("version")


def default_loader(uri: str, tracking_uri: str | None = None) -> Any:
    """Load with the forecasting stage's ``load_model`` (directories and ``models:/`` URIs)."""
    from bubblecast.forecast.modeldir import load_model

    return load_model(uri, tracking_uri=tracking_uri)


def as_forecast_model(obj: Any, uri: str) -> ForecastModel:
    """``obj`` itself when it answers ``predict_window``; a fitted ``bubblecast.forecast``
    forecaster wrapped by :class:`FeatureModel`."""
    if hasattr(obj, "predict_window"):
        return obj
    if hasattr(obj, "predict_signal") and hasattr(obj, "horizons_"):
        return serve_forecaster(obj)
    raise BubblecastError(f"--model {uri}: a {type(obj).__name__} cannot forecast from a window "
                          "of recent steps (no predict_window)")


def model_facts(obj: Any) -> tuple[str | None, dict[str, Any]]:
    """(name, training metrics) a loaded model reports about itself, if any."""
    name = getattr(obj, "name", None) or getattr(obj, "kind", None)
    metrics = getattr(obj, "metrics", None)
    if not metrics:
        metrics = (getattr(obj, "metadata_", None) or {}).get("metrics")
    return (str(name) if name else None), (dict(metrics) if isinstance(metrics, dict) else {})


def alias_version(uri: str, name: str, alias: str, tracking_uri: str | None) -> str:
    """The registry version ``models:/name@alias`` points to now."""
    try:
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=tracking_uri)
        return str(client.get_model_version_by_alias(name, alias).version)
    except Exception as exc:  # noqa: BLE001 - any registry failure means "unknown now"
        raise BubblecastError(f"--model {uri}: cannot resolve alias ({exc})") from None


def run_metrics(name: str, version: str, tracking_uri: str | None) -> dict[str, Any]:
    """The metrics of the MLflow run that logged this version (empty if unknown)."""
    try:
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=tracking_uri)
        run_id = client.get_model_version(name, version).run_id
        return dict(client.get_run(run_id).data.metrics) if run_id else {}
    except Exception:  # noqa: BLE001 - metrics are informative only
        return {}


def load_served(source: str, *, loader: ModelLoader | None = None,
                tracking_uri: str | None = None) -> tuple[ForecastModel, ModelInfo]:
    """Load ``source`` (a model directory, ``models:/name@alias`` or ``models:/name/N``) as a
    served model with its facts; one-line BubblecastError when it is none of these."""
    uri = str(source)
    registry = parse_uri(uri)
    if registry is None and not Path(uri).is_dir():
        raise BubblecastError(f"--model: {uri} is not a model directory or a models:/ URI")
    return load_parsed(uri, registry, loader=loader, tracking_uri=tracking_uri)


def load_parsed(uri: str, registry: tuple[str, str | None, str | None] | None, *,
                loader: ModelLoader | None = None, tracking_uri: str | None = None
                ) -> tuple[ForecastModel, ModelInfo]:
    """:func:`load_served` of an already parsed source (``registry``: :func:`parse_uri`'s
    answer). An alias is resolved to a version first and that exact version loaded, so the
    version reported is the one served even if the alias moves during the load."""
    load = loader or (lambda u: default_loader(u, tracking_uri=tracking_uri))
    if registry is None:
        try:  # a directory has no version number: its model.json's content names it
            version = hashlib.sha256((Path(uri) / "model.json").read_bytes()).hexdigest()[:12]
        except OSError:
            version = "unknown"
        obj = load(uri)
        name, metrics = model_facts(obj)
        info = ModelInfo(name=name or Path(uri).name, version=version, source=uri,
                         metrics=metrics)
        return as_forecast_model(obj, uri), info
    reg_name, alias, pinned = registry
    version = pinned if alias is None else alias_version(uri, reg_name, alias, tracking_uri)
    obj = load(f"models:/{reg_name}/{version}")
    _, metrics = model_facts(obj)
    if not metrics:
        metrics = run_metrics(reg_name, str(version), tracking_uri)
    info = ModelInfo(name=reg_name, version=str(version), alias=alias, source=uri,
                     metrics=metrics)
    return as_forecast_model(obj, uri), info
