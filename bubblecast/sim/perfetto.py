"""Export events as a Chrome / Perfetto trace (``inspect --perfetto FILE.json``).

Trace Event Format: one complete (``"ph": "X"``) event per op, one process (``pid``) per rank
named ``rank R (stage S, replica D)``, and three threads per rank: compute (F/B/W), comm
(sends, receives, collectives) and other. Logged steps are laid side by side from their own
origins, in step order, with a small gap. Each op's start and end are rounded to whole
nanoseconds and its duration is their difference, so ops that meet in the events meet in the
trace (never overlapping by a rounding); ``ts`` and ``dur`` are those nanoseconds written as
microseconds (the format's unit, three decimals). Open it at ui.perfetto.dev or
chrome://tracing.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from bubblecast.telemetry.events import Events

THREADS = ("compute", "comm", "other")
_COMM = ("SEND_F", "RECV_F", "SEND_B", "RECV_B", "ALLREDUCE")


def _us(ns: int) -> float:
    """Whole nanoseconds as microseconds: the double nearest ``ns / 1000``, which JSON writes
    with at most three decimals (so a reader gets the nanoseconds back exactly)."""
    return ns / 1000


def trace_events(events: Events, run_id: str | None = None,
                 steps: list[int] | None = None) -> list[dict]:
    """The ``traceEvents`` list for one run (optionally only some steps)."""
    from bubblecast.sim.replay import select_run

    run_id, ev = select_run(events, run_id)
    f = ev.frame
    if steps:
        f = f.loc[f["step"].isin(steps)]
    if f.empty:
        return []
    start = f["start_s"].to_numpy(float)
    dur = f["duration_s"].to_numpy(float)
    step = f["step"].to_numpy(np.int64)
    uniq, inv = np.unique(step, return_inverse=True)
    lo = np.full(len(uniq), np.inf)
    hi = np.full(len(uniq), -np.inf)
    np.minimum.at(lo, inv, start)
    np.maximum.at(hi, inv, start + dur)
    span = hi - lo
    offset = np.r_[0.0, np.cumsum(span * 1.02)[:-1]]
    # ends from start + duration as the events hold them: an op that starts where another
    # ends (start_2 >= start_1 + duration_1) gets start_ns_2 >= end_ns_1 (rint is monotone)
    offset_ns = np.rint(offset * 1e9).astype(np.int64)[inv]
    start_ns = np.rint((start - lo[inv]) * 1e9).astype(np.int64) + offset_ns
    end_ns = np.rint((start + dur - lo[inv]) * 1e9).astype(np.int64) + offset_ns
    dur_ns = end_ns - start_ns
    op = f["op"].astype(str).to_numpy()
    tid = np.where(np.isin(op, ["F", "B", "W"]), 0, np.where(np.isin(op, _COMM), 1, 2))
    names = f["name"].astype(str).to_numpy() if "name" in f.columns else op
    out: list[dict] = []
    roles = f.drop_duplicates("rank").sort_values("rank")
    for r, s, d in roles[["rank", "stage", "replica"]].itertuples(index=False):
        out.append({"ph": "M", "name": "process_name", "pid": int(r), "tid": 0,
                    "args": {"name": f"rank {r} (stage {s}, replica {d})"}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": int(r), "tid": 0,
                    "args": {"sort_index": int(r)}})
        for t, label in enumerate(THREADS):
            out.append({"ph": "M", "name": "thread_name", "pid": int(r), "tid": t,
                        "args": {"name": label}})
    cols = zip(op, names, start_ns.tolist(), dur_ns.tolist(), f["rank"].to_numpy(), tid, step,
               f["microbatch"].to_numpy(), f["chunk"].to_numpy(), strict=True)
    for o, name, t, d, r, th, st, mb, ch in cols:
        label = f"{o}{mb}" + (f".{ch}" if ch else "") if th == 0 else str(name)
        out.append({"ph": "X", "name": label, "cat": THREADS[th], "ts": _us(t), "dur": _us(d),
                    "pid": int(r), "tid": int(th),
                    "args": {"step": int(st), "microbatch": int(mb), "chunk": int(ch),
                             "op": o}})
    return out


def write_perfetto(events: Events, path: str | Path, run_id: str | None = None,
                   steps: list[int] | None = None) -> Path:
    """Write the trace JSON atomically; returns the path."""
    from bubblecast.telemetry.importers import require_per_op
    from bubblecast.telemetry.io import atomic_write

    require_per_op(events, "inspect --perfetto", f"run {run_id or ', '.join(events.run_ids)}")

    items = trace_events(events, run_id, steps)

    def write(tmp: str) -> None:
        with open(tmp, "w") as fh:
            fh.write('{"displayTimeUnit": "ms", "traceEvents": [\n')
            for i, item in enumerate(items):
                fh.write(("," if i else "") + json.dumps(item, separators=(",", ":")) + "\n")
            fh.write("]}\n")

    return atomic_write(path, write)
