"""Configuration of the dataset builder: horizons, windows, lags and spike detection."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

#: Bumped whenever the meaning or layout of the features file changes; files built by another
#: version are refused (features would silently mean something else).
FEATURES_VERSION = 1


def _positive_ints(name: str, values: tuple[int, ...] | list[int]) -> tuple[int, ...]:
    out = tuple(int(v) for v in values)
    if not out or any(v < 1 for v in out):
        raise ValueError(f"dataset config: '{name}' must be positive integers, got {list(values)}")
    if len(set(out)) != len(out):
        raise ValueError(f"dataset config: '{name}' has duplicates: {list(values)}")
    return tuple(sorted(out))


@dataclass
class DatasetConfig:
    """What the builder computes; every feature uses data at or before the forecast origin.

    ``windows`` are the rolling-window lengths (steps); the longest one is also the history a
    row needs before it gets features, so a run must have at least ``max(windows) +
    max(horizons)`` steps. ``lags`` is the number of lagged values kept per series (and the
    sequence length the sequence model reads); ``ewm_alphas`` the EWMA smoothing factors;
    ``spike_ratio`` flags a step whose value exceeds the median of the previous ``windows[1]``
    steps by that factor; ``max_period`` the longest period the autocorrelation scan tries.
    """

    horizons: tuple[int, ...] = (1, 5, 10)
    windows: tuple[int, ...] = (5, 20, 60)
    lags: int = 32
    ewm_alphas: tuple[float, ...] = (0.5, 0.2, 0.05)
    quantiles: tuple[float, ...] = (0.1, 0.5, 0.9)
    spike_ratio: float = 1.25
    max_period: int = 30
    extra: dict[str, Any] = field(default_factory=dict)
    covariates: str = "none"

    def __post_init__(self) -> None:
        self.horizons = _positive_ints("horizons", self.horizons)
        self.windows = _positive_ints("windows", self.windows)
        if len(self.windows) < 2 or self.windows[0] < 2:
            raise ValueError("dataset config: 'windows' needs at least two windows, each >= 2")
        if not 1 <= int(self.lags) <= self.windows[-1]:
            raise ValueError(f"dataset config: 'lags' must be in 1..{self.windows[-1]} "
                             f"(the longest window), got {self.lags}")
        self.lags = int(self.lags)
        self.ewm_alphas = tuple(float(a) for a in self.ewm_alphas)
        if not self.ewm_alphas or any(not 0.0 < a <= 1.0 for a in self.ewm_alphas):
            raise ValueError(f"dataset config: 'ewm_alphas' must be in (0, 1], got "
                             f"{list(self.ewm_alphas)}")
        self.quantiles = tuple(float(q) for q in self.quantiles)
        if any(not 0.0 < q < 1.0 for q in self.quantiles):
            raise ValueError("dataset config: 'quantiles' must be in (0, 1)")
        if not self.spike_ratio > 1.0:
            raise ValueError(f"dataset config: 'spike_ratio' must be > 1, got {self.spike_ratio}")
        if not 2 <= int(self.max_period) <= self.windows[-1] // 2:
            raise ValueError(f"dataset config: 'max_period' must be in 2..{self.windows[-1] // 2}"
                             f" (half the longest window), got {self.max_period}")
        self.max_period = int(self.max_period)
        if self.covariates not in ("none", "auto"):
            raise ValueError(f"dataset config: 'covariates' must be none or auto, got "
                             f"{self.covariates!r}")

    @property
    def history(self) -> int:
        """Steps of history a row needs (the longest window)."""
        return self.windows[-1]

    @property
    def min_steps(self) -> int:
        """Shortest run the builder accepts: the longest window plus the largest horizon."""
        return self.windows[-1] + self.horizons[-1]

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("horizons", "windows", "ewm_alphas", "quantiles"):
            out[key] = list(out[key])
        if out["covariates"] == "none":
            del out["covariates"]  # files (and fingerprints) without covariates as before
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> DatasetConfig:
        return cls(**{k: v for k, v in obj.items() if k in cls.__dataclass_fields__})
