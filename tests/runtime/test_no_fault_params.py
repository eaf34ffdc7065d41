"""No fault parameters reach the controller or a policy (issue 23, Deliver 2).

A real controller sees telemetry and device metrics, never the emulated fault that made them.
Two checks:

- the objects: each policy's :class:`ControllerConfig`, the :class:`Decider` built from it
  (after it has observed telemetry with a thermal fault on, so its lead and history are
  filled) and the policy objects, walked recursively through dataclass fields, attributes and
  containers, hold no :class:`~bubblecast.runtime.inject.Injection` (nor anything else from the
  emulator's module) and no attribute named after a fault's shape (``factor``, ``start``,
  ``ramp``, ``end``, ``extra``, ``length``, ``lead``, ``thermal``);
- the code: no module under ``bubblecast/runtime/control`` or ``bubblecast/policy`` imports
  the emulator (``bubblecast.runtime.inject``, or its names through ``bubblecast.runtime``),
  parsed with :mod:`ast`.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bubblecast.runtime import inject
from bubblecast.runtime.control.control_config import ControllerConfig
from bubblecast.runtime.control.decide import Decider
from bubblecast.runtime.control.lead import ThermalLead
from bubblecast.runtime.control.observe import pack
from bubblecast.runtime.inject import Injection, parse_inject
from bubblecast.runtime.plan import check_plan
from bubblecast.runtime.sampler import MetricLog

ROOT = Path(__file__).resolve().parents[2]
#: Injection fields that describe a fault's shape (``rank``/``replica``/``every`` name where
#: and how often, words the controller uses for its own meanings: a rank, its decision period).
FAULT_FIELDS = {"factor", "start", "ramp", "end", "extra", "length", "lead", "thermal"}
assert FAULT_FIELDS - {"thermal"} <= {f.name for f in dataclasses.fields(Injection)}
#: (class, attribute) pairs whose name is a fault word with the controller's own meaning.
OWN_MEANING = {("Decider", "lead"),  # the ThermalLead: a predictor fed by device metrics
               ("RawHistoryForecaster", "lead"),  # the same object, read by the forecaster
               ("ThermalLead", "_factor")}  # the slowdown it predicts from temperatures
EMULATOR_NAMES = set(vars(inject)) - {n for n in vars(inject) if n.startswith("__")}
#: The fault the decider's telemetry comes from: its float constants are distinctive, so an
#: exact copy anywhere in the controller can only have come from the fault.
FAULT = "rank=1,factor=2.3719,start=50,ramp=10,lead=30"


def _children(obj: Any) -> list[tuple[str, Any]]:
    """(attribute name, value) pairs of ``obj`` the walk descends into."""
    if isinstance(obj, dict):
        return [(str(k), v) for k, v in obj.items()] + [("<key>", k) for k in obj]
    if isinstance(obj, list | tuple | set | frozenset):
        return [("<item>", v) for v in obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [(f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj)]
    if type(obj).__module__.startswith("bubblecast") and hasattr(obj, "__dict__"):
        return list(vars(obj).items())
    return []


def fault_parameters(root: Any, path: str = "root", values: tuple[float, ...] = ()
                     ) -> list[str]:
    """Paths under ``root`` that hold an emulator object, a fault-shaped attribute or one of
    the float ``values`` (exactly; in arrays too)."""
    found: list[str] = []
    seen: set[int] = set()
    stack = [(path, root)]
    while stack:
        where, obj = stack.pop()
        if isinstance(obj, float | np.ndarray) and values:
            if np.isin(np.asarray(obj, dtype=np.float64), values).any():
                found.append(f"{where}: a fault constant")
            continue
        if id(obj) in seen or isinstance(obj, str | bytes | int | float | bool | np.ndarray):
            continue
        seen.add(id(obj))
        if isinstance(obj, Injection) or type(obj).__module__ == inject.__name__:
            found.append(f"{where}: {type(obj).__name__}")
            continue
        for name, value in _children(obj):
            if name.lstrip("_") in FAULT_FIELDS and \
                    (type(obj).__name__, name) not in OWN_MEANING:
                found.append(f"{where}.{name}")
            stack.append((f"{where}.{name}", value))
    return found


def test_the_walk_finds_a_fault_when_one_is_there() -> None:
    """The checker itself: an Injection or a fault-shaped field anywhere is reported."""
    inj = parse_inject("rank=1,factor=2,start=100,ramp=60,lead=30")[0]
    assert fault_parameters({"a": [inj]}) == ["root.a.<item>: Injection"]

    @dataclasses.dataclass
    class Leaky:
        tau: float
        ramp: int

    assert fault_parameters([Leaky(tau=1.0, ramp=60)]) == ["root.<item>.ramp"]
    tau = parse_inject(FAULT)[0].thermal[1]  # type: ignore[index]
    assert fault_parameters({"x": [1, tau]}, values=(tau,)) == [
        "root.x.<item>: a fault constant"]
    assert fault_parameters(np.array([1.0, tau]), values=(tau,)) != []
    assert not hasattr(ThermalLead, "for_injections")


def _observed_decider(config: ControllerConfig) -> Decider:
    """A decider that has observed 60 steps of a 2-rank run whose rank 1 heats up (the
    emulated device's temperatures and slowdown threshold, as the loop gathers them)."""
    every, layers = config.every, 8
    plan = check_plan("1f1b", 2, 4, layers)
    decider = Decider(config, plan, np.full(layers, 1e3))
    samples = [{"layer": i, "forward_s": 0.1, "total_s": 0.3} for i in range(layers)]
    log = MetricLog("r", 1, "cpu", injections=parse_inject(FAULT))
    for b in range(6):
        steps = list(range(b * every, (b + 1) * every))
        for s in steps:
            log.begin_step(s)
        temps = log.asof("temperature_c", steps)
        rows = np.stack([pack([1.0] * every, every, samples, layers),
                         pack([1.0] * every, every, samples, layers, temps,
                              log.latest("temperature_slowdown_c"))])
        decider.observe(rows, [(s, plan.partition, 4) for s in steps])
        decider.decide(plan, steps[-1], None)
    return decider


@pytest.mark.parametrize("policy", ["static", "reactive", "predictive"])
def test_controller_and_policy_hold_no_fault_parameters(policy: str) -> None:
    config = ControllerConfig(policy=policy, every=10,
                              policy_params={"min_history": 20} if policy == "predictive"
                              else {})
    decider = _observed_decider(config)
    if policy == "predictive":  # the lead saw the heating and predicts: the walk covers it
        assert decider.lead is not None and len(decider.lead.steps) == 60
        assert set(decider.lead.active) == {1}
    fault = parse_inject(FAULT)[0]
    t_ss, tau = fault.thermal  # type: ignore[misc]
    values = (fault.factor, t_ss, tau)
    assert fault_parameters(config, "config", values) == []
    assert fault_parameters(decider, "decider", values) == []
    assert fault_parameters(decider.policy, "policy", values) == []


def _emulator_imports(source: str, rel: Path) -> list[str]:
    """The emulator imports in ``source``, a module at ``rel`` (from the repository root)."""
    bad = []
    for node in ast.walk(ast.parse(source, filename=str(rel))):
        if isinstance(node, ast.Import):
            bad += [a.name for a in node.names if a.name.startswith(inject.__name__)]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative: resolve against the module's package
                pkg = rel.with_suffix("").parts[:-node.level]
                module = ".".join((*pkg, module) if module else pkg)
            if module.startswith(inject.__name__):
                bad.append(module)
            elif module == "bubblecast.runtime":
                bad += [f"{module}.{a.name}" for a in node.names
                        if a.name == "inject" or a.name in EMULATOR_NAMES]
    return bad


def test_no_controller_or_policy_module_imports_the_emulator() -> None:
    files = sorted((ROOT / "bubblecast/runtime/control").glob("*.py")) + \
        sorted((ROOT / "bubblecast/policy").rglob("*.py"))
    assert len(files) > 10
    found = {str(rel): bad for f in files
             if (bad := _emulator_imports(f.read_text(), rel := f.relative_to(ROOT)))}
    assert found == {}


@pytest.mark.parametrize("source", ["import bubblecast.runtime.inject",
                                    "from bubblecast.runtime.inject import T_AMB",
                                    "from bubblecast.runtime import parse_inject",
                                    "from .. import inject",
                                    "from ..inject import T_THROTTLE"])
def test_the_import_check_catches_each_form(source: str) -> None:
    assert _emulator_imports(source, Path("bubblecast/runtime/control/lead.py")) != []
    assert _emulator_imports("from bubblecast.runtime.sampler import MetricLog",
                             Path("bubblecast/runtime/control/lead.py")) == []
