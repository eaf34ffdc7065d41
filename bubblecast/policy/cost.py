"""Migration cost of a repartition: bytes that change owner over link bandwidth, plus a pause.

A layer whose owning stage changes ships its parameters and its optimizer state (Adam keeps
``exp_avg`` and ``exp_avg_sq``, often an fp32 master copy too). The time paid once, as a pause
in the step after the repartition, is ``bytes / bandwidth + fixed_pause`` (the fixed part covers
the barrier, the two-phase acknowledgement and rebuilding the schedule). Every data-parallel
replica moves its own copy over its own links, so replicas add no time.

The constants default to modest values and are meant to be replaced by what the runtime
measures: :meth:`MigrationConstants.from_json` takes a JSON object (or file) holding either the
constants themselves or a list of measured migrations ``{"seconds": s, "bytes": b}`` (under
``migrations``, ``rows`` as in ``benchmarks/results/migration.json``, or ``actions`` as the
runtime's run metadata), to which it fits ``seconds = fixed_pause + bytes / bandwidth`` by
least squares; :func:`run_constants` does the same from a run's own metadata.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bubblecast.errors import BubblecastError

if TYPE_CHECKING:
    from bubblecast.sim.shape import PipelineShape

#: Keys under which a JSON object lists measured migrations: ``migrations``, the ``rows`` of
#: ``benchmarks/results/migration.json``, or the runtime's ``actions`` (RunMeta.extra).
_RECORD_KEYS = ("migrations", "rows", "actions")
_SECONDS_KEYS = ("seconds", "migration_s", "duration_s", "elapsed_s")
_BYTES_KEYS = ("bytes", "migration_bytes", "bytes_moved", "moved_bytes")


@dataclass(frozen=True)
class MigrationConstants:
    """Constants of the migration-cost model.

    ``bandwidth_Bps``: bytes per second a layer moves at; ``fixed_pause_s``: seconds every
    repartition costs whatever it moves; ``optimizer_factor``: optimizer-state bytes per
    parameter byte (Adam with bf16 weights and fp32 master + two moments: 12 / 2 = 6);
    ``parallel_links``: if true, moves between different stage pairs overlap, so the time
    follows the busiest stage's bytes in or out instead of the total.
    """

    bandwidth_Bps: float = 10e9
    fixed_pause_s: float = 0.05
    optimizer_factor: float = 6.0
    parallel_links: bool = False

    def __post_init__(self) -> None:
        if not (math.isfinite(self.bandwidth_Bps) and self.bandwidth_Bps > 0):
            raise BubblecastError(f"bandwidth_Bps: must be > 0, got {self.bandwidth_Bps}")
        if not (math.isfinite(self.fixed_pause_s) and self.fixed_pause_s >= 0):
            raise BubblecastError(f"fixed_pause_s: must be >= 0, got {self.fixed_pause_s}")
        if not (math.isfinite(self.optimizer_factor) and self.optimizer_factor >= 0):
            raise BubblecastError(f"optimizer_factor: must be >= 0, got {self.optimizer_factor}")

    @classmethod
    def from_json(cls, source: dict[str, Any] | str | Path,
                  base: MigrationConstants | None = None) -> MigrationConstants:
        """Constants from a JSON object or file: explicit values override ``base`` (default
        constants); a ``migrations`` list of measured ``{seconds, bytes}`` is fitted."""
        name = "migration constants"
        if not isinstance(source, dict):
            path = Path(source)
            name = str(path)
            try:
                source = json.loads(path.read_text())
            except FileNotFoundError:
                raise BubblecastError(f"{path}: no such file") from None
            except json.JSONDecodeError as exc:
                raise BubblecastError(f"{path}: not valid JSON ({exc.msg})") from None
        if not isinstance(source, dict):
            raise BubblecastError(f"{name}: expected a JSON object")
        out = base or cls()
        key = next((k for k in _RECORD_KEYS if k in source), None)
        if key is not None:
            bw, pause = fit_measurements(measured_migrations(source[key]), f"{name}: {key}")
            out = replace(out, bandwidth_Bps=bw, fixed_pause_s=pause)
        known = {k: source[k] for k in asdict(out) if k in source}
        try:
            return replace(out, **known)
        except TypeError as exc:
            raise BubblecastError(f"{name}: {exc}") from None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def measured_migrations(records: Any) -> list[dict[str, Any]]:
    """The records of successful migrations that moved bytes (failed or empty ones and
    non-migration actions say nothing about bandwidth); others are returned unchanged."""
    if not isinstance(records, list):
        return records
    out = []
    for r in records:
        if not isinstance(r, dict) or r.get("ok") is False:
            continue
        moved = next((r[k] for k in _BYTES_KEYS if k in r), None)
        if isinstance(moved, (int, float)) and moved <= 0:
            continue
        out.append(r)
    return out


def run_constants(extra: dict[str, Any], base: MigrationConstants) -> MigrationConstants | None:
    """Constants fitted to the migrations a run's metadata records (the runtime's
    ``actions``), or None when it records none that moved bytes."""
    records = measured_migrations(extra.get("actions"))
    if not isinstance(records, list) or not records:
        return None
    try:
        bw, pause = fit_measurements(records, "run metadata: actions")
    except BubblecastError:
        return None
    return replace(base, bandwidth_Bps=bw, fixed_pause_s=pause)


def _pick(record: dict[str, Any], keys: tuple[str, ...], what: str, where: str) -> float:
    for k in keys:
        if k in record:
            try:
                value = float(record[k])
            except (TypeError, ValueError):
                break
            if math.isfinite(value) and value >= 0:
                return value
            break
    raise BubblecastError(f"{where}: each migration needs a non-negative '{keys[0]}' ({what})")


def fit_measurements(records: list[dict[str, Any]], where: str = "migrations"
                     ) -> tuple[float, float]:
    """``(bandwidth_Bps, fixed_pause_s)`` fitted to measured migrations by least squares on
    ``seconds = pause + bytes / bandwidth`` (pause clipped at 0; one record: pause 0)."""
    if not isinstance(records, list) or not records:
        raise BubblecastError(f"{where}: need a non-empty list of measured migrations")
    secs = np.array([_pick(r, _SECONDS_KEYS, "seconds", where) for r in records])
    nbytes = np.array([_pick(r, _BYTES_KEYS, "bytes", where) for r in records])
    if nbytes.max() <= 0:
        raise BubblecastError(f"{where}: no migration moved any bytes; bandwidth unknown")
    pause = 0.0
    if len(records) >= 2 and np.ptp(nbytes) > 0:
        slope, pause = np.polyfit(nbytes, secs, 1)
        if pause < 0 or slope <= 0:
            pause = 0.0
    slope = float(np.sum((secs - pause) * nbytes) / np.sum(nbytes**2))
    if slope <= 0:
        raise BubblecastError(f"{where}: measured seconds do not grow with bytes")
    return 1.0 / slope, float(pause)


@dataclass(frozen=True)
class MigrationCost:
    """Migration cost of moving from one partition to another.

    ``param_bytes[l]`` is layer ``l``'s parameter bytes (one replica). Partitions list layers
    per virtual stage; what ships is a layer whose *rank* changes. ``placement[v]`` is the rank
    of virtual stage ``v`` (:meth:`for_shape` takes it from the schedule: ``v % P`` looped,
    ``v`` then ``2P - 1 - v`` V-shape); without it, ``ranks`` set means looped (``v % ranks``)
    and neither means one virtual stage per rank. A layer moving between two chunks of one rank
    costs nothing.
    """

    param_bytes: np.ndarray
    constants: MigrationConstants = MigrationConstants()
    ranks: int | None = None
    placement: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.ranks is not None and self.ranks < 1:
            raise BubblecastError(f"ranks: must be >= 1, got {self.ranks}")
        pb = np.asarray(self.param_bytes, dtype=np.float64).ravel()
        if pb.size == 0 or np.any(pb < 0) or not np.all(np.isfinite(pb)):
            raise BubblecastError("param_bytes: need finite, non-negative bytes per layer")
        object.__setattr__(self, "param_bytes", pb)
        if self.placement is not None:
            place = tuple(int(r) for r in self.placement)
            if not place or min(place) < 0:
                raise BubblecastError(f"placement {list(place)}: need a rank >= 0 per "
                                      f"virtual stage")
            object.__setattr__(self, "placement", place)

    @classmethod
    def for_shape(cls, param_bytes: np.ndarray, constants: MigrationConstants,
                  shape: PipelineShape) -> MigrationCost:
        """The cost for a pipeline ``shape`` (a :class:`~bubblecast.sim.shape.PipelineShape`):
        its schedule's placement when it has several chunks per rank."""
        return cls(param_bytes, constants).placed(shape)

    def placed(self, shape: PipelineShape) -> MigrationCost:
        """This cost with the placement of ``shape``'s schedule (unchanged with one chunk)."""
        if int(shape.chunks) <= 1:
            return self
        return replace(self, placement=schedule_placement(shape.schedule, shape.stages,
                                                           shape.chunks))

    @property
    def layer_bytes(self) -> np.ndarray:
        """Bytes each layer ships when it moves: parameters plus optimizer state."""
        return self.param_bytes * (1.0 + self.constants.optimizer_factor)

    def layer_ranks(self, partition: Sequence[int],
                    placement: Sequence[int] | None = None) -> np.ndarray:
        """Rank holding each layer under ``partition`` (layers per virtual stage), placed by
        ``placement`` (default this cost's)."""
        part = [int(x) for x in partition]
        if sum(part) != self.param_bytes.size or any(x < 1 for x in part):
            raise BubblecastError(f"partition {part}: must hold {self.param_bytes.size} layers, "
                                  ">= 1 per stage")
        owner = np.repeat(np.arange(len(part)), part)
        place = self.placement if placement is None else tuple(int(r) for r in placement)
        if place is not None:
            if len(place) != len(part):
                raise BubblecastError(f"partition {part}: {len(part)} virtual stages, the "
                                      f"placement has {len(place)}")
            return np.asarray(place, dtype=np.int64)[owner]
        return owner % self.ranks if self.ranks else owner


    def bytes_moved(self, old: Sequence[int], new: Sequence[int],
                    old_placement: Sequence[int] | None = None,
                    new_placement: Sequence[int] | None = None) -> float:
        """Bytes of every layer whose rank differs between ``old`` and ``new``."""
        moved = self.layer_ranks(old, old_placement) != self.layer_ranks(new, new_placement)
        return float(self.layer_bytes[moved].sum())

    def seconds(self, old: Sequence[int], new: Sequence[int],
                old_placement: Sequence[int] | None = None,
                new_placement: Sequence[int] | None = None) -> float:
        """Pause paid by the repartition ``old -> new`` (a schedule switch when the
        placements differ); 0 when neither the partition nor the placement changes."""
        a = self.layer_ranks(old, old_placement)
        b = self.layer_ranks(new, new_placement)
        same_place = (tuple(old_placement) if old_placement is not None else None) == \
            (tuple(new_placement) if new_placement is not None else None)
        if [int(x) for x in old] == [int(x) for x in new] and same_place:
            return 0.0
        moved = a != b
        lb = self.layer_bytes
        if not moved.any():
            volume = 0.0
        elif self.constants.parallel_links:
            stages = max(a.max(), b.max()) + 1
            out = np.bincount(a[moved], lb[moved], minlength=stages)
            inn = np.bincount(b[moved], lb[moved], minlength=stages)
            volume = float(np.max(np.maximum(out, inn)))
        else:
            volume = float(lb[moved].sum())
        return volume / self.constants.bandwidth_Bps + self.constants.fixed_pause_s

    def matrix(self, partitions: Sequence[Sequence[int]]) -> np.ndarray:
        """``(K, K)`` seconds of every move between ``partitions`` (0 on the diagonal)."""
        return np.array([[self.seconds(a, b) if i != j else 0.0
                          for j, b in enumerate(partitions)] for i, a in enumerate(partitions)])


def schedule_placement(schedule: str, stages: int, chunks: int) -> tuple[int, ...]:
    """Rank of each virtual stage of ``schedule`` (``stages * chunks`` entries)."""
    from bubblecast.sim.schedules import vstage_ranks

    return tuple(int(r) for r in vstage_ranks(schedule, int(stages), int(chunks)))
