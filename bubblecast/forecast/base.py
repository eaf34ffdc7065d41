"""The forecaster interface shared by baselines, LightGBM and the sequence model.

``fit(frame) -> self`` learns from a features frame (``bubblecast.dataset``); ``predict(frame,
horizons)`` returns one row per input row and horizon with quantiles ``p10``, ``p50``, ``p90``
of the delay signal ``y`` (seconds per unit of work) and the same in seconds (``p10_s`` ...:
the signal times the work the stage holds at the target step, ``work_h{h}``, or at the origin).
Estimators follow scikit-learn's rules: ``__init__`` only stores parameters and fitted
attributes end in ``_``. Models are scale-free: inputs in the unit of ``y`` are divided by the
row's ``level`` (its recent median) and targets are learnt as ``log(y_h / level)``.
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from bubblecast.dataset.config import DatasetConfig
from bubblecast.dataset.features import horizons_of, is_scaled
from bubblecast.errors import BubblecastError

QUANTILES: tuple[float, float, float] = (0.1, 0.5, 0.9)
QUANTILE_COLUMNS: list[str] = ["p10", "p50", "p90"]
KEY_COLUMNS: list[str] = ["run_id", "replica", "stage", "step"]


class Forecaster:
    """Base class: parameters in ``__init__``, ``fit``, ``predict`` and a JSON-able state."""

    kind: ClassVar[str] = "base"

    # -- scikit-learn style parameters -------------------------------------------------------
    @classmethod
    def _param_names(cls) -> list[str]:
        sig = inspect.signature(cls.__init__)
        return [p for p in sig.parameters if p != "self"]

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._param_names()}

    def set_params(self, **params: Any) -> Forecaster:
        for key, value in params.items():
            if key not in self._param_names():
                raise ValueError(f"{type(self).__name__}: unknown parameter '{key}'")
            setattr(self, key, value)
        return self

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"

    # -- the interface ------------------------------------------------------------------------
    def fit(self, frame: pd.DataFrame) -> Forecaster:
        raise NotImplementedError

    def predict_signal(self, frame: pd.DataFrame, horizons: list[int]) -> dict[int, np.ndarray]:
        """``{h: (n, 3) array}`` of p10/p50/p90 of ``y`` at t+h for each row of ``frame``."""
        raise NotImplementedError

    def matrix_columns(self, horizons: list[int]) -> list[str]:
        """Column names, in order, of the matrix :meth:`predict_matrix` takes (fast path)."""
        raise NotImplementedError(f"{type(self).__name__} has no matrix prediction path")

    def predict_matrix(self, X: np.ndarray, horizons: list[int]) -> np.ndarray:
        """``(n, H, 3)`` quantiles of ``y`` from a float matrix in :meth:`matrix_columns` order:
        the numbers of :meth:`predict_signal` without building a frame (serving hot path)."""
        raise NotImplementedError(f"{type(self).__name__} has no matrix prediction path")

    def predict(self, frame: pd.DataFrame, horizons: list[int] | None = None) -> pd.DataFrame:
        """Quantile forecasts, one row per (input row, horizon), in ``y`` units and seconds."""
        self.check_fitted()
        hz = list(horizons) if horizons is not None else list(self.horizons_)
        unknown = [h for h in hz if h not in self.horizons_]
        if unknown:
            raise BubblecastError(f"{self.kind} model forecasts horizons "
                                  f"{list(self.horizons_)}, not {unknown}")
        return long_predictions(frame, self.predict_signal(frame, hz))

    def check_fitted(self) -> None:
        """Raise a one-line :class:`BubblecastError` unless the model is fitted (``fit`` or
        ``load_state`` ran): what predicting and saving check first."""
        if not hasattr(self, "horizons_"):
            raise BubblecastError(f"{self.kind} model is not fitted; call fit() first")

    # -- persistence hooks (see bubblecast.forecast.modeldir) ---------------------------------
    def state(self) -> dict[str, Any]:
        """Fitted attributes as JSON-able values (native files are written by ``save_native``)."""
        return {"horizons_": list(self.horizons_)}

    def save_native(self, directory: str) -> list[str]:
        """Write native model files into ``directory``; return their names."""
        return []

    def load_state(self, state: dict[str, Any], directory: str) -> Forecaster:
        self.horizons_ = [int(h) for h in state["horizons_"]]
        return self


def long_predictions(frame: pd.DataFrame, preds: dict[int, np.ndarray]) -> pd.DataFrame:
    """Stack per-horizon ``(n, 3)`` quantile arrays into the long prediction frame."""
    keys = [c for c in KEY_COLUMNS if c in frame.columns]
    parts = []
    for h, q in preds.items():
        q = np.sort(np.asarray(q, dtype=np.float64), axis=1)
        part = frame[keys].reset_index(drop=True).copy()
        part["horizon"] = np.int32(h)
        work = frame[f"work_h{h}"] if f"work_h{h}" in frame.columns else frame["work"]
        work = work.to_numpy(dtype=np.float64)
        for j, col in enumerate(QUANTILE_COLUMNS):
            part[col] = q[:, j]
        for j, col in enumerate(QUANTILE_COLUMNS):
            part[f"{col}_s"] = q[:, j] * work
        parts.append(part)
    if not parts:
        return pd.DataFrame(columns=keys + ["horizon", *QUANTILE_COLUMNS])
    return pd.concat(parts, ignore_index=True)


def fit_splits(frame: pd.DataFrame, val_fraction: float, cal_fraction: float, seed: int
                   ) -> dict[str, np.ndarray]:
    """Boolean masks ``train``, ``val`` (early stopping) and ``cal`` (conformal), disjoint
    sets of whole runs; each share with a positive fraction gets at least one run."""
    from bubblecast.dataset.splits import split_runs

    runs = frame["run_id"].nunique()
    if runs < 3:
        raise BubblecastError(f"training needs at least 3 runs (train, validation, calibration); "
                              f"the features frame has {runs}")
    train = max(1e-9, 1.0 - val_fraction - cal_fraction)
    # three disjoint sets of runs: conformal shifts never see a run that fitted or
    # early-stopped the model
    masks = split_runs(frame, {"train": train, "val": val_fraction, "cal": cal_fraction}, seed)
    ids = frame["run_id"].astype(str).to_numpy()
    for name, fraction in (("val", val_fraction), ("cal", cal_fraction)):
        train_runs = sorted(set(ids[masks["train"]]))
        if fraction > 0 and not masks[name].any() and len(train_runs) > 1:
            # rounding left this share without a run (few runs): it takes one training run
            moved = ids == train_runs[-1]
            masks["train"] &= ~moved
            masks[name] |= moved
    return masks


def dataset_config_of(frame: pd.DataFrame) -> DatasetConfig | None:
    """The dataset config a features frame was built with (from ``frame.attrs``), if known.

    Models keep it as ``dataset_config_`` so that whoever serves them builds the same features.
    """
    meta = frame.attrs.get("bubblecast_features") if hasattr(frame, "attrs") else None
    try:
        return DatasetConfig.from_json(meta["config"]) if meta else None
    except (KeyError, TypeError, ValueError):
        return None


def frame_horizons(frame: pd.DataFrame) -> list[int]:
    """Horizons a training frame has targets for; refuses a frame with none (one line)."""
    hz = horizons_of(frame.columns)
    if not hz:
        raise BubblecastError("features frame has no target columns 'y_h<h>' to learn from")
    return hz


#: Columns a model may anchor on: targets are learnt relative to it, inputs divided by it.
ANCHORS: dict[str, str] = {"level": "level", "last": "f_u_lag0"}


def level_of(frame: pd.DataFrame, anchor: str = "level") -> np.ndarray:
    """The row's anchor value (``level``: recent median; ``last``: the latest value)."""
    col = ANCHORS.get(anchor)
    if col is None:
        raise BubblecastError(f"unknown anchor '{anchor}' (choose from {', '.join(ANCHORS)})")
    if col not in frame.columns:
        raise BubblecastError(f"features frame: missing column '{col}'")
    values = frame[col].to_numpy(dtype=np.float64)
    return np.where(np.isfinite(values), np.maximum(values, 1e-12), np.nan)


def relative_inputs(frame: pd.DataFrame, columns: list[str], log: bool = False,
                    anchor: str = "level") -> np.ndarray:
    """``(n, len(columns))`` float32 inputs with unit-bearing columns divided by ``level``.

    With ``log``, those ratios become log-ratios (clipped), for neural networks.
    """
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise BubblecastError(f"features frame: missing column '{missing[0]}' the model needs")
    level = level_of(frame, anchor)
    out = np.empty((len(frame), len(columns)), dtype=np.float32)
    for j, col in enumerate(columns):
        values = frame[col].to_numpy(dtype=np.float64)
        if is_scaled(col):
            values = values / level
            if log:
                with np.errstate(divide="ignore", invalid="ignore"):
                    values = np.clip(np.log(np.maximum(values, 1e-6)), -5.0, 5.0)
        out[:, j] = values
    return out


def log_target(frame: pd.DataFrame, h: int, anchor: str = "level") -> np.ndarray:
    """``log(y_h / anchor)`` (NaN where the target is unknown or not positive)."""
    y = frame[f"y_h{h}"].to_numpy(dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.log(y / level_of(frame, anchor))
    z[~np.isfinite(z)] = np.nan
    return z


def horizon_inputs(columns: list[str] | pd.Index, h: int) -> list[str]:
    """Per-horizon inputs of horizon ``h`` (``x{h}_*``), renamed generically by ``generic``."""
    prefix = f"x{h}_"
    return [c for c in columns if c.startswith(prefix)]


def generic(name: str) -> str:
    """``x5_u_seasonal`` -> ``x_u_seasonal`` (the same input for every horizon)."""
    return "x_" + name.split("_", 1)[1] if name.startswith("x") else name
