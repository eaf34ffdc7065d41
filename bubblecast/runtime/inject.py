"""Slowdown emulation: make one rank's compute ops slower, for machines without real stragglers.

Grammar (``--inject``): specs separated by ``;``, each a comma-separated ``key=value`` list.

- Slowdown: ``rank=1,factor=2.0,start=100,ramp=50,end=400``: from step ``start`` (default 0)
  until step ``end`` (exclusive, default never) every compute op of ``rank`` takes ``factor``
  times its own measured time, the extra ramping in linearly over ``ramp`` steps (default 0).
- Thermal lead: add ``lead=L`` to a slowdown (``rank=1,factor=2,start=100,ramp=20,lead=30``):
  the emulated device heats up before it slows down, as the RC model of
  :mod:`bubblecast.sim.thermal` says a device whose cooling degrades does (power taken
  proportional to the clock, ambient ``T_AMB`` = 35 C, throttle threshold ``T_THROTTLE`` =
  85 C, healthy ``T_HEALTHY`` = 75 C; the device starts the job at ambient and warms up to
  its healthy level with time constant ``WARM_STEPS``). The fault's uncontrolled steady
  state is
  ``T_ss = T_AMB + factor (T_THROTTLE - T_AMB)`` (holding the threshold then takes a clock
  ``factor`` times lower: the slowdown); from step ``start - L`` the temperature climbs
  ``T_ss - (T_ss - T_HEALTHY) exp(-(step - start + L) / tau)``, the time constant ``tau``
  chosen so that it reaches the threshold exactly at ``start``, where the slowdown begins;
  while throttled it holds the threshold, and from ``end`` it cools back to ``T_HEALTHY``
  with the same ``tau``. The recorder writes it as the ``temperature_c`` device metric of
  that rank at every step, and the emulated device's slowdown threshold (``T_THROTTLE``, the
  device's specification, as NVML reports a GPU's) as ``temperature_slowdown_c``.
- Spike: ``rank=0,every=50,extra=0.2[,length=1][,start=0][,end=N]``: on ``length`` steps out
  of every ``every`` (from ``start``), each compute op of ``rank`` takes ``1 + extra`` times
  its measured time.
- A whole replica: ``replica=R`` instead of ``rank=`` (``replica=1,factor=1.5,start=20``)
  applies the slowdown or spike to every rank of data-parallel replica ``R`` (a thermal fault
  or fail-slow of one pipeline copy); :func:`expand_replicas` turns it into one injection per
  rank once the stage count is known (ranks ``R*stages .. R*stages+stages-1``).

The extra time is part of the op's recorded duration; runs carry the spec in
``RunMeta.extra["emulated_slowdown"]``. Where it goes depends on the recorder's clock: on the
host clock it is slept after the op (so the other ranks' cores are not stolen; what a sleep
overshoots, waking late, is taken off the next op's sleep); on CUDA (device timing) it is
queued on the stage's stream as a spin kernel calibrated to the device's clock
(:class:`bubblecast.runtime.device_timing.DeviceDelay`), so the GPU, not the host, is slowed,
and the host keeps launching ahead as it would.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from bubblecast.errors import BubblecastError

_SLOW_KEYS = {"rank", "replica", "factor", "start", "ramp", "end", "lead"}
_SPIKE_KEYS = {"rank", "replica", "every", "extra", "length", "start", "end"}
_INT_KEYS = {"rank", "replica", "start", "ramp", "end", "every", "length", "lead"}
#: Emulated device temperatures (deg C): healthy, throttle threshold, degraded steady state.
T_AMB, T_HEALTHY, T_THROTTLE = 35.0, 75.0, 85.0
#: Time constant (steps) of the emulated device's warm-up from ambient at the job's start.
WARM_STEPS = 4.0


@dataclass(frozen=True)
class Injection:
    """One slowdown or spike on one rank (see the module docstring)."""

    rank: int
    factor: float = 1.0
    start: int = 0
    ramp: int = 0
    end: int | None = None
    every: int | None = None
    extra: float = 0.0
    length: int = 1
    lead: int = 0
    replica: int | None = None

    @property
    def kind(self) -> str:
        return "spike" if self.every is not None else "slowdown"

    def multiplier(self, step: int) -> float:
        """Factor by which this injection stretches a compute op of ``step`` on its rank."""
        if step < self.start or (self.end is not None and step >= self.end):
            return 1.0
        if self.every is not None:
            return 1.0 + self.extra if (step - self.start) % self.every < self.length else 1.0
        frac = 1.0 if self.ramp == 0 else min(1.0, (step - self.start + 1) / self.ramp)
        return 1.0 + (self.factor - 1.0) * frac

    @property
    def thermal(self) -> tuple[float, float] | None:
        """``(T_ss, tau)`` of the emulated fault (module doc); None without a lead."""
        if not self.lead or self.every is not None or self.factor <= 1.0:
            return None
        t_ss = T_AMB + self.factor * (T_THROTTLE - T_AMB)
        return t_ss, self.lead / math.log((t_ss - T_HEALTHY) / (t_ss - T_THROTTLE))

    def temperature(self, step: int) -> float | None:
        """The emulated device's temperature at ``step`` (module doc); None without a lead."""
        model = self.thermal
        if model is None:
            return None
        t_ss, tau = model
        if self.end is not None and step >= self.end:
            heat = T_HEALTHY + (T_THROTTLE - T_HEALTHY) * math.exp(-(step - self.end) / tau)
        elif step >= self.start:
            heat = T_THROTTLE
        elif step >= self.start - self.lead:
            heat = t_ss - (t_ss - T_HEALTHY) * math.exp(-(step - self.start + self.lead) / tau)
        else:
            heat = T_HEALTHY - (T_HEALTHY - T_AMB) * math.exp(-max(0, step) / WARM_STEPS)
        return float(round(heat, 1))

    def to_json(self) -> dict[str, Any]:
        keys = _SPIKE_KEYS if self.every is not None else _SLOW_KEYS - (
            set() if self.lead else {"lead"})
        keys = keys - ({"replica"} if self.replica is None else set())
        return {"kind": self.kind, **{k: v for k, v in asdict(self).items() if k in keys}}


def _number(key: str, raw: str, spec: str) -> int | float:
    try:
        return int(raw) if key in _INT_KEYS else float(raw)
    except ValueError:
        kind = "an integer" if key in _INT_KEYS else "a number"
        raise BubblecastError(
            f"--inject: '{key}' must be {kind}, got '{raw}' in '{spec}'") from None


def _parse_one(spec: str) -> Injection:
    fields: dict[str, Any] = {}
    for item in spec.split(","):
        item = item.strip()
        if "=" not in item:
            raise BubblecastError(f"--inject: expected key=value, got '{item}' in '{spec}'")
        key, raw = (s.strip() for s in item.split("=", 1))
        if key not in _SLOW_KEYS | _SPIKE_KEYS:
            raise BubblecastError(f"--inject: unknown key '{key}' in '{spec}' (keys: rank, "
                                  "replica, factor, start, ramp, end, lead, every, extra, "
                                  "length)")
        if key in fields:
            raise BubblecastError(f"--inject: '{key}' given twice in '{spec}'")
        fields[key] = _number(key, raw, spec)
    if "rank" not in fields and "replica" not in fields:
        raise BubblecastError(f"--inject: 'rank' is required in '{spec}' (or 'replica' for "
                              "every rank of a replica)")
    if "rank" in fields and "replica" in fields:
        raise BubblecastError(f"--inject: 'rank' and 'replica' cannot both be given in "
                              f"'{spec}'")
    fields.setdefault("rank", -1)  # a replica's: every rank of it, see expand_replicas
    spike = "every" in fields or "extra" in fields
    allowed = _SPIKE_KEYS if spike else _SLOW_KEYS
    stray = sorted(set(fields) - allowed)
    if stray:
        raise BubblecastError(f"--inject: '{stray[0]}' cannot be combined with "
                              f"{'every/extra' if spike else 'factor'} in '{spec}'")
    need = ("every", "extra") if spike else ("factor",)
    for key in need:
        if key not in fields:
            raise BubblecastError(f"--inject: '{key}' is required in '{spec}'")
    checks = [("start", 0), ("ramp", 0), ("every", 1), ("length", 1), ("lead", 0),
              ("replica", 0)] + ([("rank", 0)] if fields.get("replica") is None else [])
    for key, low in checks:
        if key in fields and fields[key] < low:
            raise BubblecastError(f"--inject: '{key}' must be >= {low}, got {fields[key]}")
    if "factor" in fields and not 1.0 <= fields["factor"] <= 1000.0:
        raise BubblecastError(f"--inject: 'factor' must be in [1, 1000] (sleep cannot speed "
                              f"an op up), got {fields['factor']}")
    if "extra" in fields and not 0.0 < fields["extra"] <= 1000.0:
        raise BubblecastError(f"--inject: 'extra' must be in (0, 1000], got {fields['extra']}")
    if "end" in fields and fields["end"] <= fields.get("start", 0):
        raise BubblecastError(f"--inject: 'end' ({fields['end']}) must be after 'start' "
                              f"({fields.get('start', 0)})")
    return Injection(**fields)


def parse_inject(text: str | None) -> list[Injection]:
    """Parse an ``--inject`` string (specs separated by ``;``); raise one line if malformed."""
    if text is None or not text.strip():
        return []
    return [_parse_one(spec.strip()) for spec in text.split(";") if spec.strip()]


def expand_replicas(injections: list[Injection], stages: int) -> list[Injection]:
    """Each whole-replica injection (``replica=R``) as one per rank of that replica (ranks
    ``R*stages .. R*stages+stages-1``, ``replica`` kept); the others as they are."""
    out: list[Injection] = []
    for inj in injections:
        if inj.replica is None:
            out.append(inj)
        else:
            out += [replace(inj, rank=inj.replica * stages + s) for s in range(stages)]
    return out


def multiplier(injections: list[Injection], rank: int, step: int) -> float:
    """Combined stretch of a compute op on ``rank`` at ``step`` (1.0 when none applies)."""
    total = 1.0
    for inj in injections:
        if inj.rank == rank:
            total += inj.multiplier(step) - 1.0
    return total


def temperatures(injections: list[Injection], rank: int, step: int) -> float | None:
    """The emulated temperature of ``rank`` at ``step`` (the hottest lead), None if none."""
    temps = [t for i in injections if i.rank == rank
             for t in (i.temperature(step),) if t is not None]
    return max(temps) if temps else None
