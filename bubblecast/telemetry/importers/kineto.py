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

Layout (stages, replicas, chunks from the stage indices) and the schedule guess are in
:mod:`~bubblecast.telemetry.importers.kineto_layout`.

Steps: each ``ProfilerStep#N`` annotation (torch.profiler with a schedule) is step ``N``; ops
outside every annotation are dropped and counted in the metadata. Without annotations, the k-th
occurrence of an action on a rank belongs to step k. ``start_s`` counts from the earliest op of
the step on any rank (Kineto timestamps share one clock on a host; ``baseTimeNanoseconds``
aligns files).

Clocks (:mod:`~bubblecast.telemetry.importers.kineto_gpu`): on CUDA, F, B and W take their
device time from the kernels each range launched, or from its ``gpu_user_annotation`` copies.
A run uses one clock: device time only when every compute op has one, else host time for all,
said on stderr (also when the trace has kernels but no compute op could be tied to them). The
run metadata says which (``timing``: ``host`` or ``device``). A file without ``PP:`` labels is
refused for that before anything else (its rank is not even looked for).
"""

from __future__ import annotations

import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bubblecast.errors import BubblecastError
from bubblecast.telemetry.events import Events
from bubblecast.telemetry.importers.fixes import InputFixes
from bubblecast.telemetry.importers.kineto_gpu import collect, device_spans
from bubblecast.telemetry.importers.kineto_io import load_trace, rank_of, trace_files
from bubblecast.telemetry.importers.kineto_layout import KIND_TO_OP, guess_schedule, to_events
from bubblecast.telemetry.validate import validate_frame

_ACTION = re.compile(r"(\d+)([A-Z_]+?)(\d*)$")
_OVERLAP = re.compile(r"\((.*)\)([A-Z_]+)$")
_STEP = re.compile(r"ProfilerStep#(\d+)$")
_COMPUTE_KINDS = ("F", "B", "I", "W")
_ROW_COLUMNS = (
    "stage_index", "kind", "microbatch", "ts_us", "dur_us", "wait_us", "host_ts_us", "name",
    "end_us", "ext_id", "sub", "n_sub",
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


def _file_ops(trace: dict[str, Any], path: Path, fixes: InputFixes
              ) -> tuple[pd.DataFrame, np.ndarray, bool]:
    """Rows (stage_index, kind, microbatch, ts_us, dur_us, wait_us, name, dev_ts_us, ...), the
    ProfilerStep spans (one row (step, start_us, end_us) per annotation) and whether the trace
    holds device activity. Label durations go through ``fixes`` (clock jitter clamped to 0).
    """
    labels: list[tuple[str, Any, float, float, Any]] = []  # host PP: and optimizer ranges
    label_at: list[int] = []  # the index in traceEvents of each label
    torch_ops: dict[Any, list[float]] = {}  # thread -> starts of torch ops (cat cpu_op)
    spans: list[tuple[float, float, float]] = []
    for at, ev in enumerate(trace["traceEvents"]):
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
        elif cat.startswith(("gpu", "kernel", "cuda")):
            continue  # device side and launches: kineto_gpu
        elif name.startswith(("PP:", "Optimizer.step#")):
            args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
            labels.append((name, ev.get("tid"), ts, dur, args.get("External id")))
            label_at.append(at)
        elif (match := _STEP.match(name)) is not None:
            spans.append((float(match.group(1)), ts, ts + dur))
    if not any(label[0].startswith("PP:") for label in labels):
        raise BubblecastError(f"{path}: {_NO_PP}")
    inside = f"{path.name}: " if fixes.source != str(path) else ""
    durs = fixes.clamp([label[3] for label in labels], unit_s=1e-6, where=lambda i: (
        f"{inside}traceEvents[{label_at[i]}] ('{labels[i][0]}'), field 'dur'"))
    labels = [(n, t, ts, float(d), e) for (n, t, ts, _, e), d in zip(labels, durs, strict=True)]
    waits = _waits(labels, torch_ops)
    rows: list[tuple[Any, ...]] = []
    for (name, _, ts, dur, ext), wait in zip(labels, waits, strict=True):
        if name.startswith("Optimizer"):
            rows.append((-1, "OPT", -1, ts, dur, 0.0, ts, name, ts + dur, ext, 0, 1))
            continue
        actions = parse_label(name) or ((-1, "UNKNOWN", -1),)
        share = (dur - wait) / len(actions)
        rows += [
            (s, k, m, ts + wait + i * share, share, wait if i == 0 else 0.0, ts, name, ts + dur,
             ext, i, len(actions))
            for i, (s, k, m) in enumerate(actions)
        ]
    ops = pd.DataFrame(rows, columns=list(_ROW_COLUMNS))
    gpu = collect(trace["traceEvents"])
    _device_candidates(ops, gpu)
    order = np.argsort([s[1] for s in spans], kind="stable")
    return ops, np.array(spans, dtype=np.float64).reshape(-1, 3)[order], bool(gpu.n_kernels)


def _waits(
    labels: list[tuple[str, Any, float, float, Any]], torch_ops: dict[Any, list[float]]
) -> np.ndarray:
    """Time from the start of each compute label to its first torch op on the same thread.

    torch 2.13's runtime waits for a received input inside the F/B/I range (the RECV action
    only posts the receive), so that leading gap is waiting, not compute. A range without
    any torch op (on a thread that has some) is all waiting.
    """
    waits = np.zeros(len(labels))
    starts = {tid: np.sort(np.asarray(v)) for tid, v in torch_ops.items()}
    for i, (name, tid, ts, dur, _) in enumerate(labels):
        actions = parse_label(name)
        if not actions or actions[0][1] not in _COMPUTE_KINDS or tid not in starts:
            continue
        thread = starts[tid]
        j = int(np.searchsorted(thread, ts, side="left"))
        # no torch op at all (e.g. I on the first stage, which has no input gradient): all wait
        waits[i] = thread[j] - ts if j < len(thread) and thread[j] <= ts + dur else dur
    return waits


def _device_candidates(ops: pd.DataFrame, gpu: Any) -> None:
    """Columns ``dev_ts_us``/``dev_dur_us``: each compute op's device interval (NaN: none).

    Sub-actions of one overlapped range share its device interval equally, as on the host.
    """
    ops["dev_ts_us"], ops["dev_dur_us"] = np.nan, np.nan
    comp = ops["kind"].isin(_COMPUTE_KINDS).to_numpy()
    if not comp.any() or not gpu.any:
        return
    ranges = ops.loc[comp, ["host_ts_us", "end_us", "name", "ext_id", "sub", "n_sub"]]
    first = ranges.loc[ranges["sub"] == 0].rename(columns={"host_ts_us": "start_us"})
    start, end = device_spans(first, gpu)
    by_range = pd.DataFrame({"host_ts_us": first["start_us"].to_numpy(),
                             "name": first["name"].to_numpy(), "s": start, "e": end})
    by_range = by_range.drop_duplicates(["host_ts_us", "name"])
    merged = ranges.merge(by_range, on=["host_ts_us", "name"], how="left")
    share = (merged["e"] - merged["s"]) / merged["n_sub"]
    ops.loc[comp, "dev_ts_us"] = (merged["s"] + merged["sub"] * share).to_numpy()
    ops.loc[comp, "dev_dur_us"] = share.to_numpy()


def _choose_clock(ops: pd.DataFrame, has_kernels: bool, source: str) -> tuple[str, str | None]:
    """Use device times for compute ops when all have one; else host for all, with a note."""
    comp = ops["kind"].isin(_COMPUTE_KINDS).to_numpy()
    has_dev = ops["dev_ts_us"].notna().to_numpy() & comp
    if comp.any() and has_dev[comp].all():
        ops.loc[comp, "ts_us"] = ops.loc[comp, "dev_ts_us"]
        ops.loc[comp, "dur_us"] = ops.loc[comp, "dev_dur_us"]
        ops.loc[comp, "wait_us"] = 0.0
        return "device", None
    note = None
    if has_dev.any():
        missing = ops.loc[comp & ~has_dev]
        first = missing.iloc[0]
        note = (f"{source}: {len(missing)} of {int(comp.sum())} compute ops have no device time "
                f"(first: '{first['name']}' on rank {first['rank']}); host times used for all "
                "ops of the run, never a mix of clocks")
    elif has_kernels:
        note = (f"{source}: the trace has GPU kernels but no F/B/W range could be tied to them "
                "(no launch correlation ids, ac2g flows or gpu_user_annotation copies); host "
                "times used (kernel-launch time, not GPU time)")
    if note:
        print(f"bubblecast: warning: {note}", file=sys.stderr)
    return "host", note


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


def read_kineto(path: str | Path, run_id: str | None = None) -> Events:
    """Read a directory of per-rank Kineto traces (or one trace) as validated :class:`Events`."""
    path = Path(path)
    files = trace_files(path)
    per_file: list[tuple[Path, pd.DataFrame, np.ndarray]] = []
    bases, hosts, from_name = [], [], []
    kernels = False
    fixes = InputFixes(str(path))
    for file in files:
        trace = load_trace(file)
        ops, spans, has_kernels = _file_ops(trace, file, fixes)  # "no PP:" before "no rank"
        kernels |= has_kernels
        rank, from_info = rank_of(trace, file)
        if not from_info:
            from_name.append(file.name)
        ops.insert(0, "rank", rank)
        ops["host"] = str(trace.get("host_name", ""))
        bases.append(int(trace.get("baseTimeNanoseconds", 0) or 0))
        hosts.append(str(trace.get("host_name", "")))
        per_file.append((file, ops, spans))
    base0 = min(bases)
    use_spans = all(len(spans) for _, _, spans in per_file)
    parts = []
    for (file, ops, spans), base in zip(per_file, bases, strict=True):
        for col in ("ts_us", "host_ts_us", "dev_ts_us"):
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
    timing, note = _choose_clock(ops, kernels, str(path))
    frame, meta = to_events(ops, str(path), run_id or path.name.split(".json")[0])
    meta.extra.update(
        {
            "files": len(files),
            "rank_from": "file name" if from_name else "distributedInfo",
            "steps_from": "ProfilerStep" if use_spans else "action occurrence",
            "dropped_outside_steps": outside,
            "hosts": sorted(set(hosts)),
            "timing": timing,
            "granularity": "op",
        }
    )
    if from_name:
        meta.extra["rank_from_file_name"] = from_name
    if note:
        meta.extra["timing_note"] = note
    fixes.record(meta.extra)
    runs = {str(frame["run_id"].iloc[0]): meta}
    return Events(validate_frame(frame, runs, str(path)), runs)


def _check_rank_files(ops: pd.DataFrame, source: str) -> None:
    """Two files of one rank must cover disjoint time spans (e.g. successive profiler cycles)."""
    spans = ops.groupby(["rank", "file"])["host_ts_us"].agg(["min", "max"]).sort_values("min")
    for rank, part in spans.groupby(level="rank"):
        if len(part) > 1 and (part["min"].to_numpy()[1:] <= part["max"].to_numpy()[:-1]).any():
            files = ", ".join(part.index.get_level_values("file"))
            raise BubblecastError(f"{source}: rank {rank} appears in overlapping traces ({files})")


__all__ = ["KIND_TO_OP", "guess_schedule", "parse_label", "read_kineto", "trace_files"]
