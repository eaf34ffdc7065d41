"""Megatron-LM and DeepSpeed training logs as coarse events (formats ``megatron-log`` and
``deepspeed-log``, granularity ``step``).

Representation: one row per (step, rank, timer) with ``microbatch`` -1, ``start_s`` 0 and
``duration_s`` the timer's per-step time in seconds; the source timer name is in ``name``.
Megatron values are already per iteration; DeepSpeed sums its timers over the logging interval,
so they are divided by the steps since the previous logged step. ``rank`` is the rank the log
names; when the log gives an aggregate across ranks (Megatron ``minmax`` and ``max``, or the
older one-line form) there is one row per step and timer on a placeholder rank 0 whose
``duration_s`` is the maximum (``min_s`` holds the minimum for ``minmax``), and the metadata
says so (``values``). Stage and replica come from the log's layout lines (Megatron's
``pipeline-model-parallel size`` / ``data-parallel size``, DeepSpeed's ``ProcessCoord``) when
present; otherwise every row sits on stage 0 and ``stages_known`` is false. The metadata carries
``granularity: step``, ``timing: host`` (these are host timers) and ``step_time_s`` per step
when the log prints it. Per-op order is not in a log: commands that replay refuse it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from bubblecast.errors import BubblecastError
from bubblecast.telemetry.events import Events
from bubblecast.telemetry.importers.fixes import InputFixes
from bubblecast.telemetry.importers.logs_parse import ParsedLog, detect_flavour, parse_log
from bubblecast.telemetry.schema import RunMeta
from bubblecast.telemetry.validate import validate_frame

#: Timer -> SPEC op, in priority order per op: when a step and rank have two timers of one
#: compute op (DeepSpeed's ``forward_microstep`` and ``forward``), the first keeps the op and
#: the other becomes OTHER.
TIMER_TO_OP: dict[str, str] = {
    "forward-compute": "F", "backward-compute": "B",
    "forward-recv": "RECV_F", "forward-send": "SEND_F",
    "backward-recv": "RECV_B", "backward-send": "SEND_B",
    "optimizer": "OPTIMIZER",
    "grads-reduce-scatter": "ALLREDUCE", "params-all-gather": "ALLREDUCE",
    "grads-all-reduce": "ALLREDUCE", "embedding-grads-all-reduce": "ALLREDUCE",
    "forward_microstep": "F", "forward": "F",
    "backward_microstep": "B", "backward": "B",
    "pipe_send_output": "SEND_F", "pipe_recv_input": "RECV_F",
    "pipe_send_grad": "SEND_B", "pipe_recv_grad": "RECV_B",
    "step_microstep": "OPTIMIZER", "step": "OPTIMIZER",
    "backward_allreduce_microstep": "ALLREDUCE", "backward_allreduce": "ALLREDUCE",
}  # fmt: skip
#: Timers whose value is the whole step (a fallback step time when the log prints none).
STEP_TIMERS = ("forward-backward", "train_batch")
_FORMAT_FLAVOUR = {"megatron-log": "megatron", "deepspeed-log": "deepspeed"}


def detect_log(path: str | Path) -> str | None:
    """``megatron-log`` or ``deepspeed-log`` when ``path`` is a log with timer lines."""
    return detect_flavour(Path(path))


def _values_kind(parsed: ParsedLog) -> str:
    kinds = parsed.kinds
    if len(kinds) > 1:
        return "mixed: " + ", ".join(sorted(kinds))
    return {"minmax": "min and max across ranks", "max": "max across ranks",
            "all": "per rank", "per-rank": "per rank",
            "single-line": "one rank (unnamed)"}[next(iter(kinds))]


def _placement(parsed: ParsedLog, ranks: np.ndarray, per_rank: bool) -> tuple[
        np.ndarray, np.ndarray, int | None, int | None]:
    """(stage, replica) per row and the (stages, replicas) the log states (None: unknown)."""
    zeros = np.zeros(len(ranks), dtype=np.int32)
    if not per_rank:
        return zeros, zeros, parsed.sizes.get("pp"), parsed.sizes.get("dp")
    if parsed.coords:
        missing = sorted(set(ranks.tolist()) - set(parsed.coords))
        if not missing:
            stage = np.array([parsed.coords[r][0] for r in ranks], dtype=np.int32)
            replica = np.array([parsed.coords[r][1] for r in ranks], dtype=np.int32)
            return (stage, replica, max(c[0] for c in parsed.coords.values()) + 1,
                    max(c[1] for c in parsed.coords.values()) + 1)
    sizes = parsed.sizes
    if "pp" in sizes and "dp" in sizes:
        tp = sizes.get("tp", 1)
        return ((ranks // (sizes["dp"] * tp)).astype(np.int32),
                ((ranks // tp) % sizes["dp"]).astype(np.int32), sizes["pp"], sizes["dp"])
    return zeros, zeros, None, None


def _ops(frame: pd.DataFrame) -> np.ndarray:
    """SPEC op per row; a second timer of one compute op in a (step, rank) becomes OTHER."""
    op = frame["name"].map(TIMER_TO_OP).fillna("OTHER").to_numpy(dtype=object)
    priority = frame["name"].map({t: i for i, t in enumerate(TIMER_TO_OP)}).fillna(1e9)
    order = np.lexsort((priority.to_numpy(), frame["rank"].to_numpy(), frame["step"].to_numpy()))
    seen: set[tuple[int, int, str]] = set()
    for i in order:
        if op[i] in ("F", "B", "W"):
            key = (int(frame["step"].iat[i]), int(frame["rank"].iat[i]), str(op[i]))
            if key in seen:
                op[i] = "OTHER"
            seen.add(key)
    return op


def _interval_steps(steps: np.ndarray) -> dict[int, int]:
    """Steps covered by each logged step: the gap since the previous one (the first: itself)."""
    uniq = np.unique(steps)
    gaps = np.diff(np.concatenate([[0], uniq]))
    return {int(s): max(int(g), 1) for s, g in zip(uniq, gaps, strict=True)}


def read_log(path: str | Path, fmt: str) -> Events:
    """Read a ``megatron-log`` or ``deepspeed-log`` file as step-granularity events."""
    path = Path(path)
    if fmt not in _FORMAT_FLAVOUR:
        raise BubblecastError(f"{path}: unknown log format '{fmt}'")
    parsed = parse_log(path, _FORMAT_FLAVOUR[fmt])
    values = parsed.values
    per_rank = all(v.rank is not None for v in values)
    fixes = InputFixes(str(path))

    def where(i: int) -> str:
        return f"line {values[i].line}: timer '{values[i].timer}'"

    raw = pd.DataFrame({
        "step": np.array([v.step for v in values], dtype=np.int64),
        "rank": np.array([v.rank or 0 for v in values], dtype=np.int64),
        "name": [v.timer for v in values],
        "ms": fixes.clamp([v.value_ms for v in values], where, unit_s=1e-3),
        "min_ms": fixes.clamp([np.nan if v.min_ms is None else v.min_ms for v in values],
                              where, unit_s=1e-3),
    })
    divisor = np.ones(len(raw))
    if fmt == "deepspeed-log" and parsed.steps_from != "order":
        gaps = _interval_steps(raw["step"].to_numpy())
        divisor = raw["step"].map(gaps).to_numpy(np.float64)
    stage, replica, stages, replicas = _placement(parsed, raw["rank"].to_numpy(), per_rank)
    run_id = path.name.split(".")[0] or "log"
    frame = pd.DataFrame({
        "run_id": run_id, "step": raw["step"], "rank": raw["rank"].astype("int32"),
        "stage": stage, "replica": replica, "chunk": np.int32(0), "microbatch": np.int32(-1),
        "op": _ops(raw), "start_s": 0.0, "duration_s": raw["ms"].to_numpy() / 1e3 / divisor,
        "name": raw["name"], "min_s": raw["min_ms"].to_numpy() / 1e3 / divisor,
    })
    frame = frame.sort_values(["step", "rank", "name"], kind="stable").reset_index(drop=True)
    extra = {
        "granularity": "step", "timing": "host", "values": _values_kind(parsed),
        "per_rank": per_rank, "stages_known": stages is not None,
        "steps_from": parsed.steps_from,
        "timers": sorted(set(raw["name"])),
        "step_time_s": {str(k): v for k, v in sorted(parsed.step_time_s.items())},
        "value_unit": ("per-step mean of the interval's timer sum" if fmt == "deepspeed-log"
                       else "per-iteration mean over the logging interval"),
    }
    runs = {run_id: RunMeta(
        schedule="unknown", stages=stages or 1, microbatches=parsed.microbatches or 1,
        chunks=1, replicas=replicas or 1, partition=None, source=fmt, extra=extra)}
    fixes.record(extra)
    return Events(validate_frame(frame, runs, str(path)), runs)


__all__ = ["STEP_TIMERS", "TIMER_TO_OP", "detect_log", "read_log"]
