"""Scenarios for ``simulate --scenario``: what makes a run's op times drift from nominal.

Each scenario is a frozen dataclass of documented parameters plus a ``seed``; ``draw(shape)``
returns a :class:`ScenarioDraw` with the ground truth the simulator applies and saves:

- ``speed`` ``(steps, ranks)``: each rank's slowdown factor at each step (1 = nominal, 1.3 =
  30% slower; ranks numbered ``replica * stages + stage``); every op of that rank and step
  takes ``speed`` times its nominal time. Saved per row as the ``speed`` column.
- ``noise_sigma``: log-normal per-op noise, mean 1 (``exp(N(-s^2/2, s^2))``).
- ``tokens`` / ``work`` ``(steps, replicas, microbatches)``: tokens per microbatch and the
  compute multiplier they cause (``seqlen``), saved as the ``tokens`` column.
- ``last_stage_extra``: a static extra cost on the model's last layer, as a fraction of a
  stage's mean compute (``imbalance``); saved inside the run's workload.
- ``info``: the realised random choices (slow rank, onset step, factor...), JSON-able.
- ``metrics``: device metrics by name, each ``(steps, ranks)``, written beside the events as
  the ``device_metrics`` side table (:mod:`bubblecast.sim.thermal`): ``temperature_c``,
  ``sm_clock_mhz`` and ``power_w`` (``thermal``), the known-future ``tokens`` (``seqlen``:
  mean tokens per micro-batch of the rank's replica at that step).

Registered names (:data:`SCENARIOS`): none, jitter, throttle, thermal, failslow, periodic,
seqlen, imbalance, slow-replica, mixed (document runs refuse seqlen; mixed ``exclude``-s it).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import numpy as np

from bubblecast.errors import BubblecastError
from bubblecast.sim.thermal import ThermalModel, fault_resistance, thermal_trace
from bubblecast.sim.workload import work_factor


@dataclass(frozen=True)
class RunShape:
    steps: int
    stages: int
    replicas: int = 1
    microbatches: int = 1

    @property
    def ranks(self) -> int:
        return self.stages * self.replicas


@dataclass
class ScenarioDraw:
    """Ground truth of one run (see the module doc)."""

    speed: np.ndarray
    noise_sigma: float = 0.0
    tokens: np.ndarray | None = None
    work: np.ndarray | None = None
    last_stage_extra: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, np.ndarray] = field(default_factory=dict)


def _check_range(name: str, low: float, high: float, minimum: float = 0.0) -> None:
    if not (minimum <= low <= high):
        raise BubblecastError(f"scenario {name}: need {minimum} <= low <= high, got {low}, {high}")


@dataclass(frozen=True)
class Scenario:
    """Base: no slowdown, no noise."""

    name: ClassVar[str] = "none"
    seed: int = 0

    def params(self) -> dict[str, Any]:
        return {"name": self.name, **asdict(self)}

    def rng(self) -> np.random.Generator:
        return np.random.default_rng(self.seed)

    def draw(self, shape: RunShape) -> ScenarioDraw:
        return ScenarioDraw(np.ones((shape.steps, shape.ranks)))


@dataclass(frozen=True)
class NoScenario(Scenario):
    """``none``: every op takes exactly its nominal time."""


@dataclass(frozen=True)
class Jitter(Scenario):
    """``jitter``: independent log-normal noise on every op, ``sigma`` its log-scale spread."""

    name: ClassVar[str] = "jitter"
    sigma: float = 0.05

    def __post_init__(self) -> None:
        if not 0 <= self.sigma <= 2:
            raise BubblecastError(f"scenario jitter: sigma must be in [0, 2], got {self.sigma}")

    def draw(self, shape: RunShape) -> ScenarioDraw:
        return ScenarioDraw(np.ones((shape.steps, shape.ranks)), noise_sigma=self.sigma)


def _smoothstep(x: np.ndarray) -> np.ndarray:
    x = np.clip(x, 0.0, 1.0)
    return x * x * (3 - 2 * x)


@dataclass(frozen=True)
class Throttle(Scenario):
    """``throttle``: one rank (``rank``, or random) slows down smoothly, as thermal throttling
    does: from an onset step drawn in the first half of the run, its slowdown climbs over
    ``ramp_min..ramp_max`` steps to a level drawn in ``slow_min..slow_max`` (0.1 = 10%) and
    stays; ``noise_sigma`` adds per-op jitter."""

    name: ClassVar[str] = "throttle"
    slow_min: float = 0.10
    slow_max: float = 0.40
    ramp_min: int = 200
    ramp_max: int = 800
    rank: int | None = None
    noise_sigma: float = 0.01

    def __post_init__(self) -> None:
        _check_range("throttle slow", self.slow_min, self.slow_max)
        _check_range("throttle ramp", self.ramp_min, self.ramp_max, 1)

    def draw(self, shape: RunShape) -> ScenarioDraw:
        rng = self.rng()
        rank = _pick(rng, self.rank, shape.ranks)
        onset = int(rng.integers(0, max(1, shape.steps // 2)))
        ramp = int(rng.integers(self.ramp_min, self.ramp_max + 1))
        level = float(rng.uniform(self.slow_min, self.slow_max))
        speed = np.ones((shape.steps, shape.ranks))
        steps = np.arange(shape.steps)
        speed[:, rank] = 1.0 + level * _smoothstep((steps - onset) / ramp)
        return ScenarioDraw(speed, self.noise_sigma,
                            info={"rank": rank, "onset": onset, "ramp": ramp, "level": level})


@dataclass(frozen=True)
class Thermal(Throttle):
    """``thermal``: throttling with a physical leading signal. Same draws as ``throttle``
    (rank, onset, ramp, level), but the slowdown comes from an RC thermal model
    (:mod:`bubblecast.sim.thermal`): at the onset the rank's cooling degrades over ``ramp``
    steps (thermal resistance up to the value whose equilibrium clock is ``1 / (1 + level)``
    of the maximum), its temperature climbs with time constant ``tau_steps``, and past
    ``t_throttle`` its clock steps down; the speed factor follows the clock. Every rank's
    temperature, SM clock and power are device metrics."""

    name: ClassVar[str] = "thermal"
    ramp_min: int = 1
    ramp_max: int = 50
    tau_steps: float = 60.0
    t_throttle: float = 85.0

    def draw(self, shape: RunShape) -> ScenarioDraw:
        info = super().draw(shape).info
        model = ThermalModel(tau_steps=self.tau_steps, t_throttle=self.t_throttle)
        r_fault = model.r_for_slowdown(info["level"])
        healthy = thermal_trace(model, shape.steps, np.full(shape.steps, model.r_nominal))
        faulty = thermal_trace(model, shape.steps, fault_resistance(
            model, shape.steps, info["onset"], info["ramp"], r_fault))
        on_rank = np.arange(shape.ranks)[None, :] == info["rank"]
        metrics = {name: np.where(on_rank, faulty[name][:, None], healthy[name][:, None])
                   for name in ("temperature_c", "sm_clock_mhz", "power_w")}
        speed = np.ones((shape.steps, shape.ranks))
        speed[:, info["rank"]] = faulty["speed"]
        throttled = np.flatnonzero(faulty["speed"] > 1.0)
        info = {**info, "r_fault": r_fault,
                "first_throttled": int(throttled[0]) if len(throttled) else None}
        return ScenarioDraw(speed, self.noise_sigma, info=info, metrics=metrics)


@dataclass(frozen=True)
class FailSlow(Scenario):
    """``failslow``: at a random step one rank becomes ``factor_min..factor_max`` times slower
    over ``ramp`` steps (1-5), stays so for a log-uniform ``duration_min..duration_max`` steps,
    then recovers over the same ramp."""

    name: ClassVar[str] = "failslow"
    factor_min: float = 1.5
    factor_max: float = 3.0
    duration_min: int = 10
    duration_max: int = 2000
    rank: int | None = None
    noise_sigma: float = 0.01

    def __post_init__(self) -> None:
        _check_range("failslow factor", self.factor_min, self.factor_max, 1.0)
        _check_range("failslow duration", self.duration_min, self.duration_max, 1)

    def draw(self, shape: RunShape) -> ScenarioDraw:
        rng = self.rng()
        rank = _pick(rng, self.rank, shape.ranks)
        onset = int(rng.integers(0, max(1, shape.steps)))
        duration = int(round(np.exp(rng.uniform(np.log(self.duration_min),
                                                np.log(self.duration_max)))))
        factor = float(rng.uniform(self.factor_min, self.factor_max))
        ramp = int(rng.integers(1, 6))
        steps = np.arange(shape.steps, dtype=np.float64)
        up = np.clip((steps - onset + 1) / ramp, 0, 1)
        down = np.clip((onset + duration + ramp - steps) / ramp, 0, 1)
        speed = np.ones((shape.steps, shape.ranks))
        speed[:, rank] = 1.0 + (factor - 1.0) * np.minimum(up, down)
        return ScenarioDraw(speed, self.noise_sigma, info={
            "rank": rank, "onset": onset, "duration": duration, "factor": factor, "ramp": ramp})


@dataclass(frozen=True)
class Periodic(Scenario):
    """``periodic``: every ``period`` steps (random phase) a spike lasting ``length`` steps
    slows ``n_ranks`` ranks (random ones; ``0`` = all, as a checkpoint does) by a factor drawn
    per spike in ``spike_min..spike_max`` (garbage collection, checkpoints)."""

    name: ClassVar[str] = "periodic"
    period: int = 50
    length: int = 1
    spike_min: float = 1.3
    spike_max: float = 2.0
    n_ranks: int = 1
    noise_sigma: float = 0.01

    def __post_init__(self) -> None:
        if self.period < 1 or not 1 <= self.length <= self.period:
            raise BubblecastError(f"scenario periodic: need period >= length >= 1, got "
                                  f"period={self.period}, length={self.length}")
        _check_range("periodic spike", self.spike_min, self.spike_max, 1.0)
        if self.n_ranks < 0:
            raise BubblecastError(f"scenario periodic: n_ranks must be >= 0, got {self.n_ranks}")

    def draw(self, shape: RunShape) -> ScenarioDraw:
        rng = self.rng()
        count = shape.ranks if self.n_ranks == 0 else min(self.n_ranks, shape.ranks)
        ranks = np.sort(rng.choice(shape.ranks, size=count, replace=False))
        phase = int(rng.integers(0, self.period))
        steps = np.arange(shape.steps)
        spiking = ((steps - phase) % self.period) < self.length
        spike_id = (steps - phase) // self.period
        factors = rng.uniform(self.spike_min, self.spike_max, size=spike_id.max() + 2)
        speed = np.ones((shape.steps, shape.ranks))
        level = np.where(spiking, factors[spike_id + 1], 1.0)
        speed[:, ranks] = level[:, None]
        return ScenarioDraw(speed, self.noise_sigma,
                            info={"ranks": ranks.tolist(), "phase": phase})


@dataclass(frozen=True)
class SeqLen(Scenario):
    """``seqlen``: tokens per microbatch vary (log-normal, mean ``mean_tokens``, spread
    ``sigma``, clipped to ``min_tokens..max_tokens``); compute grows with tokens, linearly plus
    ``quadratic_share`` of quadratic (attention) cost, 1 at ``mean_tokens``."""

    name: ClassVar[str] = "seqlen"
    mean_tokens: int = 2048
    sigma: float = 0.4
    min_tokens: int = 128
    max_tokens: int = 8192
    quadratic_share: float = 0.2
    noise_sigma: float = 0.01

    def __post_init__(self) -> None:
        _check_range("seqlen tokens", self.min_tokens, self.max_tokens, 1)
        if not 0 <= self.quadratic_share <= 1:
            raise BubblecastError("scenario seqlen: quadratic_share must be in [0, 1]")

    def draw(self, shape: RunShape) -> ScenarioDraw:
        rng = self.rng()
        size = (shape.steps, shape.replicas, shape.microbatches)
        raw = rng.lognormal(np.log(self.mean_tokens) - self.sigma ** 2 / 2, self.sigma, size)
        tokens = np.clip(np.rint(raw), self.min_tokens, self.max_tokens).astype(np.int64)
        work = work_factor(tokens, self.mean_tokens, self.quadratic_share)
        per_rank = np.repeat(tokens.mean(axis=2), shape.stages, axis=1)  # rank = r * S + s
        return ScenarioDraw(np.ones((shape.steps, shape.ranks)), self.noise_sigma, tokens, work,
                            info={"mean_tokens": self.mean_tokens,
                                  "quadratic_share": self.quadratic_share},
                            metrics={"tokens": per_rank})


@dataclass(frozen=True)
class Imbalance(Scenario):
    """``imbalance``: the model's last layer (an output head) costs an extra
    ``extra_min..extra_max`` of a stage's mean compute, so the last stage is that much heavier
    under an even split; static over the run."""

    name: ClassVar[str] = "imbalance"
    extra_min: float = 0.2
    extra_max: float = 0.6
    noise_sigma: float = 0.01

    def __post_init__(self) -> None:
        _check_range("imbalance extra", self.extra_min, self.extra_max)

    def draw(self, shape: RunShape) -> ScenarioDraw:
        extra = float(self.rng().uniform(self.extra_min, self.extra_max))
        return ScenarioDraw(np.ones((shape.steps, shape.ranks)), self.noise_sigma,
                            last_stage_extra=extra, info={"extra": extra})


@dataclass(frozen=True)
class SlowReplica(Scenario):
    """``slow-replica``: every rank of one data-parallel replica (``replica``, or random)
    becomes ``factor_min..factor_max`` times slower from an onset step on, drawn at a fraction
    ``onset_min..onset_max`` of the last step (rounded: 0 = the first step, 1 = the last).
    Needs >= 2 replicas."""

    name: ClassVar[str] = "slow-replica"
    factor_min: float = 1.5
    factor_max: float = 1.5
    onset_min: float = 0.25
    onset_max: float = 0.5
    replica: int | None = None
    noise_sigma: float = 0.01

    def __post_init__(self) -> None:
        _check_range("slow-replica factor", self.factor_min, self.factor_max, 1.0)
        if not 0 <= self.onset_min <= self.onset_max <= 1:  # fractions of the last step
            raise BubblecastError("scenario slow-replica: need 0 <= onset_min <= onset_max <= 1")

    def draw(self, shape: RunShape) -> ScenarioDraw:
        if shape.replicas < 2:
            raise BubblecastError(f"--scenario slow-replica: needs --replicas >= 2, got "
                                  f"{shape.replicas}")
        rng = self.rng()
        replica = _pick(rng, self.replica, shape.replicas, "replica")
        onset = int(np.rint(rng.uniform(self.onset_min, self.onset_max) * (shape.steps - 1)))
        factor = float(rng.uniform(self.factor_min, self.factor_max))
        speed = np.ones((shape.steps, shape.ranks))
        ranks = list(range(replica * shape.stages, (replica + 1) * shape.stages))
        speed[onset:, ranks] = factor
        return ScenarioDraw(speed, self.noise_sigma, info={
            "replica": replica, "ranks": ranks, "onset": onset, "factor": factor})


@dataclass(frozen=True)
class Mixed(Scenario):
    """``mixed``: ``k_min..k_max`` of the other scenarios (default parameters, own seeds),
    chosen at random per seed, none of those named in ``exclude`` (document runs exclude
    ``seqlen``); speeds multiply, noise adds in quadrature."""

    name: ClassVar[str] = "mixed"
    k_min: int = 1
    k_max: int = 3
    exclude: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_range("mixed k", self.k_min, self.k_max, 1)
        if self.k_max > (left := sum(c.name not in self.exclude for c in _COMPONENTS)):
            raise BubblecastError(f"scenario mixed: k_max must be <= {left}")

    def components(self) -> list[Scenario]:
        rng = self.rng()
        k = int(rng.integers(self.k_min, self.k_max + 1))
        allowed = np.flatnonzero([c.name not in self.exclude for c in _COMPONENTS])
        names = sorted(allowed[rng.choice(len(allowed), size=k, replace=False)].tolist())
        seeds = np.random.SeedSequence(self.seed).generate_state(len(_COMPONENTS))
        return [_COMPONENTS[i](seed=int(seeds[i])) for i in names]

    def draw(self, shape: RunShape) -> ScenarioDraw:
        out = ScenarioDraw(np.ones((shape.steps, shape.ranks)), info={"components": []})
        variance = 0.0
        for sc in self.components():
            d = sc.draw(shape)
            out.speed = out.speed * d.speed
            variance += d.noise_sigma ** 2
            if d.tokens is not None:
                out.tokens, out.work = d.tokens, d.work
            out.metrics.update(d.metrics)
            out.last_stage_extra += d.last_stage_extra
            out.info["components"].append({**sc.params(), **d.info})
            out.info.update({k: d.info[k] for k in ("mean_tokens", "quadratic_share")
                             if k in d.info})
        out.noise_sigma = float(np.sqrt(variance))
        return out


def _pick(rng: np.random.Generator, value: int | None, count: int, what: str = "rank") -> int:
    if value is None:
        return int(rng.integers(0, count))
    if not 0 <= value < count:
        raise BubblecastError(f"scenario: {what} {value} out of range (0..{count - 1})")
    return value


_COMPONENTS: tuple[type[Scenario], ...] = (Jitter, Throttle, FailSlow, Periodic, SeqLen, Imbalance)
SCENARIOS: dict[str, type[Scenario]] = {
    c.name: c for c in (NoScenario, Jitter, Throttle, Thermal, FailSlow, Periodic, SeqLen,
                        Imbalance, SlowReplica, Mixed)
}


def make_scenario(name: str, seed: int = 0, **params: Any) -> Scenario:
    """The scenario registered as ``name`` with ``seed`` and optional parameter overrides."""
    cls = SCENARIOS.get(name)
    if cls is None:
        raise BubblecastError(f"--scenario: unknown scenario '{name}' "
                              f"(known: {', '.join(SCENARIOS)})")
    try:
        return cls(seed=int(seed), **params)
    except TypeError as exc:
        raise BubblecastError(f"--scenario {name}: {exc}") from None
