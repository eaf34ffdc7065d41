"""bubblecast: forecast and remove pipeline bubbles in pipeline-parallel training.

The public Python API, imported from here::

    from bubblecast import BubbleAnalysis, BubbleForecast, Policy, evaluate_policies

``BubbleAnalysis`` answers ``inspect``/``whatif`` for one run, ``BubbleForecast`` builds the
dataset, fits, forecasts, evaluates and saves forecasters, ``Policy``/``evaluate_policies``
replay runs under policies (``policy-eval``); the core types (``Events``, ``read_events``,
``load_events``, ``SimConfig``, ``simulate_events``, ``Window``, ...) come with them.

The package is a one-way pipeline of layers (telemetry < sim < dataset < forecast < policy <
runtime | serve < cli). Importing ``bubblecast`` is cheap: every public name below is resolved
on first use (module ``__getattr__``, PEP 562), so numpy, pandas, torch, mlflow and lightgbm
load only when a name that needs them is touched.
"""

from __future__ import annotations

import importlib
from typing import Any

from bubblecast._version import __version__
from bubblecast.errors import BubblecastError

#: Public name -> "module:attribute" it is loaded from on first access. (No TYPE_CHECKING
#: imports of them here: import-linter counts those, and every module that imports
#: ``bubblecast`` for ``__version__`` would then appear to import every layer.)
_EXPORTS: dict[str, str] = {
    # analysis of one run (inspect, whatif, replay, plots)
    "BubbleAnalysis": "bubblecast.policy.work_whatif:BubbleAnalysis",
    # forecasting (dataset, fit, predict, evaluate, model directories)
    "BubbleForecast": "bubblecast.forecast.facade:BubbleForecast",
    "DatasetConfig": "bubblecast.dataset.config:DatasetConfig",
    "Window": "bubblecast.dataset.window:Window",
    # telemetry: the events table and its files
    "Events": "bubblecast.telemetry.events:Events",
    "RunMeta": "bubblecast.telemetry.schema:RunMeta",
    "read_events": "bubblecast.telemetry.io:read_events",
    "write_events": "bubblecast.telemetry.io:write_events",
    "load_events": "bubblecast.telemetry.importers:load_events",
    # policies, evaluated offline (policy-eval)
    "Policy": "bubblecast.policy.api:Policy",
    "evaluate_policies": "bubblecast.policy.api:evaluate_policies",
    # simulation
    "SimConfig": "bubblecast.sim.simulator:SimConfig",
    "simulate_events": "bubblecast.sim.simulator:simulate_events",
    # telemetry of your own torch.distributed.pipelining training loop
    "record": "bubblecast.runtime.record:record",
    # per-step work planning of packed documents, for any data loader
    "plan_batch": "bubblecast.policy.plan_api:plan_batch",
    "WorkCost": "bubblecast.sim.documents:WorkCost",
    "PlanConfig": "bubblecast.policy.work_plan:PlanConfig",
    "WorkPlan": "bubblecast.policy.work_plan:WorkPlan",
    "BalancedBatchSampler": "bubblecast.runtime.balanced_sampler:BalancedBatchSampler",
}

__all__ = [
    "BalancedBatchSampler", "BubbleAnalysis", "BubbleForecast", "BubblecastError",
    "DatasetConfig", "Events", "PlanConfig", "Policy", "RunMeta", "SimConfig", "Window",
    "WorkCost", "WorkPlan", "__version__", "evaluate_policies", "load_events", "plan_batch",
    "read_events", "record", "simulate_events", "write_events",
]  # fmt: skip


def __getattr__(name: str) -> Any:
    """Load a public name on first access and cache it in the module namespace."""
    target = _EXPORTS.get(name)
    if target is None:
        raise AttributeError(f"module 'bubblecast' has no attribute '{name}'")
    module, attr = target.split(":")
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public names (loaded or not) and the module's dunders."""
    return sorted(set(__all__) | {k for k in globals() if k.startswith("__")})
