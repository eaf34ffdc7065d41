"""The recorder's rows: a step's view of them, as events columns, written as parts, merged.

:class:`PartWriter` validates and writes each batch of rows as ``rank{r}-{k}.parquet`` in a
background thread, so training never waits on Parquet; a failure is raised on the training
thread at the next submit or at close. The rows become numpy arrays with SPEC dtypes
(:func:`event_arrays`) written by :func:`bubblecast.telemetry.fastwrite.write_rank_arrays`
(SPEC checks in a few vectorised passes, Arrow table built from the arrays, atomic): the same
bytes as the DataFrame path (``from_frame`` + ``write_events``) at a fraction of its CPU,
which on a small machine is taken from the training ranks.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bubblecast.errors import BubblecastError
from bubblecast.telemetry.fastwrite import RankArrays
from bubblecast.telemetry.schema import OPS as SPEC_OPS
from bubblecast.telemetry.schema import RunMeta

#: Op names by the op code of a recorder row ``(step, chunk, microbatch, op code, start,
#: duration, layers, tokens, tokens_sq, documents)``; a negative ``tokens``, ``tokens_sq`` or
#: ``documents`` is unknown (a null in the events).
OPS = ("F", "B", "W", "OPTIMIZER")
_OPT = 3
#: A micro-batch's work as a row carries it: (tokens, tokens_sq, documents).
Work = tuple[int, float, int]

#: Turns a batch of buffered rows into one rank's event arrays (runs in the writer thread).
Arrays = Callable[[list[tuple]], RankArrays]


def document_work(lengths: Any, microbatches: int | None,
                  name: str = "lengths") -> list[Work]:
    """Each micro-batch's (tokens, tokens_sq, documents) from its packed documents' lengths
    (``lengths[m]``: the lengths of micro-batch ``m``'s documents); ``microbatches``: the
    count the schedule runs (None: not checked). Raises :class:`BubblecastError` naming
    ``name`` and the bad entry: not one list per micro-batch, a length that is not an integer
    >= 0."""
    import operator

    if isinstance(lengths, (str, bytes, dict)) or not hasattr(lengths, "__len__"):
        raise BubblecastError(f"{name} must be one list of document lengths per micro-batch, "
                              f"got {type(lengths).__name__}")
    if microbatches is not None and len(lengths) != microbatches:
        raise BubblecastError(f"{name} has {len(lengths)} micro-batches, the schedule runs "
                              f"{microbatches}")
    work = []
    for m, docs in enumerate(lengths):
        if isinstance(docs, (str, bytes, dict)) or not hasattr(docs, "__iter__"):
            raise BubblecastError(f"{name}[{m}] must be a list of document lengths, got "
                                  f"{type(docs).__name__}")
        total = square = count = 0
        for d, length in enumerate(docs):
            try:
                n = -1 if isinstance(length, bool) else operator.index(length)
            except TypeError:
                n = -1
            if n < 0:
                raise BubblecastError(f"{name}[{m}][{d}] is {length!r}: a document length "
                                      f"must be an integer >= 0")
            total, square, count = total + n, square + n * n, count + 1
        work.append((total, float(square), count))
    return work


def event_arrays(rows: list[tuple], ops: tuple[str, ...], *, run_id: str, rank: int,
                 stage: int, replica: int, host: str, device: str,
                 offset: Any) -> RankArrays:
    """The recorder's rows ``(step, chunk, microbatch, op code, start, duration, layers,
    tokens[, tokens_sq, documents])`` as :class:`RankArrays` (op codes mapped to SPEC
    ``OPS``; negative tokens, tokens_sq and documents are unknown: nulls; tokens_sq and
    documents absent when no row knows them); ``offset`` (a number or one per row) maps starts
    to the run's origin."""
    import numpy as np

    columns = [np.asarray(c) for c in zip(*rows, strict=True)]
    step, chunk, mb, op, t0, dur, layers, tokens = columns[:8]
    spec_code = np.array([SPEC_OPS.index(o) for o in ops], dtype=np.int8)
    work: dict[str, Any] = {"tokens": tokens.astype(np.int64)}
    if len(columns) > 8 and (columns[9] >= 0).any():
        work["tokens_sq"] = columns[8].astype(np.float64)
        work["documents"] = columns[9].astype(np.int32)
    nulls = {}
    for col, values in work.items():
        unknown = values < 0
        if unknown.any():
            nulls[col] = unknown
            values[unknown] = 0
    return RankArrays(
        run_id=run_id, rank=rank, stage=stage, replica=replica,
        step=step.astype(np.int64), chunk=chunk.astype(np.int32),
        microbatch=mb.astype(np.int32), op=spec_code[op],
        start_s=t0.astype(np.float64) + offset, duration_s=dur.astype(np.float64),
        layers=layers.astype(np.int32), host=host, device=device, nulls=nulls, **work)


def event_columns(arrays: RankArrays) -> dict[str, Any]:
    """``arrays`` as events columns (a DataFrame's, SPEC names and dtypes; nulls as pandas
    nullable integers, or NaN in a float column)."""
    import numpy as np
    import pandas as pd

    n = len(arrays)
    columns: dict[str, Any] = {
        "run_id": [arrays.run_id] * n, "step": arrays.step,
        "rank": np.full(n, arrays.rank, np.int32), "stage": np.full(n, arrays.stage, np.int32),
        "replica": np.full(n, arrays.replica, np.int32), "chunk": arrays.chunk,
        "microbatch": arrays.microbatch, "op": np.asarray(SPEC_OPS)[arrays.op],
        "start_s": arrays.start_s, "duration_s": arrays.duration_s,
    }
    for col in ("layers", "tokens", "tokens_sq", "documents"):
        values, null = getattr(arrays, col), arrays.nulls.get(col)
        if values is None:
            continue
        if null is not None:
            values = np.where(null, np.nan, values) if values.dtype.kind == "f" \
                else pd.arrays.IntegerArray(values, null)
        columns[col] = values
    columns.update({"host": [arrays.host] * n, "device": [arrays.device] * n})
    return columns


class StepView:
    """Read-only view of the rows of the step now ending, handed to step hooks.

    Valid only during the hook call (the recorder may flush its buffer right after); reading
    it allocates nothing, so a per-step hook stays cheap.
    """

    __slots__ = ("_rows", "step")

    def __init__(self, rows: list[tuple], step: int) -> None:
        self._rows, self.step = rows, step

    def ops(self) -> Iterator[tuple[str, int, int, float]]:
        """``(op, chunk, microbatch, duration_s)`` of each op of the step, latest first."""
        step = self.step
        for row in reversed(self._rows):
            if row[0] != step:
                return
            yield OPS[row[3]], row[1], row[2], row[5]

    def compute_s(self) -> float:
        """Seconds of the step's compute ops (F, B, W; the optimizer excluded)."""
        total, step = 0.0, self.step
        for row in reversed(self._rows):
            if row[0] != step:
                break
            if row[3] != _OPT:
                total += row[5]
        return total


class PartWriter:
    """Writes ``rank{rank:04d}-{part:06d}.parquet`` files under ``events_dir`` in a thread."""

    def __init__(self, events_dir: Path, rank: int, run_id: str, arrays: Arrays) -> None:
        self.events_dir, self.rank, self.run_id, self._arrays = events_dir, rank, run_id, arrays
        self.events_dir.mkdir(parents=True, exist_ok=True)
        self._parts = 0
        self.cpu_s: list[float] = []  # this thread's CPU seconds per part written
        self._error: BaseException | None = None
        self._queue: queue.Queue | None = queue.Queue()
        self._thread: threading.Thread | None = threading.Thread(
            target=self._run, name="bubblecast-recorder", daemon=True)
        self._thread.start()

    def submit(self, rows: list[tuple], meta: RunMeta) -> None:
        """Queue ``rows`` as the next part, with run metadata ``meta``."""
        self.raise_error()
        assert self._queue is not None, "writer closed"
        self._queue.put((rows, self._parts, meta))
        self._parts += 1

    def _run(self) -> None:
        assert self._queue is not None
        while True:
            item = self._queue.get()
            if item is None:
                self._queue.task_done()
                return
            rows, part, meta = item
            start = time.thread_time()
            try:
                self._write(rows, part, meta)
            except BaseException as exc:  # surfaced on the main thread at the next submit
                self._error = exc
            self.cpu_s.append(time.thread_time() - start)
            self._queue.task_done()

    def _write(self, rows: list[tuple], part: int, meta: RunMeta) -> None:
        from bubblecast.telemetry.fastwrite import write_rank_arrays

        path = self.events_dir / f"rank{self.rank:04d}-{part:06d}.parquet"
        write_rank_arrays(self._arrays(rows), meta, path)  # checked, atomic

    def raise_error(self) -> None:
        """Raise the writer thread's failure, if any, on the calling thread."""
        if self._error is not None:
            err, self._error = self._error, None
            raise RuntimeError(f"telemetry writer failed: {err}") from err

    def wait(self) -> None:
        """Block until every part submitted so far is written; raise a failure."""
        if self._queue is not None:
            self._queue.join()
        self.raise_error()

    def close(self) -> None:
        """Wait for the queued parts to be written; raise a failure."""
        if self._thread is not None and self._queue is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread, self._queue = None, None
        self.raise_error()


def merge_parts(parts_dir: str | Path, out: str | Path, run_id: str, meta: RunMeta) -> int:
    """Merge the ranks' parts into one events file with the final run metadata; row count.
    ``from_frame`` validates the merged rows once; the write does not repeat it (same file)."""
    from bubblecast.telemetry import from_frame, read_events, write_events

    events = read_events(parts_dir)
    frame = events.frame.sort_values(["step", "rank", "start_s"], kind="stable")
    merged = from_frame(frame.reset_index(drop=True), {run_id: meta}, str(out))
    write_events(merged, out, validate=False)
    return len(merged)
