"""Per-rank telemetry recorder: F/B/W/OPTIMIZER timings into SPEC ``events`` Parquet parts.

The recorder wraps a pipeline stage's ``forward_one_chunk``, ``backward_one_chunk`` and
``backward_weight_one_chunk`` (module backward hooks give wrong times on the first stage and
break the zero-bubble schedules). On the host clock (``timing="host"``) each op costs two
``perf_counter`` calls and one tuple append; with an :class:`EventTimer` (``timing="device"``,
CUDA) each op records two events on the stage's current stream instead, and the rows keep the
events until they are resolved in one batch at a flush (or at a step end that needs the
durations: step hooks, per-layer cost sampling): no synchronize per op. A background thread
turns the buffer into a validated events part every ``flush_every`` steps (and no sooner than
``min_part_s`` seconds after the previous part: most of a part's CPU cost is fixed whatever its
size, so fast steps get fewer, larger parts). Timestamps are ``perf_counter`` values (device
times mapped onto it) relative to a run origin broadcast by rank 0, on rank 0's clock (the
offset of :mod:`bubblecast.runtime.clock`, estimated at start and every ``clock_every`` steps).

The same wrapper emulates slowdowns: on the host clock, after an op it sleeps
``(multiplier - 1) x`` the op's measured time; on the device it queues that much spinning on
the stream (:class:`DeviceDelay`). Either way the delay is part of the recorded duration.
Every ``layer_cost_every`` steps it times each layer's forward on micro-batch 0 with forward
hooks, on the same clock (per-layer cost samples for the policy).

Ops are recorded between :meth:`Recorder.begin_step` and :meth:`Recorder.end_step` only (or
while :attr:`Recorder.capture` is set), so a stage method called outside a step (an
evaluation pass) adds no rows.

Columns beyond the required ones: ``layers`` is the number of layers of the chunk (virtual
stage) that ran the op at that step (on ``OPTIMIZER`` rows, all layers the rank holds), so
after a migration it carries the per-step truth; ``tokens`` is the micro-batch's samples x
sequence length (0 on ``OPTIMIZER`` rows; null when the caller does not know it: -1 given);
given the step's packed documents (:meth:`Recorder.begin_step`), micro-batch m's ops carry
m's ``tokens``, ``tokens_sq`` and ``documents`` (0 on ``OPTIMIZER`` rows, null on steps
without; absent from a part without any); ``host`` and ``device`` name where the rank ran.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bubblecast.runtime import clock as clocks
from bubblecast.runtime.inject import Injection, multiplier
from bubblecast.runtime.parts import OPS as _OPS
from bubblecast.runtime.parts import (
    PartWriter,
    StepView,
    Work,
    event_arrays,
    event_columns,
    merge_parts,
)
from bubblecast.runtime.sampler import MetricLog
from bubblecast.telemetry.schema import RunMeta

if TYPE_CHECKING:
    from bubblecast.runtime.device_timing import DeviceDelay, EventTimer

_MISSING = object()  # a stage method that was the class's, not the instance's
#: Most sleep overshoot carried into the next ops' emulated slowdown (host clock), seconds.
MAX_OVERSLEPT_S = 0.02
_F, _B, _W, _OPT = range(4)


StepHook = Callable[[StepView], None]


class Recorder:
    """Record one rank's ops; see the module docstring.

    ``events_dir`` None keeps every row in memory (:meth:`frame`); otherwise rows are written
    as ``rank{r}-{k}.parquet`` parts there by a background thread and dropped from memory.
    :meth:`add_step_hook` registers a function called at each step's end with a
    :class:`StepView` of that step's rows (the closed-loop controller's telemetry).
    ``timer``: an :class:`~bubblecast.runtime.device_timing.EventTimer` for device timing
    (None: host ``perf_counter``); :attr:`timing` says which. :attr:`metrics`: device metrics
    (every ``metrics_every`` steps, emulated temperatures, :meth:`announce_tokens`).
    """

    def __init__(self, *, run_id: str, rank: int, stage: int, origin_wall: float,
                 meta_fn: Callable[[], RunMeta], events_dir: str | None = None,
                 flush_every: int = 50, layer_cost_every: int = 0, record: bool = True,
                 injections: list[Injection] | None = None, replica: int = 0,
                 device: str = "cpu", timer: EventTimer | None = None,
                 min_part_s: float = 0.0, metrics_every: int = 0,
                 clock: clocks.ClockEstimate | None = None, clock_group: Any = None,
                 clock_every: int = 0) -> None:
        import socket

        self.run_id, self.rank, self.stage, self.replica = run_id, rank, stage, replica
        self.host, self.device = socket.gethostname(), device
        self.record = record
        self.events_dir = Path(events_dir) if events_dir else None
        self.flush_every, self.layer_cost_every = flush_every, layer_cost_every
        self.min_part_s, self._last_part = min_part_s, time.perf_counter()
        self.injections = [i for i in (injections or []) if i.rank == rank]
        self._meta_fn = meta_fn
        self.metrics = MetricLog(run_id, rank, device, metrics_every, self.injections,
                                 enabled=record)  # device_metrics rows
        self.timer = timer
        self.timing = "host" if timer is None else "device"
        self.capture = False  # record ops now (between begin_step and end_step)
        self._resolved = 0  # rows before this index hold times, not events (device timing)
        self._delay: DeviceDelay | None = None
        if timer is not None and self.injections:
            from bubblecast.runtime.device_timing import DeviceDelay

            self._delay = DeviceDelay(timer)
        # perf_counter -> seconds since the origin on this host's clock (+ offset to rank 0's)
        self._offset = clocks.wall_clock() - time.perf_counter() - origin_wall
        self.clock_group, self.clock_every = clock_group, clock_every if clock else 0
        self.clock_estimates = [clock] if clock is not None else []
        self._segments = [(clock.step if clock else 0, clock.offset_s if clock else 0.0)]
        self._rows: list[tuple] = []
        self._kept: list[tuple] = []  # all rows, when there is no events_dir
        self._step = 0
        self._stretch = 1.0
        self._overslept = 0.0  # host-clock stretch: what the sleeps so far overshot
        self._chunk_layers: dict[int, int] = {}
        self._plain: Work = (0, -1.0, -1)  # (tokens, tokens_sq, documents) of any micro-batch
        self._work: Sequence[Work] = ()  # per micro-batch, when the step's documents are known
        self._since_flush = 0
        self.layer_costs: list[dict[str, Any]] = []
        self._layer_modules: dict[int, dict[int, Any]] = {}
        self._hooks: list[Any] = []
        self._step_hooks: list[StepHook] = []
        self._fwd_times: dict[int, float] = {}
        self._fwd_marks: dict[int, tuple[Any, Any]] = {}
        self._saved: list[tuple[Any, dict[str, Any]]] = []  # what _wrap replaced
        self._sampling_chunk: int | None = None
        self._writer: PartWriter | None = None
        if self.record and self.events_dir is not None:
            self._writer = PartWriter(self.events_dir, rank, run_id, self._arrays)

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

    def detach(self) -> None:
        """Give the wrapped stages their own methods back (attach wraps them again)."""
        for stage, saved in self._saved:
            for name, fn in saved.items():
                if fn is _MISSING:
                    stage.__dict__.pop(name, None)
                else:
                    setattr(stage, name, fn)
        self._saved.clear()

    def _wrap(self, stage: Any, chunk: int) -> None:
        perf, done = time.perf_counter, self._op_done
        if self.timer is not None:
            perf, done = self.timer.mark, self._op_done_device
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

        names = ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk")
        self._saved.append((stage, {n: vars(stage).get(n, _MISSING) for n in names}))
        stage.forward_one_chunk = forward_one_chunk
        stage.backward_one_chunk = backward_one_chunk
        stage.backward_weight_one_chunk = backward_weight_one_chunk

    def _op_done(self, op: int, chunk: int, mb: int, t0: float) -> None:
        t1 = time.perf_counter()
        if not self.capture:
            return
        if self._stretch != 1.0:
            t1 = self._sleep_stretch(t1 - t0, t1)
        if self.record:
            work = self._work[mb] if mb < len(self._work) else self._plain
            self._rows.append((self._step, chunk, mb, op, t0, t1 - t0,
                               self._chunk_layers.get(chunk, 0), *work))

    def _sleep_stretch(self, took: float, now: float) -> float:
        """Sleep an op's emulated extra time, ``(stretch - 1) x took``; the end time.

        A sleeping process wakes late (timer slack; on a busy host it waits for its core), so
        what each sleep overshoots is taken off the next op's sleep: the mean stretch is the
        asked factor, not the factor plus the wake-up latency. The carried overshoot is
        capped at :data:`MAX_OVERSLEPT_S` (a long preemption does not erase a whole run's
        slowdown) and dropped when the stretch ends."""
        want = (self._stretch - 1.0) * took
        nap = want - self._overslept
        if nap > 0:
            time.sleep(nap)
        end = time.perf_counter()
        self._overslept = min(MAX_OVERSLEPT_S, max(0.0, self._overslept + (end - now) - want))
        return end

    def _op_done_device(self, op: int, chunk: int, mb: int, start: Any) -> None:
        if not self.capture:
            return
        if self._stretch != 1.0 and self._delay is not None:
            self._delay.stretch(start, (chunk, op), self._stretch)
        assert self.timer is not None
        end = self.timer.mark()
        if self.record:
            work = self._work[mb] if mb < len(self._work) else self._plain
            self._rows.append((self._step, chunk, mb, op, start, end,
                               self._chunk_layers.get(chunk, 0), *work))

    def _resolve(self) -> None:
        """Device timing: turn the buffered rows' event pairs into times (waits for them)."""
        if self.timer is None or self._resolved >= len(self._rows):
            return
        if self._delay is not None:
            self._delay.refresh(block=True)  # reads op start events before they are reused
        rows, first = self._rows, self._resolved
        todo = [i for i in range(first, len(rows)) if not isinstance(rows[i][4], float)]
        spans = self.timer.resolve([(rows[i][4], rows[i][5]) for i in todo])
        for i, (t0, dur) in zip(todo, spans, strict=True):
            rows[i] = (*rows[i][:4], t0, dur, *rows[i][6:])
        self._resolved = len(rows)

    # -- per step -----------------------------------------------------------------------
    def begin_step(self, step: int, tokens_per_microbatch: int,
                   work: Sequence[Work] = ()) -> None:
        """Ops are step ``step`` from now, with ``tokens_per_microbatch`` (-1: unknown) or
        ``work[m]``: micro-batch m's (tokens, tokens_sq, documents) (``parts.document_work``)."""
        if self.clock_every and step % self.clock_every == 0 and step != self._segments[-1][0]:
            self.reestimate_clock(step)  # collective: every rank begins this step
        self._step, self.capture = step, True
        self._plain, self._work = (tokens_per_microbatch, -1.0, -1), tuple(work)
        self._stretch = multiplier(self.injections, self.rank, step) if self.injections else 1.0
        if self._stretch == 1.0:
            self._overslept = 0.0
        self.metrics.begin_step(step)
        if self.record and self.layer_cost_every and step % self.layer_cost_every == 0:
            self._start_sampling()

    def reestimate_clock(self, step: int) -> clocks.ClockEstimate:
        """Collective (clock group): a new offset against rank 0 for the rows from ``step``."""
        estimate = clocks.estimate_offsets(self.clock_group, step=step)
        self.clock_estimates.append(estimate)
        self._segments.append((step, estimate.offset_s))
        return estimate

    def announce_tokens(self, step: int, tokens_per_microbatch: float) -> None:
        """Known-future workload (a ``tokens`` device metric): call for the next K steps."""
        self.metrics.announce_tokens(step, tokens_per_microbatch)

    def record_optimizer(self, t0: float, t1: float) -> None:
        """An ``OPTIMIZER`` row of the current step, from host ``perf_counter`` times."""
        if self.record:
            self._rows.append((self._step, 0, -1, _OPT, t0, t1 - t0,
                               sum(self._chunk_layers.values()), *self._optimizer_work()))

    def optimizer_start(self) -> Any:
        """A start mark for :meth:`optimizer_done`, on this recorder's clock."""
        return time.perf_counter() if self.timer is None else self.timer.mark()

    def optimizer_done(self, start: Any) -> None:
        """An ``OPTIMIZER`` row of the current step, from ``start`` to now."""
        if self.timer is None:
            self.record_optimizer(start, time.perf_counter())
        elif self.record:
            self._rows.append((self._step, 0, -1, _OPT, start, self.timer.mark(),
                               sum(self._chunk_layers.values()), *self._optimizer_work()))

    def _optimizer_work(self) -> Work:  # none; documents unknown on steps without
        return (0, 0.0, 0) if self._work else (0, -1.0, -1)

    def add_step_hook(self, fn: StepHook) -> None:
        """Call ``fn(view)`` at the end of every recorded step, before the rows can be flushed.

        Needs a recording recorder (``record=True``): there are no rows otherwise.
        """
        if not self.record:
            raise ValueError("step hooks need a recording recorder (record=True)")
        self._step_hooks.append(fn)

    def end_step(self) -> None:
        self.capture = False
        if self._delay is not None:
            self._delay.refresh()
        if self._hooks or self._step_hooks:
            self._resolve()  # device timing: one wait for the step's rows
        if self._hooks:
            self._stop_sampling()
        if not self.record:
            return
        if self._step_hooks:
            view = StepView(self._rows, self._step)
            for fn in self._step_hooks:
                fn(view)
        self._since_flush += 1
        if self._since_flush >= self.flush_every and (
                not self.min_part_s or time.perf_counter() - self._last_part >= self.min_part_s):
            self.flush()

    def discard(self) -> None:
        """Drop the buffered rows unwritten (overhead benchmarks that record forever)."""
        self._resolve()  # device timing: their events go back to the pool
        self._rows.clear()
        self._resolved = 0

    # -- per-layer cost samples ---------------------------------------------------------
    def _start_sampling(self) -> None:
        self._sampling_chunk = -1
        self._fwd_times.clear()
        self._fwd_marks.clear()
        mark = time.perf_counter if self.timer is None else self.timer.mark
        starts: dict[int, Any] = {}
        for chunk, mods in self._layer_modules.items():
            for index, module in mods.items():
                def pre(_m: Any, _a: Any, i: int = index, c: int = chunk) -> None:
                    if self._sampling_chunk == c and i not in self._fwd_marks:
                        starts[i] = mark()

                def post(_m: Any, _a: Any, _o: Any, i: int = index, c: int = chunk) -> None:
                    if self._sampling_chunk == c and i in starts and i not in self._fwd_marks:
                        self._fwd_marks[i] = (starts[i], mark())

                self._hooks += [module.register_forward_pre_hook(pre),
                                module.register_forward_hook(post)]

    def _stop_sampling(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()
        self._sampling_chunk = None
        for index, (a, b) in self._fwd_marks.items():
            self._fwd_times[index] = b - a if self.timer is None else self.timer.elapsed(a, b)
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
    def _arrays(self, rows: list[tuple]) -> Any:
        shift = clocks.offsets_by_step(tuple(self._segments), rows)  # read by the writer thread
        return event_arrays(rows, _OPS, run_id=self.run_id, rank=self.rank, stage=self.stage,
                            replica=self.replica, host=self.host, device=self.device,
                            offset=self._offset + shift)

    def frame(self) -> Any:
        """Rows kept in memory (``events_dir`` None) plus unflushed rows, as a DataFrame."""
        import pandas as pd

        self._resolve()
        rows = self._kept + self._rows
        return pd.DataFrame(event_columns(self._arrays(rows)) if rows else {})

    def flush(self) -> None:
        """Hand the buffered rows to the writer (or keep them, without an events_dir)."""
        self._resolve()
        rows, self._rows, self._since_flush, self._resolved = self._rows, [], 0, 0
        self._last_part = time.perf_counter()
        if not rows:
            return
        if self._writer is None:
            self._kept.extend(rows)
            return
        self._writer.submit(rows, self._meta_fn())

    def wait_written(self) -> None:
        """Block until the parts handed to the writer so far are on disk (an overhead
        benchmark charges the writer's work to the recorded block this way)."""
        if self._writer is not None:
            self._writer.wait()

    @property
    def part_cpu_s(self) -> list[float]:
        """The writer thread's CPU seconds for each part written so far."""
        return list(self._writer.cpu_s) if self._writer is not None else []

    def close(self) -> None:
        """Flush what is left and wait for the writer to finish."""
        if self.record:
            self.flush()
            self.metrics.close(self.events_dir)
        if self._writer is not None:
            self._writer.close()


__all__ = ["Recorder", "StepHook", "StepView", "merge_parts"]
