"""Configuration of the closed-loop controller; no torch, so the CLI validates it up front."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from bubblecast.errors import BubblecastError
from bubblecast.policy.cost import MigrationConstants
from bubblecast.runtime.control.learned_lead import DEFAULT_RISE

POLICY_NAMES = ("static", "reactive", "predictive")
#: Where rank 0 decides (``ControllerConfig.decide_in``).
DECIDE_IN = ("process", "thread")
#: Runtime schedules the policies' pipeline model (bubblecast.sim) can time.
CONTROLLABLE = ("gpipe", "1f1b", "interleaved", "zb-h1")


@dataclass(frozen=True)
class ControllerConfig:
    """How the controller decides.

    ``every``: steps between decisions; ``model``: a model directory or ``models:/`` URI
    served in process; ``service``: URL of a running ``bubblecast serve`` asked instead;
    ``forecaster``: a ``module:factory`` import path (custom forecasters, tests); none of
    them: the built-in trend forecaster. ``timeout_s``: deadline of a decision (its forecast
    or service call included), counted from when it starts. ``history``: steps kept on rank
    0. ``layer_costs``: ``measured`` (median of each layer's first ``cost_samples`` forward
    samples) or ``uniform``. ``policy_params``: keyword
    arguments of the policy (the predictive one starts from the live hysteresis defaults of
    :mod:`.observe`). ``smooth``: steps of the causal running median the policies'
    speed history goes through (1: raw steps). ``bandwidth_Bps``, ``pause_s``,
    ``optimizer_factor``: the migration-cost constants until the run has measured its own
    migrations (defaults: CPU, gloo, Adam; ``benchmarks/results/migration.json``).
    ``thermal_lead``: the predictive policy's built-in forecaster takes in the ranks' temperatures
    (device metric ``temperature_c``), a leading signal of thermal throttling
    (:mod:`.lead`); no effect where no rank reports a temperature. ``lead_rise``: the rise of
    a covariate model's forecast that announces a slowdown not yet seen (the learned lead,
    :mod:`.learned_lead`; calibrate it with :func:`.learned_lead.calibrate_rise`).
    ``decide_in``: where rank 0 decides while a step trains: ``process``, a worker process
    at the lowest CPU priority (:mod:`.decision_process`), or ``thread``, a thread of the
    training process (:mod:`.decision_thread`), which shares its interpreter lock; the static
    policy, which computes nothing, always decides on the thread.
    """

    policy: str = "static"
    every: int = 10
    model: str | None = None
    service: str | None = None
    forecaster: str | None = None
    timeout_s: float = 0.5
    history: int = 512
    layer_costs: str = "measured"
    cost_samples: int = 8
    smooth: int = 5
    policy_params: dict[str, Any] = field(default_factory=dict)
    bandwidth_Bps: float = 5e8
    pause_s: float = 0.02
    optimizer_factor: float = 2.0
    thermal_lead: bool = True
    lead_rise: float = DEFAULT_RISE
    decide_in: str = "process"

    def __post_init__(self) -> None:
        if self.policy not in POLICY_NAMES:
            raise BubblecastError(f"--policy: choose from {', '.join(POLICY_NAMES)}, "
                                  f"got '{self.policy}'")
        if not isinstance(self.every, int) or isinstance(self.every, bool) or self.every < 1:
            raise BubblecastError(f"--every: must be a positive integer, got {self.every!r}")
        sources = [n for n in ("model", "service", "forecaster") if getattr(self, n)]
        if len(sources) > 1:
            raise BubblecastError(f"--{sources[1]}: give one of --model, --service, not both")
        if sources and self.policy != "predictive":
            raise BubblecastError(f"--{sources[0]}: only the predictive policy uses a "
                                  f"forecaster (--policy is '{self.policy}')")
        if self.service is not None and not self.service.startswith(("http://", "https://")):
            raise BubblecastError(f"--service: expected an http(s):// URL, got '{self.service}'")
        if not (np.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise BubblecastError(f"--forecast-timeout: must be > 0 seconds, got {self.timeout_s}")
        if not (isinstance(self.lead_rise, (int, float)) and np.isfinite(self.lead_rise)
                and self.lead_rise > 0):
            raise BubblecastError(f"--lead-rise: must be > 0, got {self.lead_rise!r}")
        if self.decide_in not in DECIDE_IN:
            raise BubblecastError(f"--decide-in: choose from {', '.join(DECIDE_IN)}, got "
                                  f"'{self.decide_in}'")
        if not isinstance(self.history, int) or self.history < 16:
            raise BubblecastError(f"history: must be an integer >= 16, got {self.history!r}")
        if self.layer_costs not in ("measured", "uniform"):
            raise BubblecastError(f"layer_costs: 'measured' or 'uniform', got "
                                  f"'{self.layer_costs}'")
        if not isinstance(self.cost_samples, int) or self.cost_samples < 1:
            raise BubblecastError(f"cost_samples: must be >= 1, got {self.cost_samples!r}")
        if not isinstance(self.smooth, int) or isinstance(self.smooth, bool) or self.smooth < 1:
            raise BubblecastError(f"smooth: must be an integer >= 1, got {self.smooth!r}")
        self.constants  # noqa: B018 - validates the migration constants
        try:
            make_policy(self)
        except TypeError as exc:
            raise BubblecastError(f"policy_params: {exc}") from None

    @property
    def constants(self) -> MigrationConstants:
        return MigrationConstants(bandwidth_Bps=self.bandwidth_Bps, fixed_pause_s=self.pause_s,
                                  optimizer_factor=self.optimizer_factor)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> ControllerConfig:
        return cls(**obj)


def make_policy(config: ControllerConfig, forecaster: Any = None) -> Any:
    """The policy object ``config`` names (the predictive one with ``forecaster``)."""
    from bubblecast.policy.policies import PredictivePolicy, ReactivePolicy, StaticPolicy
    from bubblecast.runtime.control.observe import predictive_params

    params = dict(config.policy_params)
    if config.policy == "static":
        return StaticPolicy()
    if config.policy == "reactive":
        return ReactivePolicy(**params)
    params = predictive_params(params, config.every)
    if forecaster is not None:
        params["forecaster"] = forecaster
    return PredictivePolicy(**params)


def check_controllable(schedule: str, stages: int, microbatches: int, chunks: int,
                       config: ControllerConfig) -> None:
    """Refuse (one line) a plan the policy cannot model, before anything starts."""
    if config.policy == "static":
        return
    if schedule not in CONTROLLABLE:
        raise BubblecastError(f"--schedule: the {config.policy} policy models "
                              f"{', '.join(CONTROLLABLE)}, not '{schedule}'")
    from bubblecast.sim.steptime import timing_shape

    timing_shape(schedule, stages, microbatches, chunks)
