"""Import Megatron-LM op timelines in Chrome-trace JSON (the ``megatron-timeline`` format, SPEC §3).

The layout ByteDance's StragglerAnalysis ``timeline-*.json.gz`` and veScale's ndtimeline write:
one ``X`` event per Megatron timer op, named by its optype (``forward-compute``,
``backward-compute``, ``forward-recv``, ...) with ``args`` ``step``, ``model_chunk``, ``mb_id``
(and ``seq_id``); ``pid`` is the data-parallel rank; ``thread_name`` metadata names each thread
``PP rank k, TP rank t, compute|pp-comm|tp-comm|dp-comm|misc``. Timestamps are microseconds on
one clock for the whole job; each step's origin is its earliest op.

Ops map as in the ``megatron-ops`` importer (same optype table, same microbatch rules), so a
timeline and the Parquet trace of one run give the same events up to the step origins; the
timeline may draw communication ops without their waiting (StragglerAnalysis does). The global
rank follows Megatron's default order (tensor, then data, then pipeline):
``rank = (pp * dp_size + dp) * tp_size + tp``. Timing is ``host`` (Megatron's timers are host
timers unless the job synchronises them, which the file does not say).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bubblecast.errors import BubblecastError
from bubblecast.telemetry.events import Events
from bubblecast.telemetry.importers.fixes import InputFixes
from bubblecast.telemetry.importers.kineto_io import load_trace, read_prefix
from bubblecast.telemetry.importers.megatron import OPTYPE_TO_OP, read_sidecar_meta
from bubblecast.telemetry.schema import RunMeta
from bubblecast.telemetry.validate import validate_frame

_THREAD = re.compile(r"PP rank (\d+), TP rank (\d+), ([\w-]+)")
#: Byte patterns that mark a Megatron timeline (checked on the first bytes of the file).
_MARKERS = (re.compile(rb'"PP rank \d+, TP rank \d+'),
            re.compile(rb'"(?:forward|backward)-compute"[^{}]*"args"\s*:\s*\{[^{}]*"mb_id"'))


def looks_like(path: Path) -> bool:
    """True when the first megabyte of the (possibly gzipped) JSON holds Megatron markers."""
    head = read_prefix(path, 1 << 20)
    return any(m.search(head) for m in _MARKERS)


def _threads(events: list[Any]) -> dict[tuple[Any, Any], tuple[int, int, str]]:
    """(pid, tid) -> (pp rank, tp rank, thread kind) from the ``thread_name`` metadata."""
    out: dict[tuple[Any, Any], tuple[int, int, str]] = {}
    for ev in events:
        if isinstance(ev, dict) and ev.get("ph") == "M" and ev.get("name") == "thread_name":
            match = _THREAD.match(str((ev.get("args") or {}).get("name", "")))
            if match:
                out[(ev.get("pid"), ev.get("tid"))] = (
                    int(match.group(1)), int(match.group(2)), match.group(3))
    return out


def _rows(events: list[Any], path: Path) -> pd.DataFrame:
    """One row per ``X`` event: dp, pp, tp, step, optype, ts/dur (us), chunk, mb_id, seq_id
    and ``event``, its index in ``traceEvents``."""
    threads = _threads(events)
    if not threads:
        raise BubblecastError(f"{path}: no 'PP rank k, TP rank t, ...' thread names "
                              "(megatron-timeline format)")
    rows: list[tuple[int, int, int, int, str, float, float, int, int, int, int]] = []
    for i, ev in enumerate(events):
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        place = threads.get((ev.get("pid"), ev.get("tid")))
        args = ev.get("args") or {}
        try:
            if place is None:
                raise KeyError("a thread without a 'PP rank k, TP rank t' name")
            rows.append((int(ev["pid"]), place[0], place[1], int(args["step"]), str(ev["name"]),
                         float(ev["ts"]), float(ev.get("dur", 0.0)),
                         int(args.get("model_chunk", -1)), int(args.get("mb_id", -1)),
                         int(args.get("seq_id", -1)), i))
        except (KeyError, TypeError, ValueError) as exc:
            raise BubblecastError(f"{path}: traceEvents[{i}] ('{ev.get('name')}'): "
                                  f"missing or bad {exc} (megatron-timeline format)") from None
    if not rows:
        raise BubblecastError(f"{path}: no timer ops ('X' events) in the timeline")
    return pd.DataFrame(rows, columns=["dp", "pp", "tp", "step", "optype", "ts_us", "dur_us",
                                       "mc", "mb_id", "seq_id", "event"])


def _sizes(raw: pd.DataFrame, meta: dict[str, object]) -> tuple[int, int, int, int]:
    """(pp, dp, tp, vpp) sizes: from the sidecar ``meta-*.yaml`` when present, else the data."""
    def size(key: str, observed: int) -> int:
        value = meta.get(key, observed)
        return int(value) if isinstance(value, int) and value >= 1 else observed

    return (size("pp_size", int(raw["pp"].max()) + 1), size("dp_size", int(raw["dp"].max()) + 1),
            size("tp_size", int(raw["tp"].max()) + 1),
            size("vpp_size", max(int(raw["mc"].max()) + 1, 1)))


def read_megatron_timeline(path: str | Path) -> Events:
    """Read a Megatron-LM op timeline (Chrome-trace JSON, optionally gzipped) as events."""
    path = Path(path)
    raw = _rows(load_trace(path)["traceEvents"], path)
    meta = read_sidecar_meta(path, r"timeline-(.*)\.json(?:\.gz)?$")
    run_id = str(meta.get("trial_name", path.name.split(".json")[0]))
    pp, dp, tp, vpp = _sizes(raw, meta)
    op = raw["optype"].map(OPTYPE_TO_OP).fillna("OTHER")
    is_compute = op.isin(["F", "B"]).to_numpy()
    is_p2p = op.isin(["SEND_F", "RECV_F", "SEND_B", "RECV_B"]).to_numpy()
    mb = np.where(is_compute, raw["mb_id"].to_numpy(np.int64), -1)
    if vpp == 1:
        mb = np.where(is_p2p, raw["seq_id"].to_numpy(np.int64), mb)
    step = raw["step"].to_numpy(np.int64)
    ts = raw["ts_us"].to_numpy(np.float64)
    fixes = InputFixes(str(path))
    event, name = raw["event"].to_numpy(), raw["optype"].to_numpy()
    dur_us = fixes.clamp(raw["dur_us"].to_numpy(np.float64), unit_s=1e-6,
                         where=lambda i: f"traceEvents[{event[i]}] ('{name[i]}'), field 'dur'")
    origin = pd.Series(ts).groupby(step).transform("min").to_numpy()
    frame = pd.DataFrame({
        "run_id": run_id,
        "step": step,
        "rank": ((raw["pp"] * dp + raw["dp"]) * tp + raw["tp"]).astype("int32"),
        "stage": raw["pp"].astype("int32"),
        "replica": raw["dp"].astype("int32"),
        "chunk": np.where(is_compute, raw["mc"], 0).clip(min=0).astype("int32"),
        "microbatch": np.clip(mb, -1, None).astype("int32"),
        "op": op.to_numpy(),
        "start_s": (ts - origin) / 1e6,
        "duration_s": dur_us / 1e6,
        "name": raw["optype"].to_numpy(),
    })
    frame = frame.sort_values(["step", "rank", "start_s"], kind="stable").reset_index(drop=True)
    comp_mb = frame.loc[frame["op"].isin(["F", "B"]), "microbatch"]
    microbatches = max(int(comp_mb.max()) + 1 if len(comp_mb) else 1,
                       int(frame["microbatch"].max()) + 1, 1)
    runs = {run_id: RunMeta(
        schedule="interleaved" if vpp > 1 else "1f1b", stages=pp, microbatches=microbatches,
        chunks=vpp, replicas=dp, partition=None, source="megatron-timeline",
        extra={**{k: v for k, v in meta.items() if k.endswith("_size")},
               "tp_size": tp, "timing": "host", "granularity": "op"},
    )}
    fixes.record(runs[run_id].extra)
    return Events(validate_frame(frame, runs, str(path)), runs)


__all__ = ["looks_like", "read_megatron_timeline"]
