"""Per-rank telemetry recorder: F/B/W/OPTIMIZER timings into SPEC ``events`` Parquet parts.

The recorder wraps a pipeline stage's ``forward_one_chunk``, ``backward_one_chunk`` and
``backward_weight_one_chunk`` (module backward hooks give wrong times on the first stage and
break the zero-bubble schedules). Each op costs two ``perf_counter`` calls and one tuple
append; a background thread turns the buffer into a validated events part every
``flush_every`` steps. Timestamps are ``perf_counter`` values mapped to wall-clock time and
made relative to a run origin broadcast by rank 0, so all ranks share the origin (exactly on
one host, to clock-sync accuracy across hosts).

The same wrapper emulates slowdowns: after an op it sleeps ``(multiplier - 1) x`` the op's
measured time, and the sleep is part of the recorded duration. Every ``layer_cost_every``
steps it times each layer's forward on micro-batch 0 with forward hooks (per-layer cost
samples for the policy).

Columns beyond the required ones: ``layers`` is the number of layers of the chunk (virtual
stage) that ran the op at that step (on ``OPTIMIZER`` rows, all layers the rank holds), so
after a migration it carries the per-step truth; ``tokens`` is the micro-batch's samples x
sequence length (0 on ``OPTIMIZER`` rows); ``host`` and ``device`` name where the rank ran.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bubblecast.runtime.inject import Injection, multiplier
from bubblecast.telemetry.schema import RunMeta

_OPS = ("F", "B", "W", "OPTIMIZER")
_F, _B, _W, _OPT = range(4)


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
            yield _OPS[row[3]], row[1], row[2], row[5]

    def compute_s(self) -> float:
        """Seconds of the step's compute ops (F, B, W; the optimizer excluded)."""
        total, step = 0.0, self.step
        for row in reversed(self._rows):
            if row[0] != step:
                break
            if row[3] != _OPT:
                total += row[5]
        return total


StepHook = Callable[[StepView], None]


class Recorder:
    """Record one rank's ops; see the module docstring.

    ``events_dir`` None keeps every row in memory (:meth:`frame`); otherwise rows are written
    as ``rank{r}-{k}.parquet`` parts there by a background thread and dropped from memory.
    :meth:`add_step_hook` registers a function called at each step's end with a
    :class:`StepView` of that step's rows (the closed-loop controller's telemetry).
    """

    def __init__(self, *, run_id: str, rank: int, stage: int, origin_wall: float,
                 meta_fn: Callable[[], RunMeta], events_dir: str | None = None,
                 flush_every: int = 50, layer_cost_every: int = 0, record: bool = True,
                 injections: list[Injection] | None = None, replica: int = 0,
                 device: str = "cpu") -> None:
        import socket

        self.run_id, self.rank, self.stage, self.replica = run_id, rank, stage, replica
        self.host, self.device = socket.gethostname(), device
        self.record = record
        self.events_dir = Path(events_dir) if events_dir else None
        self.flush_every, self.layer_cost_every = flush_every, layer_cost_every
        self.injections = [i for i in (injections or []) if i.rank == rank]
        self._meta_fn = meta_fn
        self._offset = time.time() - time.perf_counter() - origin_wall
        self._rows: list[tuple] = []
        self._kept: list[tuple] = []  # all rows, when there is no events_dir
        self._step = 0
        self._stretch = 1.0
        self._chunk_layers: dict[int, int] = {}
        self._tokens = 0
        self._since_flush = 0
        self._parts = 0
        self.layer_costs: list[dict[str, Any]] = []
        self._layer_modules: dict[int, dict[int, Any]] = {}
        self._hooks: list[Any] = []
        self._step_hooks: list[StepHook] = []
        self._fwd_times: dict[int, float] = {}
        self._sampling_chunk: int | None = None
        self._queue: queue.Queue | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        if self.record and self.events_dir is not None:
            self.events_dir.mkdir(parents=True, exist_ok=True)
            self._queue = queue.Queue()
            self._thread = threading.Thread(target=self._writer, name="bubblecast-recorder",
                                            daemon=True)
            self._thread.start()

    @property
    def active(self) -> bool:
        """Whether stages need wrapping at all (recording or emulating)."""
        return self.record or bool(self.injections)

    # -- wiring -------------------------------------------------------------------------
    def attach(self, stages: list[Any], chunk_layers: dict[int, dict[int, Any]]) -> None:
        """Wrap ``stages`` (chunk order); ``chunk_layers[c]`` maps global index -> layer."""
        self._layer_modules = chunk_layers
        self._chunk_layers = {c: len(mods) for c, mods in chunk_layers.items()}
        if not self.active:
            return
        for chunk, stage in enumerate(stages):
            self._wrap(stage, chunk)

    def _wrap(self, stage: Any, chunk: int) -> None:
        perf, done = time.perf_counter, self._op_done
        fwd, bwd, wgt = (stage.forward_one_chunk, stage.backward_one_chunk,
                         stage.backward_weight_one_chunk)

        def forward_one_chunk(mb: int, *args: Any, **kwargs: Any) -> Any:
            sample = self._sampling_chunk is not None and mb == 0
            if sample:
                self._sampling_chunk = chunk
            t0 = perf()
            out = fwd(mb, *args, **kwargs)
            done(_F, chunk, mb, t0)
            if sample:
                self._sampling_chunk = -1
            return out

        def backward_one_chunk(mb: int, *args: Any, **kwargs: Any) -> Any:
            t0 = perf()
            out = bwd(mb, *args, **kwargs)
            done(_B, chunk, mb, t0)
            return out

        def backward_weight_one_chunk(mb: int, *args: Any, **kwargs: Any) -> Any:
            t0 = perf()
            out = wgt(mb, *args, **kwargs)
            done(_W, chunk, mb, t0)
            return out

        stage.forward_one_chunk = forward_one_chunk
        stage.backward_one_chunk = backward_one_chunk
        stage.backward_weight_one_chunk = backward_weight_one_chunk

    def _op_done(self, op: int, chunk: int, mb: int, t0: float) -> None:
        t1 = time.perf_counter()
        if self._stretch != 1.0:
            time.sleep((self._stretch - 1.0) * (t1 - t0))
            t1 = time.perf_counter()
        if self.record:
            self._rows.append((self._step, chunk, mb, op, t0, t1 - t0,
                               self._chunk_layers.get(chunk, 0), self._tokens))

    # -- per step -----------------------------------------------------------------------
    def begin_step(self, step: int, tokens_per_microbatch: int) -> None:
        self._step, self._tokens = step, tokens_per_microbatch
        self._stretch = multiplier(self.injections, self.rank, step) if self.injections else 1.0
        if self.record and self.layer_cost_every and step % self.layer_cost_every == 0:
            self._start_sampling()

    def record_optimizer(self, t0: float, t1: float) -> None:
        if self.record:
            self._rows.append((self._step, 0, -1, _OPT, t0, t1 - t0,
                               sum(self._chunk_layers.values()), 0))

    def add_step_hook(self, fn: StepHook) -> None:
        """Call ``fn(view)`` at the end of every recorded step, before the rows can be flushed.

        Needs a recording recorder (``record=True``): there are no rows otherwise.
        """
        if not self.record:
            raise ValueError("step hooks need a recording recorder (record=True)")
        self._step_hooks.append(fn)

    def end_step(self) -> None:
        if self._hooks:
            self._stop_sampling()
        if not self.record:
            return
        if self._step_hooks:
            view = StepView(self._rows, self._step)
            for fn in self._step_hooks:
                fn(view)
        self._since_flush += 1
        if self._since_flush >= self.flush_every:
            self.flush()

    def discard(self) -> None:
        """Drop the buffered rows unwritten (overhead benchmarks that record forever)."""
        self._rows.clear()

    # -- per-layer cost samples ---------------------------------------------------------
    def _start_sampling(self) -> None:
        self._sampling_chunk = -1
        self._fwd_times.clear()
        starts: dict[int, float] = {}
        for chunk, mods in self._layer_modules.items():
            for index, module in mods.items():
                def pre(_m: Any, _a: Any, i: int = index, c: int = chunk) -> None:
                    if self._sampling_chunk == c and i not in self._fwd_times:
                        starts[i] = time.perf_counter()

                def post(_m: Any, _a: Any, _o: Any, i: int = index, c: int = chunk) -> None:
                    if self._sampling_chunk == c and i in starts and i not in self._fwd_times:
                        self._fwd_times[i] = time.perf_counter() - starts[i]

                self._hooks += [module.register_forward_pre_hook(pre),
                                module.register_forward_hook(post)]

    def _stop_sampling(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()
        self._sampling_chunk = None
        ops: dict[tuple[int, int], float] = {}
        for step, chunk, mb, op, _t0, dur, *_ in self._rows:
            if step == self._step and mb == 0 and op != _OPT:
                key = (chunk, op)
                ops[key] = ops.get(key, 0.0) + dur
        for chunk, mods in self._layer_modules.items():
            f = ops.get((chunk, _F), 0.0)
            ratio = (f + ops.get((chunk, _B), 0.0) + ops.get((chunk, _W), 0.0)) / f if f else 0.0
            for index in mods:
                if index in self._fwd_times:
                    fwd = self._fwd_times[index]
                    self.layer_costs.append({"step": self._step, "layer": index,
                                             "rank": self.rank, "forward_s": fwd,
                                             "total_s": fwd * ratio})

    # -- output -------------------------------------------------------------------------
    def _columns(self, rows: list[tuple]) -> dict[str, Any]:
        import numpy as np

        if not rows:
            return {}
        cols = (np.asarray(c) for c in zip(*rows, strict=True))
        step, chunk, mb, op, t0, dur, layers, tokens = cols
        n = len(rows)
        return {
            "run_id": [self.run_id] * n, "step": step.astype(np.int64),
            "rank": np.full(n, self.rank, np.int32), "stage": np.full(n, self.stage, np.int32),
            "replica": np.full(n, self.replica, np.int32), "chunk": chunk.astype(np.int32),
            "microbatch": mb.astype(np.int32), "op": np.asarray(_OPS)[op],
            "start_s": t0.astype(np.float64) + self._offset, "duration_s": dur.astype(np.float64),
            "layers": layers.astype(np.int32), "tokens": tokens.astype(np.int64),
            "host": [self.host] * n, "device": [self.device] * n,
        }

    def frame(self) -> Any:
        """Rows kept in memory (``events_dir`` None) plus unflushed rows, as a DataFrame."""
        import pandas as pd

        return pd.DataFrame(self._columns(self._kept + self._rows))

    def flush(self) -> None:
        """Hand the buffered rows to the writer (or keep them, without an events_dir)."""
        rows, self._rows, self._since_flush = self._rows, [], 0
        if not rows:
            return
        if self._queue is None:
            self._kept.extend(rows)
            return
        self._raise_writer_error()
        self._queue.put((rows, self._parts, self._meta_fn()))
        self._parts += 1

    def _writer(self) -> None:
        assert self._queue is not None
        while True:
            item = self._queue.get()
            if item is None:
                return
            rows, part, meta = item
            try:
                self._write_part(rows, part, meta)
            except BaseException as exc:  # surfaced on the main thread at the next flush
                self._error = exc

    def _write_part(self, rows: list[tuple], part: int, meta: RunMeta) -> None:
        import pandas as pd

        from bubblecast.telemetry import from_frame, write_events

        frame = pd.DataFrame(self._columns(rows))
        assert self.events_dir is not None
        path = self.events_dir / f"rank{self.rank:04d}-{part:06d}.parquet"
        events = from_frame(frame, {self.run_id: meta}, str(path))  # validates
        write_events(events, path, validate=False)

    def _raise_writer_error(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise RuntimeError(f"telemetry writer failed: {err}") from err

    def close(self) -> None:
        """Flush what is left and wait for the writer to finish."""
        if self.record:
            self.flush()
        if self._thread is not None and self._queue is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread, self._queue = None, None
        self._raise_writer_error()


def merge_parts(parts_dir: str | Path, out: str | Path, run_id: str, meta: RunMeta) -> int:
    """Merge the ranks' parts into one events file with the final run metadata; row count."""
    from bubblecast.telemetry import from_frame, read_events, write_events

    events = read_events(parts_dir)
    frame = events.frame.sort_values(["step", "rank", "start_s"], kind="stable")
    merged = from_frame(frame.reset_index(drop=True), {run_id: meta}, str(out))
    write_events(merged, out)
    return len(merged)
