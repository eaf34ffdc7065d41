"""The online window: recent history of one pipeline replica, as a forecaster reads it live.

The prediction service builds one from each request and the runtime controller from its
telemetry; a served model (``bubblecast.forecast.served``) forecasts from it. Its *delay
signal* is compute seconds per unit of work held, the partition-invariant target of the
forecasting stage (``bubblecast.dataset.series``): work is the layer cost a rank held times
its load (tokens of the step when known, else the number of microbatches).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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
