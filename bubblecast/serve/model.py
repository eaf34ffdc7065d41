"""What the service needs from a forecaster: a narrow protocol and the facts it reports.

The service forecasts from a raw window of recent steps, not from a features table, so a model
it serves answers :meth:`ForecastModel.predict_window` with a :class:`Window` (one pipeline
replica, oldest step first) and returns quantiles of the *delay signal* per rank and horizon:
compute seconds per unit of work held, the partition-invariant target of the forecasting stage
(``bubblecast.dataset.series``). Work is the layer cost a rank held times its load (tokens of
the step when known, else the number of microbatches); the service turns delay quantiles back
into seconds with the work each rank will hold at each horizon.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

QUANTILES = (0.1, 0.5, 0.9)


@dataclass(frozen=True)
class Window:
    """Recent history of one pipeline replica; every matrix is ``(steps, stages)``.

    ``cost``: layer cost held per step (1 where unknown); ``tokens``: tokens per step (None
    when unknown); ``layers``: layers held (None when unknown); ``next_tokens``: tokens per
    step at each requested horizon when known ahead (``(H,)``).
    """

    compute: np.ndarray
    cost: np.ndarray
    microbatches: int
    tokens: np.ndarray | None = None
    layers: np.ndarray | None = None
    next_tokens: np.ndarray | None = None

    @property
    def steps(self) -> int:
        return int(self.compute.shape[0])

    @property
    def stages(self) -> int:
        return int(self.compute.shape[1])

    @property
    def load(self) -> np.ndarray:
        """``(steps, stages)`` load per step: tokens where known, else the microbatch count."""
        if self.tokens is None:
            return np.full(self.compute.shape, float(self.microbatches))
        return np.where(np.isfinite(self.tokens), self.tokens, float(self.microbatches))

    @property
    def work(self) -> np.ndarray:
        return self.cost * self.load

    @property
    def delay(self) -> np.ndarray:
        """The delay signal: compute seconds per unit of work held."""
        return self.compute / self.work

    def load_ahead(self, n_horizons: int) -> np.ndarray:
        """``(stages, H)`` load at each horizon: tokens known ahead, else the last load."""
        last = self.load[-1]
        if self.next_tokens is None or self.tokens is None:
            return np.repeat(last[:, None], n_horizons, axis=1)
        has = np.isfinite(self.tokens[-1])
        ahead = np.asarray(self.next_tokens, dtype=np.float64)[None, :]
        return np.where(has[:, None], ahead, last[:, None])


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
