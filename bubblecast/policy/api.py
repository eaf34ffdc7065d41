"""Public policy API: ``Policy`` objects and ``evaluate_policies`` (what ``policy-eval`` does).

    from bubblecast import Policy, evaluate_policies

    result = evaluate_policies(["data/sim/throttle.parquet"],
                               policies=[Policy.static(), Policy.predictive(horizon=64)])
    result.table            # one row per policy: step_s, bubble_fraction, speedup_vs_static, ...
    result.to_json()        # the object ``bubblecast policy-eval --json`` prints

A :class:`Policy` is a name plus keyword parameters, validated when made (as scikit-learn
estimators keep theirs: :meth:`Policy.get_params`); the evaluation builds the policy objects of
:mod:`bubblecast.policy.policies` from it for every run, or on packed-document runs those of
:mod:`bubblecast.policy.work_policies` (``static``, ``tokens``, ``balance``, ``oracle``)::

    result = evaluate_policies(["data/documents/lognormal.parquet"],
                               policies=["static", "tokens", Policy.balance(), "oracle"])
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bubblecast.errors import BubblecastError
from bubblecast.policy.policies import POLICIES
from bubblecast.policy.work_policies import WORK_ONLY, make_work_policy
from bubblecast.telemetry.events import Events

if TYPE_CHECKING:
    import pandas as pd

    from bubblecast.policy.policy_evaluation import PolicyTrace

DEFAULT_POLICIES = ("static", "reactive", "predictive", "oracle")


@dataclass(frozen=True)
class Policy:
    """A policy to evaluate: its registered ``name`` and keyword ``params``.

    Make one with :meth:`static`, :meth:`reactive`, :meth:`predictive`, :meth:`oracle`
    (their parameters are those of :mod:`bubblecast.policy.policies`' classes), :meth:`tokens`
    or :meth:`balance` (work planners, :mod:`bubblecast.policy.work_policies`); a bad name or
    parameter raises :class:`~bubblecast.errors.BubblecastError` at once.
    """

    name: str
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.name not in POLICIES and self.name not in WORK_ONLY:
            raise BubblecastError(f"policy: unknown policy '{self.name}' "
                                  f"(known: {', '.join([*POLICIES, *WORK_ONLY])})")
        object.__setattr__(self, "params", dict(self.params))
        self.build()  # validates the parameters

    @classmethod
    def static(cls) -> Policy:
        """Never repartitions (the baseline every other policy is compared with)."""
        return cls("static")

    @classmethod
    def reactive(cls, window: int = 10, threshold: float = 0.05, min_gain: float = 0.02,
                 cooldown: int | None = None) -> Policy:
        """Rebalances on the imbalance observed over the last ``window`` steps (DynMo-style)."""
        return cls("reactive", {"window": window, "threshold": threshold,
                                "min_gain": min_gain, "cooldown": cooldown})

    @classmethod
    def predictive(cls, horizon: int = 256, risk: float = 0.3, margin: float = 0.5,
                   min_gain: float = 0.01, hold: int = 5, min_history: int = 8) -> Policy:
        """Moves when the forecast saving over ``horizon`` steps pays back the migration."""
        return cls("predictive", {"horizon": horizon, "risk": risk, "margin": margin,
                                  "min_gain": min_gain, "hold": hold,
                                  "min_history": min_history})

    @classmethod
    def oracle(cls, windows: Sequence[int] = (8, 32, 128, 512),
               max_candidates: int = 48) -> Policy:
        """Knows the realised future: the upper bound the others are measured by."""
        return cls("oracle", {"windows": tuple(windows), "max_candidates": max_candidates})

    @classmethod
    def tokens(cls) -> Policy:
        """Packed documents: balance token counts per micro-batch (the hand-written
        heuristic)."""
        return cls("tokens")

    @classmethod
    def balance(cls, refit_every: int = 25, min_fit_steps: int = 2,
                fit_window: int = 256, use_speeds: bool = True) -> Policy:
        """Packed documents: plan packing, order and micro-batches per replica from a cost
        model (``evaluate_policies(cost_model=...)``, else fitted online to the run's own
        earlier steps every ``refit_every`` steps, on at most ``fit_window``) and forecast
        replica speeds (``use_speeds=False``: every replica planned at the same pace)."""
        return cls("balance", {"refit_every": refit_every, "min_fit_steps": min_fit_steps,
                               "fit_window": fit_window, "use_speeds": use_speeds})

    def get_params(self) -> dict[str, Any]:
        """The keyword parameters (a copy)."""
        return dict(self.params)

    def build(self) -> Any:
        """A fresh :mod:`bubblecast.policy.policies` object with these parameters."""
        if self.name in WORK_ONLY:
            return make_work_policy(self.name, **self.params)
        try:
            return POLICIES[self.name](**self.params)
        except TypeError as exc:
            raise BubblecastError(f"policy '{self.name}': {exc}") from None


@dataclass
class PolicyEvaluation:
    """What :func:`evaluate_policies` returns: the report, its table and the per-step traces."""

    report: dict[str, Any]
    names: list[str]
    traces: dict[str, dict[str, PolicyTrace]] = field(repr=False)

    @property
    def table(self) -> pd.DataFrame:
        """One row per policy (index ``policy``) of the aggregate over runs."""
        import pandas as pd

        rows = [{"policy": n, **self.report["policies"][n]} for n in self.names]
        return pd.DataFrame(rows).set_index("policy")

    def to_json(self) -> dict[str, Any]:
        """The object ``bubblecast policy-eval --json`` prints for the same inputs."""
        return self.report

    def plot(self, path: str | os.PathLike[str]) -> Path:
        """Step time over steps per policy and run, actions marked (as ``--plot``)."""
        from bubblecast.policy.policy_evaluation import plot_traces

        return plot_traces(self.traces, path)


def load_runs(runs: Events | str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
              format: str = "auto", command: str = "policy-eval") -> Events:
    """Events of one or more files or directories (any ``format``), each run read once."""
    from bubblecast.telemetry.importers import load_events, require_per_op

    if isinstance(runs, Events):
        require_per_op(runs, command, "events")
        return runs
    paths = [runs] if isinstance(runs, (str, os.PathLike)) else list(runs)
    if not paths:
        raise BubblecastError(f"{command}: give at least one events file")
    parts: list[Events] = []
    seen: set[str] = set()
    for path in paths:
        ev = load_events(path, format)
        require_per_op(ev, command, path)
        clash = seen & set(ev.run_ids)
        if clash:
            raise BubblecastError(f"{path}: run id '{sorted(clash)[0]}' already read from an "
                                  "earlier file; give each run once")
        seen |= set(ev.run_ids)
        parts.append(ev)
    return parts[0] if len(parts) == 1 else Events.concat(parts)


def _policies(policies: Iterable[Policy | str]) -> tuple[list[str], dict[str, dict[str, Any]]]:
    names: list[str] = []
    params: dict[str, dict[str, Any]] = {}
    for p in policies:
        spec = Policy(p) if isinstance(p, str) else p
        if not isinstance(spec, Policy):
            raise BubblecastError(f"policies: expected a Policy or a name, got {p!r}")
        if spec.name in names:
            raise BubblecastError(f"policies: '{spec.name}' given twice")
        names.append(spec.name)
        if spec.params:
            params[spec.name] = spec.get_params()
    return names, params


def evaluate_policies(runs: Events | str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
                      policies: Iterable[Policy | str] = DEFAULT_POLICIES,
                      forecaster: Any | None = None, *, migration: Any | None = None,
                      param_bytes: float = 0.0, memory_cap: float | None = None,
                      layers_per_stage: int = 8, format: str = "auto",
                      run_ids: Sequence[str] | None = None,
                      cost_model: Any | None = None, metrics: pd.DataFrame | None = None,
                      fallback: str | None = None) -> PolicyEvaluation:
    """Replay ``runs`` step by step under each policy (``bubblecast policy-eval``).

    ``forecaster``: the predictive policy's model (a model directory, a ``models:/`` URI or a
    fitted forecaster; None = the built-in trend extrapolation); ``migration``: migration
    constants or measured migrations (a JSON path, a dict or
    :class:`~bubblecast.policy.cost.MigrationConstants`; None = fitted to what each run
    records, else built-in constants); ``cost_model``: the balance policy's learned cost model
    (a model directory, a ``models:/`` URI or a loaded one; None = fitted online to each run);
    ``forecaster`` also gives balance its replica speeds; ``metrics``: the runs' device
    metrics, for a forecaster trained with covariates (default: the ``.metrics`` files beside
    ``runs`` when they are paths); ``fallback``: ``"trend"`` forecasts the runs the model
    cannot with the built-in trend forecaster (the result's ``fallback`` says which and why),
    None refuses them in one line naming the missing input; the rest as the command's options.
    """
    from bubblecast.policy.cost import MigrationConstants
    from bubblecast.policy.policy_evaluation import EvalConfig, evaluate_events
    from bubblecast.telemetry.importers import timing_of

    names, params = _policies(policies)
    if not isinstance(runs, (Events, str, os.PathLike)):
        runs = list(runs)  # read twice: events, then device metrics
    events = load_runs(runs, format)
    missing = [r for r in run_ids or () if r not in events.run_ids]
    if missing:
        raise BubblecastError(f"--run: no run '{missing[0]}' (runs: "
                              f"{', '.join(sorted(events.run_ids)[:10])})")
    if migration is None or isinstance(migration, MigrationConstants):
        constants = migration or MigrationConstants()
    else:
        constants = MigrationConstants.from_json(migration)
    config = EvalConfig(migration=constants, param_bytes=param_bytes,
                        layers_per_stage=layers_per_stage, memory_cap=memory_cap,
                        migration_from_runs=migration is None, policy_params=params,
                        cost_model=os.fspath(cost_model) if isinstance(cost_model, os.PathLike)
                        else cost_model, fallback=fallback)
    model = forecaster
    uses = {"predictive", "balance"} & set(names)
    if isinstance(forecaster, (str, os.PathLike)) and uses:
        from bubblecast.forecast.modeldir import load_model

        model = load_model(forecaster)
    elif not uses:
        model = None
    if model is not None and metrics is None and not isinstance(runs, Events):
        import pandas as pd

        from bubblecast.telemetry.metrics import read_metrics

        paths = [runs] if isinstance(runs, (str, os.PathLike)) else runs
        metrics = pd.concat([read_metrics(p) for p in paths], ignore_index=True)
    result, traces = evaluate_events(events, names, config, model,
                                     run_ids=list(run_ids) if run_ids else None,
                                     metrics=metrics)
    return PolicyEvaluation({**result, "timing": timing_of(events)}, names, traces)
