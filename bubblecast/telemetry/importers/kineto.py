"""Import PyTorch profiler (Kineto) traces of torch.distributed.pipelining runs (SPEC §3).

Input: a directory of Chrome-trace JSON files (optionally gzipped), one per rank, or one such
file. Pipeline ops come from the ``PP:`` record_function labels that torch 2.13's
``_PipelineScheduleRuntime`` emits around every action (ScheduleLoopedBFS,
ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble,
ScheduleDualPipeV): ``PP:{stage_index}{type}{microbatch}`` with type ``F`` (forward), ``B``
(full backward), ``I`` (backward-input), ``W`` (backward-weight), ``SEND_F``, ``RECV_F``,
``SEND_B``, ``RECV_B`` and, without a microbatch, ``UNSHARD``, ``RESHARD``, ``REDUCE_GRAD``;
plus ``PP:(0F1;3I0)OVERLAP_F_B`` for overlapped actions. ScheduleGPipe and Schedule1F1B emit no
``PP:`` labels in torch 2.13, so their traces are refused.

Mapping: ``F``->F, ``B`` and ``I``->B, ``W``->W, sends/receives keep their names,
``REDUCE_GRAD``->ALLREDUCE when the run has data-parallel replicas (else OTHER), ``UNSHARD``,
``RESHARD`` and unknown types->OTHER, ``Optimizer.step#...`` (torch.optim's own label)->OPTIMIZER.
Overlapped actions are split into their sub-actions, sharing the interval equally.

Waiting: the runtime's RECV actions only post the receive; F, B and I wait for their input
inside their own range. A compute op therefore starts at its first torch op (``cpu_op``) on
the same thread, and the leading gap goes to the extra column ``wait_s`` (a range with no torch
op, such as I on the first stage, becomes a zero-length op at its end).

Layout: the label's stage index is the global (virtual) stage. Ranks holding the same set of
stage indices are replicas of one pipeline position; positions are numbered by their smallest
stage index and a rank's chunk is the position of the stage index in its sorted set. This is
``stage_index = chunk * ranks + rank`` for looped (interleaved) schedules and
``{rank, 2 * ranks - 1 - rank}`` for V-shape ones (ZBV, DualPipeV).

Steps: each ``ProfilerStep#N`` annotation (torch.profiler with a schedule) is step ``N``; ops
outside every annotation are dropped and counted in the metadata. Without annotations, the k-th
occurrence of an action on a rank belongs to step k. ``start_s`` counts from the earliest op of
the step on any rank (Kineto timestamps share one clock on a host; ``baseTimeNanoseconds``
aligns files). When a trace holds ``gpu_user_annotation`` copies of compute labels (CUDA), their
device times replace the host times of F, B and W.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bubblecast.errors import BubblecastError
from bubblecast.telemetry.events import Events
from bubblecast.telemetry.importers.kineto_io import load_trace, rank_of, trace_files
from bubblecast.telemetry.schema import RunMeta
from bubblecast.telemetry.validate import validate_frame

_ACTION = re.compile(r"(\d+)([A-Z_]+?)(\d*)$")
_OVERLAP = re.compile(r"\((.*)\)([A-Z_]+)$")
_STEP = re.compile(r"ProfilerStep#(\d+)$")
KIND_TO_OP: dict[str, str] = {
    "F": "F", "B": "B", "I": "B", "W": "W", "SEND_F": "SEND_F", "RECV_F": "RECV_F",
    "SEND_B": "SEND_B", "RECV_B": "RECV_B", "OPT": "OPTIMIZER",
}  # fmt: skip
_COMPUTE_KINDS = ("F", "B", "I", "W")
_ROW_COLUMNS = (
    "stage_index", "kind", "microbatch", "ts_us", "dur_us", "wait_us", "host_ts_us", "name",
)  # fmt: skip
_NO_PP = (
    "no torch.distributed.pipelining 'PP:' labels (emitted by the runtime schedules such "
    "as ScheduleInterleaved1F1B; ScheduleGPipe and Schedule1F1B emit none)"
)


@lru_cache(maxsize=4096)
def parse_label(name: str) -> tuple[tuple[int, str, int], ...]:
    """``PP:`` label -> ((stage_index, type, microbatch), ...); microbatch -1 when absent.

    One tuple for a plain action, one per sub-action for ``(...)OVERLAP_F_B``; empty when the
    label is not a pipelining action.
    """
    body = name[3:] if name.startswith("PP:") else ""
    match = _OVERLAP.match(body)
    if match:
        return tuple(a for sub in match.group(1).split(";") for a in parse_label("PP:" + sub))
    match = _ACTION.match(body)
    if not match:
        return ()
    stage, kind, mb = match.groups()
    return ((int(stage), kind, int(mb) if mb else -1),)


def _file_ops(trace: dict[str, Any], path: Path, rank: int) -> tuple[pd.DataFrame, np.ndarray]:
    """Rows (rank, stage_index, kind, microbatch, ts_us, dur_us, wait_us, name, ...) and the
    ProfilerStep spans, one row (step, start_us, end_us) per annotation.
    """
    labels: list[tuple[str, Any, float, float]] = []  # host PP: and optimizer ranges
    torch_ops: dict[Any, list[float]] = {}  # thread -> starts of torch ops (cat cpu_op)
    gpu: dict[str, list[tuple[float, float]]] = {}
    spans: list[tuple[float, float, float]] = []
    for ev in trace["traceEvents"]:
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        name, cat = ev.get("name"), str(ev.get("cat", ""))
        if not isinstance(name, str):
            continue
        try:
            ts, dur = float(ev["ts"]), float(ev.get("dur", 0.0))
        except (KeyError, TypeError, ValueError):
            continue
        if cat == "cpu_op":
            torch_ops.setdefault(ev.get("tid"), []).append(ts)
        elif cat.startswith("gpu"):
            if name.startswith("PP:"):
                gpu.setdefault(name, []).append((ts, dur))
        elif name.startswith(("PP:", "Optimizer.step#")):
            labels.append((name, ev.get("tid"), ts, dur))
        elif (match := _STEP.match(name)) is not None:
            spans.append((float(match.group(1)), ts, ts + dur))
    if not any(label[0].startswith("PP:") for label in labels):
        raise BubblecastError(f"{path}: {_NO_PP}")
    waits = _waits(labels, torch_ops)
    rows: list[tuple[int, str, int, float, float, float, float, str]] = []
    for (name, _, ts, dur), wait in zip(labels, waits, strict=True):
        if name.startswith("Optimizer"):
            rows.append((-1, "OPT", -1, ts, dur, 0.0, ts, name))
            continue
        actions = parse_label(name) or ((-1, "UNKNOWN", -1),)
        share = (dur - wait) / len(actions)
        rows += [
            (s, k, m, ts + wait + i * share, share, wait if i == 0 else 0.0, ts, name)
            for i, (s, k, m) in enumerate(actions)
        ]
    ops = pd.DataFrame(rows, columns=list(_ROW_COLUMNS))
    ops.insert(0, "rank", rank)
    ops["on_device"] = False
    if gpu:
        _use_device_times(ops, gpu)
    order = np.argsort([s[1] for s in spans], kind="stable")
    return ops, np.array(spans, dtype=np.float64).reshape(-1, 3)[order]


def _waits(
    labels: list[tuple[str, Any, float, float]], torch_ops: dict[Any, list[float]]
) -> np.ndarray:
    """Time from the start of each compute label to its first torch op on the same thread.

    torch 2.13's runtime waits for a received input inside the F/B/I range (the RECV action
    only posts the receive), so that leading gap is waiting, not compute. A range without
    any torch op (on a thread that has some) is all waiting.
    """
    waits = np.zeros(len(labels))
    starts = {tid: np.sort(np.asarray(v)) for tid, v in torch_ops.items()}
    for i, (name, tid, ts, dur) in enumerate(labels):
        actions = parse_label(name)
        if not actions or actions[0][1] not in _COMPUTE_KINDS or tid not in starts:
            continue
        thread = starts[tid]
        j = int(np.searchsorted(thread, ts, side="left"))
        # no torch op at all (e.g. I on the first stage, which has no input gradient): all wait
        waits[i] = thread[j] - ts if j < len(thread) and thread[j] <= ts + dur else dur
    return waits


def _use_device_times(ops: pd.DataFrame, gpu: dict[str, list[tuple[float, float]]]) -> None:
    """Replace host times of compute labels by the k-th device annotation of the same name."""
    ops.sort_values("host_ts_us", kind="stable", inplace=True)
    for name, idx in ops.groupby("name").groups.items():
        spans = gpu.get(str(name), [])
        n_sub = len(parse_label(str(name))) or 1
        if not ops.loc[idx, "kind"].isin(_COMPUTE_KINDS).all() or len(spans) * n_sub != len(idx):
            continue  # not compute, or cannot pair them one to one: keep host times
        spans = sorted(spans)
        ts = np.repeat([s[0] for s in spans], n_sub)
        dur = np.repeat([s[1] / n_sub for s in spans], n_sub)
        ts = ts + np.tile(np.arange(n_sub), len(spans)) * dur
        ops.loc[idx, "ts_us"], ops.loc[idx, "dur_us"], ops.loc[idx, "wait_us"] = ts, dur, 0.0
        ops.loc[idx, "on_device"] = True


def _assign_steps(ops: pd.DataFrame, spans: np.ndarray) -> pd.Series:
    """Step of each op from the ProfilerStep spans of its file; -1 when outside all of them."""
    if len(spans) == 0:
        return pd.Series(-1, index=ops.index)
    ts = ops["host_ts_us"].to_numpy()
    idx = np.searchsorted(spans[:, 1], ts, side="right") - 1
    inside = (idx >= 0) & (ts <= spans[np.clip(idx, 0, None), 2])
    return pd.Series(
        np.where(inside, spans[np.clip(idx, 0, None), 0], -1).astype(np.int64), index=ops.index
    )


def _layout(ops: pd.DataFrame, source: str) -> tuple[dict[int, tuple[int, int]], dict, str]:
    """(rank -> (stage, replica), (rank, stage_index) -> chunk, layout name)."""
    held = ops.loc[ops["stage_index"] >= 0].groupby("rank")["stage_index"].unique()
    missing = sorted(set(ops["rank"].unique()) - set(held.index))
    if missing:
        raise BubblecastError(f"{source}: rank {missing[0]} has no 'PP:' label with a stage index")
    groups: dict[tuple[int, ...], list[int]] = {}
    for rank, indices in held.items():
        groups.setdefault(tuple(sorted(int(i) for i in indices)), []).append(int(rank))
    sets = sorted(groups, key=lambda s: s[0])
    flat = sorted(i for s in sets for i in s)
    if flat != list(range(len(flat))) or len({len(s) for s in sets}) != 1:
        desc = "; ".join(f"ranks {groups[s]}: {list(s)}" for s in sets)
        raise BubblecastError(f"{source}: ranks hold inconsistent pipeline stage indices ({desc})")
    n_pos, n_chunks = len(sets), len(sets[0])
    placement: dict[int, tuple[int, int]] = {}
    chunk_of: dict[tuple[int, int], int] = {}
    for stage, indices in enumerate(sets):
        for replica, rank in enumerate(sorted(groups[indices])):
            placement[rank] = (stage, replica)
            chunk_of.update({(rank, idx): c for c, idx in enumerate(indices)})
    if n_chunks == 1:
        layout = "single"
    elif all(s[c] == s[0] + c * n_pos for s in sets for c in range(n_chunks)):
        layout = "looped"
    elif n_chunks == 2 and all(s[0] + s[1] == 2 * n_pos - 1 for s in sets):
        layout = "v-shape"
    else:
        layout = "custom"
    return placement, chunk_of, layout


def guess_schedule(frame: pd.DataFrame, layout: str, stages: int) -> str:
    """Name the schedule from the op pattern of the first step (``unknown`` if unsure)."""
    names = frame["name"].astype(str)
    if names.str.contains("OVERLAP_F_B", regex=False).any():
        return "dualpipev"
    comp = frame.loc[frame["op"].isin(["F", "B", "W"]) & (frame["replica"] == 0)]
    if comp.empty:
        return "unknown"
    comp = comp.loc[comp["step"] == comp["step"].min()].sort_values("start_s", kind="stable")
    has_w = bool((comp["op"] == "W").any())

    def forwards_before_first_b(stage: int) -> tuple[int, int]:
        ops = comp.loc[comp["stage"] == stage, "op"].astype(str).tolist()
        first_b = ops.index("B") if "B" in ops else len(ops)
        return ops[:first_b].count("F"), ops.count("F")

    if layout == "single":
        if has_w:
            return "zb-h1" if forwards_before_first_b(0)[0] <= stages else "zb-h2"
        before, total = forwards_before_first_b(stages - 1)
        return "gpipe" if before == total and total > 1 else "1f1b"
    if layout == "looped":
        if has_w:
            return "zb-interleaved"
        all_f_first = all(b == t for b, t in (forwards_before_first_b(s) for s in range(stages)))
        return "looped-bfs" if all_f_first else "interleaved"
    if layout == "v-shape":
        return "zbv" if has_w else "v-shape"
    return "unknown"


def read_kineto(path: str | Path, run_id: str | None = None) -> Events:
    """Read a directory of per-rank Kineto traces (or one trace) as validated :class:`Events`."""
    path = Path(path)
    files = trace_files(path)
    per_file: list[tuple[Path, pd.DataFrame, np.ndarray]] = []
    bases, hosts, from_name = [], [], []
    for file in files:
        trace = load_trace(file)
        rank, from_info = rank_of(trace, file)
        if not from_info:
            from_name.append(file.name)
        ops, spans = _file_ops(trace, file, rank)
        ops["host"] = str(trace.get("host_name", ""))
        bases.append(int(trace.get("baseTimeNanoseconds", 0) or 0))
        hosts.append(str(trace.get("host_name", "")))
        per_file.append((file, ops, spans))
    base0 = min(bases)
    use_spans = all(len(spans) for _, _, spans in per_file)
    parts = []
    for (file, ops, spans), base in zip(per_file, bases, strict=True):
        for col in ("ts_us", "host_ts_us"):
            ops[col] = ops[col] + (base - base0) / 1000.0
        ops["step"] = _assign_steps(ops, spans) if use_spans else -1
        ops["file"] = file.name
        parts.append(ops)
    ops = pd.concat(parts, ignore_index=True).sort_values(["rank", "host_ts_us"], kind="stable")
    _check_rank_files(ops, str(path))
    outside = int((ops["step"] < 0).sum()) if use_spans else 0
    if use_spans:
        ops = ops.loc[ops["step"] >= 0]
        if not (ops["stage_index"] >= 0).any():
            raise BubblecastError(f"{path}: no 'PP:' op falls inside a ProfilerStep annotation")
    else:  # the k-th occurrence of an action on a rank belongs to step k
        ops["step"] = ops.groupby(["rank", "stage_index", "kind", "microbatch"]).cumcount()
    frame, meta = _to_events(ops, str(path), run_id or path.name.split(".json")[0])
    meta.extra.update(
        {
            "files": len(files),
            "rank_from": "file name" if from_name else "distributedInfo",
            "steps_from": "ProfilerStep" if use_spans else "action occurrence",
            "dropped_outside_steps": outside,
            "hosts": sorted(set(hosts)),
            "timing": "device" if bool(ops["on_device"].any()) else "host",
        }
    )
    if from_name:
        meta.extra["rank_from_file_name"] = from_name
    runs = {str(frame["run_id"].iloc[0]): meta}
    return Events(validate_frame(frame, runs, str(path)), runs)


def _check_rank_files(ops: pd.DataFrame, source: str) -> None:
    """Two files of one rank must cover disjoint time spans (e.g. successive profiler cycles)."""
    spans = ops.groupby(["rank", "file"])["host_ts_us"].agg(["min", "max"]).sort_values("min")
    for rank, part in spans.groupby(level="rank"):
        if len(part) > 1 and (part["min"].to_numpy()[1:] <= part["max"].to_numpy()[:-1]).any():
            files = ", ".join(part.index.get_level_values("file"))
            raise BubblecastError(f"{source}: rank {rank} appears in overlapping traces ({files})")


def _to_events(ops: pd.DataFrame, source: str, run_id: str) -> tuple[pd.DataFrame, RunMeta]:
    placement, chunk_of, layout = _layout(ops, source)
    rank = ops["rank"].to_numpy()
    stage = np.array([placement[r][0] for r in rank], dtype=np.int32)
    replica = np.array([placement[r][1] for r in rank], dtype=np.int32)
    chunk = np.array(
        [chunk_of.get((r, s), 0) for r, s in zip(rank, ops["stage_index"], strict=True)],
        dtype=np.int32,
    )
    replicas = max(p[1] for p in placement.values()) + 1
    kind_map = dict(KIND_TO_OP, REDUCE_GRAD="ALLREDUCE" if replicas > 1 else "OTHER")
    op = ops["kind"].map(kind_map).fillna("OTHER")
    step = ops["step"].to_numpy(np.int64)
    ts = ops["ts_us"].to_numpy(np.float64)
    origin = pd.Series(ts).groupby(step).transform("min").to_numpy()
    frame = pd.DataFrame(
        {
            "run_id": run_id,
            "step": step,
            "rank": rank.astype(np.int32),
            "stage": stage,
            "replica": replica,
            "chunk": chunk,
            "microbatch": ops["microbatch"].to_numpy(np.int32),
            "op": op.to_numpy(),
            "start_s": (ts - origin) / 1e6,
            "duration_s": ops["dur_us"].to_numpy(np.float64) / 1e6,
            "wait_s": ops["wait_us"].to_numpy(np.float64) / 1e6,
            "host": ops["host"].to_numpy(),
            "name": ops["name"].to_numpy(),
        }
    )
    frame = frame.sort_values(["step", "rank", "start_s"], kind="stable").reset_index(drop=True)
    stages = len({p[0] for p in placement.values()})
    chunks = max(chunk_of.values()) + 1
    is_comp = frame["op"].isin(["F", "B", "W"])
    microbatches = int(frame.loc[is_comp, "microbatch"].max()) + 1 if is_comp.any() else 1
    meta = RunMeta(
        schedule=guess_schedule(frame, layout, stages),
        stages=stages,
        microbatches=max(microbatches, int(frame["microbatch"].max()) + 1, 1),
        chunks=chunks,
        replicas=replicas,
        partition=None,
        source="kineto",
        extra={"stage_layout": layout, "ranks": len(placement)},
    )
    return frame, meta


__all__ = ["KIND_TO_OP", "guess_schedule", "parse_label", "read_kineto", "trace_files"]
