"""What the controller observes: each rank's compute per step, gathered on rank 0, and the robust
speeds, live forecaster and hysteresis defaults the live policies read. No torch (unit-testable
on its own).

**Telemetry.** Every rank keeps, per step, the sum of its compute-op (F, B, W) durations, read
from the recorder's public step hook at each step end (:class:`StepProbe`). At a control
boundary one ``all_gather`` of a small float64 vector per rank (:func:`pack`: ``[n, compute of
the last K steps, per-layer forward cost x L, per-layer total cost x L, temperature of the last
K steps, slowdown temperature]``, ``2 + 2K + 2L`` values; the temperatures are the rank's
device metrics, NaN where it reports none) brings everything to rank 0, where
:class:`History` keeps the series the policies read: per-step compute per rank, the partition
and micro-batch count in force at each step, and per-layer cost samples.

**Speed.** Compute seconds per unit of load, per micro-batch:
``compute[t, r] / (M_t x (fixed + cost held by r at t))``. Layer costs come from each layer's
first ``cost_samples`` samples and are then frozen, so a rank that slows down later shows up in
its speed, not in the costs of the layers it holds. ``fixed`` (:meth:`History.fixed`) is the
per-micro-batch cost that does not move with the layers (the compute ops' time beyond the layer
forwards timed inside them): per rank the median of ``compute / M - held`` over the recent
steps, then the smallest over the ranks (a rank slow from the start must not pass its slowdown
off as overhead), frozen once the costs are. It keeps a rank's speed per unit of layer cost
from shifting when its share changes.

**Robust speeds and the live forecaster.**

- :func:`robust_speeds`: each rank's speed through a *causal* running median of ``smooth``
  steps: an isolated spike never reaches a policy, a real change shows after
  ``smooth // 2 + 1`` steps, a ramp is delayed by ``smooth // 2`` steps and keeps its slope.
  The reactive and the predictive policy both read this series.
- :class:`RawHistoryForecaster` / :func:`live_forecaster`: the predictive policy's built-in
  forecaster (the policy module's :class:`TrendForecaster`, which aggregates robustly itself
  and whose trend test needs independent noise) reads the *raw* per-step speeds, set before
  each decision, and only those since the partition last changed (:func:`since_last_move`), so
  a trend line never spans a move; a :class:`~.lead.ThermalLead`, when set, adjusts the
  forecast. With ``relative=True`` (the live default) it forecasts each rank's speed relative
  to the ranks' geometric mean, so a load swing common to all ranks cancels, and scales the
  forecast back by the median common level of the last :data:`LEVEL_WINDOW` steps.
- :data:`LIVE_POLICY_DEFAULTS`: the predictive policy's hysteresis in the live loop: no
  decision before ``min_history`` steps; a move must gain ``min_gain`` per step; after a move
  the policy holds ``hold_decisions`` decision periods; a forecast-driven move needs
  ``confirm_decisions`` consecutive agreeing decisions; the forecast guard's ``persistence``
  payback cut is off. Explicit ``policy_params`` override them (:func:`predictive_params`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bubblecast.errors import BubblecastError

#: Predictive-policy knobs of the live loop (explicit ``policy_params`` win).
LIVE_POLICY_DEFAULTS: dict[str, Any] = {"min_gain": 0.05, "hold_decisions": 1,
                                        "min_history": 30, "confirm_decisions": 1,
                                        "persistence": False}
#: Steps whose median common level scales the relative forecast back to speeds.
LEVEL_WINDOW = 10


def robust_speeds(speeds: np.ndarray, smooth: int) -> np.ndarray:
    """``(T, P)`` speeds -> their causal running median over ``smooth`` steps (row ``t`` is
    the median of rows ``t - smooth + 1 .. t``; the first rows use what exists)."""
    x = np.asarray(speeds, dtype=np.float64)
    if smooth <= 1 or x.shape[0] == 0:
        return x.copy()
    from numpy.lib.stride_tricks import sliding_window_view

    padded = np.concatenate([np.full((smooth - 1, x.shape[1]), np.nan), x], axis=0)
    windows = np.sort(sliding_window_view(padded, smooth, axis=0), axis=2)  # NaN sort last
    n = np.isfinite(windows).sum(axis=2, keepdims=True)  # (T, P, 1) values per window
    lo = np.take_along_axis(windows, np.maximum(n - 1, 0) // 2, axis=2)
    hi = np.take_along_axis(windows, n // 2, axis=2)
    out = (lo + hi)[..., 0] / 2  # the nanmedian, without its per-call overhead
    out[n[..., 0] == 0] = np.nan
    return out


def window_speed(history: np.ndarray, window: int) -> np.ndarray:
    """Median per rank over the last ``window`` rows (what a decision record reports)."""
    return np.median(np.asarray(history)[-window:], axis=0)


class RawHistoryForecaster:
    """A history forecaster (``forecast_history(history, horizons)``) that reads
    :attr:`history` (raw per-step speeds, set before each decision) instead of the state's
    smoothed one; the state's when none is set. ``relative``: forecast each rank's speed
    relative to the ranks' geometric mean, times the recent median common level (see the
    module docstring)."""

    def __init__(self, inner: Any, relative: bool = False) -> None:
        self.inner = inner
        self.relative = relative
        self.name = str(getattr(inner, "name", type(inner).__name__))
        self.history: np.ndarray | None = None
        #: a :class:`~.lead.ThermalLead` whose predicted slowdowns the forecast takes in, and
        #: the step the forecast is made at (set before each decision; None: no lead)
        self.lead: Any = None
        self.now = 0

    def forecast(self, state: Any, horizons: np.ndarray) -> np.ndarray:
        q = self._forecast(state, horizons)
        return q if self.lead is None else self.lead.adjust(q, horizons, self.now)

    def _forecast(self, state: Any, horizons: np.ndarray) -> np.ndarray:
        if self.history is None or len(self.history) == 0:
            if not self.relative:
                return self.inner.forecast(state, horizons)
            history = np.asarray(state.history, dtype=np.float64)
        else:
            history = np.asarray(self.history, dtype=np.float64)
        if not self.relative or history.ndim != 2 or history.shape[1] < 2:
            return self.inner.forecast_history(history, horizons)
        logs = np.log(np.maximum(history, 1e-300))
        common = logs.mean(axis=1)
        q = self.inner.forecast_history(np.exp(logs - common[:, None]), horizons)
        return q * float(np.exp(np.median(common[-LEVEL_WINDOW:])))


def since_last_move(raw: np.ndarray, partitions: np.ndarray, least: int = 12) -> np.ndarray:
    """The rows of ``raw`` observed under the current partition (the last row's), or the last
    ``least`` rows when fewer (right after a move)."""
    if len(partitions) == 0:
        return raw
    same = np.all(partitions == partitions[-1], axis=1)
    changed = np.flatnonzero(~same)
    first = int(changed[-1]) + 1 if len(changed) else 0
    return raw[min(first, max(len(raw) - least, 0)):]


def live_forecaster() -> RawHistoryForecaster:
    """The built-in trend forecaster on the raw speed series, relative to the ranks' common
    level."""
    from bubblecast.policy.forecasting import TrendForecaster

    return RawHistoryForecaster(TrendForecaster(), relative=True)


def predictive_params(params: dict[str, Any], every: int) -> dict[str, Any]:
    """``PredictivePolicy`` keyword arguments of the live loop: the defaults above (``hold``
    in steps: ``hold_decisions`` x ``every``), then ``params``."""
    d = LIVE_POLICY_DEFAULTS
    guard = {"confirm": d["confirm_decisions"], "persistence": d["persistence"]}
    out = {"min_gain": d["min_gain"], "hold": d["hold_decisions"] * every,
           "min_history": d["min_history"], "guard": guard, "decide_every": every}
    out.update(params)
    return out


class StepProbe:
    """Collects this rank's compute seconds per step from a :class:`Recorder`, through its
    public step hook (the step's rows are still buffered then). Needs a recording recorder.
    """

    def __init__(self, recorder: Any) -> None:
        if not getattr(recorder, "record", False):
            raise BubblecastError("controller: needs a trainer that records telemetry "
                                  "(record=True)")
        self.values: list[float] = []
        recorder.add_step_hook(self._on_step)

    def _on_step(self, view: Any) -> None:
        self.values.append(view.compute_s())

    def take(self, last: int) -> list[float]:
        """The last ``last`` per-step values (oldest first); the buffer is emptied."""
        out, self.values = self.values[-last:], []
        return out


def pack(compute: list[float], every: int, samples: list[dict[str, Any]],
         layers: int, temperatures: Any = None, slowdown: float | None = None) -> np.ndarray:
    """``[n, compute x every, forward cost x L, total cost x L, temperature x every,
    slowdown]`` for one rank (NaN padded); ``samples`` are recorder layer-cost dicts, the
    latest per layer wins; ``temperatures`` the rank's ``temperature_c`` device metric at the
    same steps as ``compute`` (None or NaN: none); ``slowdown`` its reported slowdown
    temperature (``temperature_slowdown_c``; None: not reported)."""
    out = np.full(2 + 2 * every + 2 * layers, np.nan)
    if slowdown is not None:
        out[-1] = float(slowdown)
    n = min(len(compute), every)
    out[0] = n
    if n:
        out[1:1 + n] = compute[-n:]
        if temperatures is not None:
            temps = np.asarray(temperatures, dtype=np.float64)[-n:]
            first = 1 + every + 2 * layers
            out[first:first + len(temps)] = temps
    for s in samples:
        i = int(s["layer"])
        if 0 <= i < layers:
            out[1 + every + i] = float(s["forward_s"])
            out[1 + every + layers + i] = float(s["total_s"])
    return out


def unpack(rows: np.ndarray, every: int, layers: int
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gathered ``(P, 2 + 2 every + 2L)`` rows of :func:`pack` -> compute ``(n, P)``,
    forward ``(P, L)``, total ``(P, L)`` (NaN where a rank sent no sample)."""
    counts = rows[:, 0].astype(np.int64)
    n = int(counts.min()) if len(counts) else 0
    compute = rows[:, 1:1 + n].T.copy()
    fwd = rows[:, 1 + every:1 + every + layers]
    tot = rows[:, 1 + every + layers:1 + every + 2 * layers]
    return compute, fwd, tot


def unpack_temperatures(rows: np.ndarray, every: int, layers: int
                        ) -> tuple[np.ndarray, np.ndarray]:
    """The ranks' temperatures ``(n, P)`` at the gathered steps (those of :func:`unpack`'s
    compute) and their slowdown temperatures ``(P,)``, NaN where none."""
    counts = rows[:, 0].astype(np.int64)
    n = int(counts.min()) if len(counts) else 0
    first = 1 + every + 2 * layers
    return rows[:, first:first + n].T.astype(np.float64), rows[:, -1].astype(np.float64)


def held_cost(partitions: np.ndarray, totals: np.ndarray, stages: int) -> np.ndarray:
    """``(T, P)`` layer cost each rank holds at each step (loop placement: virtual stage
    ``v`` runs on rank ``v % P``); ``partitions`` is ``(T, V)``, ``totals`` ``(L,)``."""
    edges = np.concatenate([np.zeros((len(partitions), 1), dtype=np.int64),
                            np.cumsum(partitions, axis=1)], axis=1)
    csum = np.concatenate([[0.0], np.cumsum(totals)])
    per_v = csum[edges[:, 1:]] - csum[edges[:, :-1]]  # (T, V)
    v = per_v.shape[1]
    return per_v.reshape(len(partitions), v // stages, stages).sum(axis=1)


class History:
    """Rank 0's view of the run: see the module docstring.

    ``limit`` bounds the steps kept (older ones are dropped); ``split_backward`` says whether
    the schedule runs W apart from B (it decides how a layer's backward cost is split).
    """

    def __init__(self, stages: int, layers: int, *, limit: int = 512, cost_samples: int = 5,
                 measured_costs: bool = True, split_backward: bool = False) -> None:
        if limit < 2 or cost_samples < 1:
            raise BubblecastError("controller history: limit >= 2 and cost_samples >= 1")
        self.stages, self.layers, self.limit = stages, layers, limit
        self.cost_samples, self.measured = cost_samples, measured_costs
        self.split_backward = split_backward
        self.steps = np.zeros(0, dtype=np.int64)
        self.compute = np.zeros((0, stages))
        self.partitions = np.zeros((0, 0), dtype=np.int64)
        self.microbatches = np.zeros(0, dtype=np.int64)
        self._fwd: list[list[float]] = [[] for _ in range(layers)]
        self._tot: list[list[float]] = [[] for _ in range(layers)]
        self._fixed: float | None = None
        self._costs: np.ndarray | None = None  # costs() until a sample is added

    def __len__(self) -> int:
        return len(self.steps)

    def add(self, steps: list[int], compute: np.ndarray, partitions: list[tuple[int, ...]],
            microbatches: list[int]) -> None:
        """Append observed steps (``compute`` is ``(n, P)``); keep the last ``limit``."""
        n = compute.shape[0]
        if n == 0:
            return
        parts = np.asarray(partitions[-n:], dtype=np.int64)
        if parts.shape[1] != self.partitions.shape[1]:  # first steps, or chunks changed
            self.partitions = np.zeros((0, parts.shape[1]), dtype=np.int64)
            self.steps, self.compute = self.steps[:0], self.compute[:0]
            self.microbatches = self.microbatches[:0]
        keep = self.limit
        self.steps = np.r_[self.steps, np.asarray(steps[-n:], dtype=np.int64)][-keep:]
        self.compute = np.vstack([self.compute, compute])[-keep:]
        self.partitions = np.vstack([self.partitions, parts])[-keep:]
        self.microbatches = np.r_[self.microbatches,
                                  np.asarray(microbatches[-n:], dtype=np.int64)][-keep:]

    def add_samples(self, fwd: np.ndarray, tot: np.ndarray) -> None:
        """Per-layer cost samples ``(P, L)`` (NaN = none); a layer keeps its first
        ``cost_samples`` samples."""
        for r in range(fwd.shape[0]):
            for i in np.flatnonzero(np.isfinite(tot[r]) & np.isfinite(fwd[r])):
                if len(self._tot[i]) < self.cost_samples and tot[r, i] > 0:
                    self._fwd[i].append(float(fwd[r, i]))
                    self._tot[i].append(float(tot[r, i]))
                    self._costs = None

    def costs(self) -> np.ndarray:
        """``(L, 3)`` F, B, W cost per layer per micro-batch: each layer's median forward
        sample, times one backward/forward ratio shared by all layers (the median over every
        sample: a single sample's ratio comes from one micro-batch's ops and is noisy).
        Layers without samples take the median of the others; uniform when there are none.
        Computed again only after a new sample."""
        if self._costs is None:
            self._costs = self._compute_costs()
        return self._costs.copy()

    def _compute_costs(self) -> np.ndarray:
        f = np.array([np.median(s) if s else np.nan for s in self._fwd])
        ratios = [t / x for fs, ts in zip(self._fwd, self._tot, strict=True)
                  for x, t in zip(fs, ts, strict=True) if x > 0]
        if not self.measured or not np.isfinite(f).any() or not ratios:
            f, ratio = np.full(self.layers, 1.0 / 3.0), 3.0
        else:
            f[np.isnan(f)] = np.nanmedian(f)
            ratio = max(float(np.median(ratios)), 1.0)
        back = f * (ratio - 1.0)
        if self.split_backward:
            return np.stack([f, back / 2, back / 2], axis=1)
        return np.stack([f, back, np.zeros_like(f)], axis=1)

    def held(self, costs: np.ndarray) -> np.ndarray:
        """``(T, P)`` layer cost held per rank per step under ``costs``."""
        return held_cost(self.partitions, costs.sum(axis=1), self.stages)

    @property
    def costs_frozen(self) -> bool:
        """Whether every layer has its ``cost_samples`` samples (its cost no longer moves)."""
        return all(len(s) >= self.cost_samples for s in self._tot)

    def fixed(self, costs: np.ndarray) -> float:
        """Each rank's per-micro-batch cost beyond its layers' (module docstring); 0 with
        uniform costs or no steps yet. Frozen once the costs are."""
        if self._fixed is not None:
            return self._fixed
        if not self.measured or len(self) == 0 or not any(self._tot):
            return 0.0
        per_mb = self.compute[-64:] / self.microbatches[-64:, None]
        resid = np.median(per_mb - self.held(costs)[-64:], axis=0)
        value = float(max(0.0, np.min(resid)))
        if self.costs_frozen and len(self) >= 10:
            self._fixed = value
        return value

    def speeds(self, costs: np.ndarray) -> np.ndarray:
        """``(T, P)`` speed per rank per step (see the module docstring)."""
        work = (self.held(costs) + self.fixed(costs)) * self.microbatches[:, None]
        return self.compute / np.maximum(work, 1e-300)
