"""Record your own ``torch.distributed.pipelining`` training loop: :func:`record`.

::

    with bubblecast.record(schedule, out="telemetry/", run_id="my-run", optimizer=opt):
        for batch in data:
            schedule.step(...)          # one recorded step
            opt.step(); opt.zero_grad()

Every rank wraps the stages its schedule holds (any torch schedule class: ``Schedule1F1B``,
``ScheduleGPipe``, ``ScheduleInterleaved1F1B``, ``ScheduleLoopedBFS``,
``ScheduleInterleavedZeroBubble``, ``ScheduleZBVZeroBubble``, ``ScheduleDualPipeV``) with the
same :class:`~bubblecast.runtime.rank_recorder.Recorder` the built-in trainer uses, and writes
validated SPEC ``events`` parts to ``out/run_id=<run_id>/rank<r>-<k>.parquet`` from a
background thread (atomic writes). Each ``schedule.step(...)`` call is one step; the step
ends when the next one begins, at :meth:`Recording.end_step`, or when the block exits
(``schedule.eval(...)`` and stage calls outside ``schedule.step`` are not recorded). The
optimizer's ``step`` (when given) is timed through its step hooks as the ``OPTIMIZER`` op.

Nothing in the training math changes: the wrappers call the stage methods with the same
arguments and return their results; only timers run around them. On CUDA stages the ops are
timed with CUDA events on the stage's current stream (``timing="device"``), elsewhere with
``perf_counter`` (``timing="host"``); the run metadata says which (``timing``).

Entering the block is a collective over the pipeline group (one ``all_gather_object``: rank
0's clock origin and run id, each stage's layer count; then a few round trips per rank with
rank 0 measuring its clock offset, so hosts whose clocks differ record on rank 0's clock);
exiting is local.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from bubblecast.errors import BubblecastError
from bubblecast.runtime.clock import ClockEstimate, estimate_offsets, wall_clock
from bubblecast.runtime.inject import Injection, parse_inject
from bubblecast.runtime.parts import Work, document_work
from bubblecast.runtime.rank_recorder import Recorder
from bubblecast.telemetry.schema import RunMeta

_MISSING = object()
#: ``chunk -> {global layer index: module}`` of the layers each local stage runs.
ChunkLayers = dict[int, dict[int, Any]]


@dataclass(frozen=True)
class RecordOptions:
    """What :func:`record` does besides the schedule; validated when made."""

    flush_every: int = 50
    min_part_s: float = 5.0
    layer_cost_every: int = 0
    timing: str = "auto"
    replica: int = 0
    replicas: int = 1
    tokens: int | None = None

    def __post_init__(self) -> None:
        if self.flush_every < 1:
            raise BubblecastError(f"record: flush_every must be >= 1, got {self.flush_every}")
        if not self.min_part_s >= 0:
            raise BubblecastError(f"record: min_part_s must be >= 0, got {self.min_part_s}")
        if self.layer_cost_every < 0:
            raise BubblecastError(f"record: layer_cost_every must be >= 0, got "
                                  f"{self.layer_cost_every}")
        if self.timing not in ("auto", "host", "device"):
            raise BubblecastError(f"record: timing must be auto, host or device, got "
                                  f"{self.timing!r}")
        if not 0 <= self.replica < self.replicas:
            raise BubblecastError(f"record: replica {self.replica} is outside 0..replicas-1 "
                                  f"(replicas={self.replicas})")
        if self.tokens is not None and self.tokens < 0:
            raise BubblecastError(f"record: tokens must be >= 0, got {self.tokens}")


def stages_of(schedule: Any) -> list[Any]:
    """The pipeline stages a torch schedule holds, by stage index (chunk order)."""
    stages = getattr(schedule, "_stages", None)
    if stages is None:
        stage = getattr(schedule, "_stage", None)
        stages = [stage] if stage is not None else None
    if not stages or not all(hasattr(s, "forward_one_chunk") for s in stages):
        raise BubblecastError(f"record: expected a torch.distributed.pipelining schedule "
                              f"holding PipelineStage objects, got {type(schedule).__name__}")
    return sorted(stages, key=lambda s: s.stage_index)


def schedule_name(schedule: Any, chunks: int) -> str:
    """bubblecast's name for a torch schedule (its class or nearest known base class)."""
    from bubblecast.sim.schedules import SCHEDULES

    for cls in type(schedule).__mro__:
        rows = [s for s in SCHEDULES.values() if s.torch_class == cls.__name__]
        if rows:
            fits = [s for s in rows if s.multi_chunk == (chunks > 1)] or rows
            return fits[0].name
    return "unknown"


class Recording:
    """One rank's recording of a schedule's steps (what :func:`record` returns).

    Attributes: ``recorder`` (the :class:`Recorder`: step hooks, per-layer cost samples),
    ``step`` (the number the next step gets), ``tokens`` (tokens per micro-batch written on
    each op, None = unknown; settable between steps; or per micro-batch: :meth:`set_documents`),
    ``run_id``, ``events_dir``, ``origin_wall`` (the epoch time event times count from)."""

    def __init__(self, recorder: Recorder, *, first_step: int = 0, tokens: int | None = None,
                 events_dir: Path | None = None, origin_wall: float = 0.0) -> None:
        self.recorder, self.step, self.tokens = recorder, first_step, tokens
        self.run_id, self.events_dir, self.origin_wall = recorder.run_id, events_dir, origin_wall
        self._open = self._closed = False
        self._hooks: list[Any] = []
        self._schedule: Any = None
        self._optimizer: Any = None
        self._schedule_step: Any = None  # what the schedule's own ``step`` attribute was
        self._opt_start: Any = None
        self._documents: list[Work] = []  # the next step's, from set_documents

    @property
    def timing(self) -> str:
        """``host`` or ``device``: the clock the durations come from."""
        return self.recorder.timing

    @property
    def layer_costs(self) -> list[dict[str, Any]]:
        """This rank's per-layer cost samples so far (``layer_cost_every`` > 0)."""
        return self.recorder.layer_costs

    def attach(self, schedule: Any, *, layers: ChunkLayers | None = None,
               optimizer: Any = None) -> None:
        """Record ``schedule`` from its next step on (a new schedule after a plan change, or
        the same one after :meth:`detach`); what was attached before is detached first.
        ``optimizer``: default the one attached before."""
        self.detach()
        stages = stages_of(schedule)
        self.recorder.attach(stages, layers if layers is not None else local_layers(stages))
        self._schedule, self._schedule_step = schedule, vars(schedule).get("step", _MISSING)
        run = schedule.step

        def step(*args: Any, **kwargs: Any) -> Any:
            if self._closed or _evaluating(schedule):
                return run(*args, **kwargs)
            self._begin()
            try:
                return run(*args, **kwargs)
            finally:
                self.recorder.capture = False  # ops outside schedule.step are not recorded

        schedule.step = step
        optimizer = self._optimizer = optimizer if optimizer is not None else self._optimizer
        if optimizer is not None:
            self._hooks = [optimizer.register_step_pre_hook(self._optimizer_pre),
                           optimizer.register_step_post_hook(self._optimizer_post)]

    def detach(self) -> None:
        """Stop wrapping: the schedule, its stages and the optimizer get their own methods
        back (a step still open stays open; :meth:`attach` resumes)."""
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()
        self.recorder.detach()
        if self._schedule is not None:
            if self._schedule_step is _MISSING:
                self._schedule.__dict__.pop("step", None)
            else:
                self._schedule.step = self._schedule_step
            self._schedule = self._schedule_step = None

    def set_documents(self, lengths: Sequence[Sequence[int]]) -> None:
        """Call before each ``schedule.step``: ``lengths[m]``, the lengths of the documents
        packed into micro-batch m of the next step (one list per micro-batch), give its ops
        ``tokens`` (sum; in place of :attr:`tokens`), ``tokens_sq`` (sum of squares) and
        ``documents`` (count); null on steps without. Bad lengths raise BubblecastError."""
        microbatches = getattr(self._schedule, "_n_microbatches", None)
        self._documents = document_work(lengths, microbatches, "set_documents: lengths")

    def _begin(self) -> None:
        if self._open:
            self.end_step()
        tokens = -1 if self.tokens is None else self.tokens
        self.recorder.begin_step(self.step, tokens, self._documents)
        self._documents = []
        self._open = True

    def _optimizer_pre(self, *_: Any) -> None:
        self._opt_start = self.recorder.optimizer_start() if self._open else None

    def _optimizer_post(self, *_: Any) -> None:
        if self._opt_start is not None and self._open:
            self.recorder.optimizer_done(self._opt_start)
        self._opt_start = None

    def end_step(self) -> None:
        """End the current step now (else it ends when the next begins, or at close)."""
        if self._open:
            self._open = False
            self.recorder.end_step()
            self.step += 1

    @property
    def clock(self) -> list[ClockEstimate]:
        """This rank's clock-offset estimates against rank 0, oldest first (none when not
        recording)."""
        return list(self.recorder.clock_estimates)

    def frame(self) -> Any:
        """The rows kept in memory (``out=None``) as a DataFrame."""
        return self.recorder.frame()

    def announce_tokens(self, step: int, tokens_per_microbatch: float) -> None:
        """Hook for the data loader: ``step``'s tokens per micro-batch, known before it runs
        (call it for the next K steps); written as the known-future ``tokens`` device
        metric, a covariate ``dataset --covariates auto`` reads up to the horizon."""
        self.recorder.announce_tokens(step, tokens_per_microbatch)

    def metrics(self) -> Any:
        """This rank's device metrics so far (samples, emulated temperatures, tokens)."""
        return self.recorder.metrics.frame()

    def close(self) -> None:
        """End the step, write what is left, give every method back (local, not collective)."""
        if self._closed:
            return
        self.end_step()
        self._closed = True
        self.detach()
        self.recorder.close()

    def __enter__(self) -> Recording:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            self.close()
        except Exception:
            if exc is None:
                raise  # never hide the training loop's own error behind a telemetry one


def _evaluating(schedule: Any) -> bool:
    """Whether ``schedule.step`` runs for ``schedule.eval`` (forward only: not a step)."""
    return getattr(schedule, "_loss_fn", None) is not None and \
        not getattr(schedule, "_has_backward", True)


def local_layers(stages: list[Any], first: dict[int, int] | None = None) -> ChunkLayers:
    """Each stage's top-level submodules as its layers, numbered from ``first[stage_index]``
    (0 when unknown); a stage without children is one layer."""
    out: ChunkLayers = {}
    for chunk, stage in enumerate(stages):
        mods = list(stage.submod.children()) or [stage.submod]
        base = (first or {}).get(stage.stage_index, 0)
        out[chunk] = {base + i: m for i, m in enumerate(mods)}
    return out


def _gather(stages: list[Any], run_id: str | None, events_dir: Callable[[str], Path | None],
            origin_wall: float | None) -> tuple[float, str, dict[int, int]]:
    """Collective over the pipeline group: rank 0's clock origin and run id, each stage's layer
    count; raises on every rank when any rank's output already holds parts."""
    import torch.distributed as dist

    group = stages[0].group
    counts = {s.stage_index: len(list(s.submod.children())) or 1 for s in stages}
    rid = run_id or time.strftime("run-%Y%m%d-%H%M%S")
    rank = dist.get_rank()
    clash = None
    where = events_dir(run_id) if run_id is not None else None
    if where is not None and any(where.glob(f"rank{rank:04d}-*.parquet")):
        clash = f"{where}: already holds rank {rank}'s events of run '{run_id}' (choose " \
                f"another run_id or out, or remove them)"
    boxes: list[Any] = [None] * stages[0].group_size
    origin = wall_clock() if origin_wall is None else float(origin_wall)
    dist.all_gather_object(boxes, (origin, rid, counts, clash), group=group)
    errors = [b[3] for b in boxes if b[3]]
    if errors:
        raise BubblecastError(errors[0])
    every: dict[int, int] = {}
    for box in boxes:
        every.update(box[2])
    return float(boxes[0][0]), str(boxes[0][1]), every


def _timer(stages: list[Any], timing: str) -> Any:
    device = getattr(stages[0], "device", None)
    cuda = device is not None and getattr(device, "type", str(device)) == "cuda"
    if timing == "device" and not cuda:
        raise BubblecastError(f"record: timing='device' needs CUDA stages, this one runs on "
                              f"{device}")
    if timing == "host" or not cuda:
        return None
    from bubblecast.runtime.device_timing import EventTimer

    return EventTimer.for_device(device)


def record(schedule: Any, out: str | Path | None = "telemetry/", run_id: str | None = None,
           *, optimizer: Any = None, tokens: int | None = None, flush_every: int = 50,
           min_part_s: float = 5.0, layer_cost_every: int = 0,
           inject: str | list[Injection] | None = None, timing: str = "auto",
           replica: int = 0, replicas: int = 1, first_step: int = 0,
           meta: Callable[[], RunMeta] | None = None, layers: ChunkLayers | None = None,
           enabled: bool = True, parts_dir: str | Path | None = None,
           origin_wall: float | None = None, metrics_every: int = 0,
           clock_every: int = 0) -> Recording:
    """Record the steps of ``schedule`` (a ``torch.distributed.pipelining`` schedule).

    ``out``: directory for the events parts (None: keep them in memory, :meth:`Recording.frame`);
    ``run_id``: the run's name (default: rank 0's start time); ``optimizer``: timed as the
    ``OPTIMIZER`` op; ``tokens``: tokens per micro-batch (the ``tokens`` column; packed
    documents per step: :meth:`Recording.set_documents`);
    ``flush_every``/``min_part_s``: a part every that many steps, at most one per that many
    seconds (a part's CPU cost in the writer thread is mostly fixed); ``inject``:
    emulated slowdowns (``--inject`` grammar); ``timing``: ``auto`` (device on CUDA), ``host``
    or ``device``; ``replica``/``replicas``: this pipeline's data-parallel index and count.
    ``meta``, ``layers``, ``first_step``, ``enabled``, ``parts_dir`` (write the parts exactly
    there, a folder the caller manages) and ``origin_wall`` (rank 0's value is the clock
    origin, default its current time) serve callers that know their plan (the built-in
    trainer). ``metrics_every``: sample device metrics (NVML on NVIDIA GPUs, else the OS's CPU
    temperature, clock and load) every that many steps into ``rank<r>.metrics`` (0: never;
    emulated temperatures and announced tokens are written regardless). ``clock_every``:
    re-estimate this rank's clock offset against rank 0 every that many steps (0: only at
    start; see :mod:`bubblecast.runtime.clock`; :attr:`Recording.clock` holds the estimates).
    Use as a context manager, or call :meth:`Recording.close`.
    """
    opts = RecordOptions(flush_every, min_part_s, layer_cost_every, timing, replica, replicas,
                         tokens)
    if clock_every < 0:
        raise BubblecastError(f"record: clock_every must be >= 0, got {clock_every}")
    stages = stages_of(schedule)
    root = None if out is None else Path(out)
    if root is not None and root.exists() and not root.is_dir():
        raise BubblecastError(f"{root}: record output must be a directory")

    def parts(rid: str) -> Path | None:
        if parts_dir is not None:
            return Path(parts_dir)
        return None if root is None else root / f"run_id={rid}"

    import torch.distributed as dist

    if not dist.is_initialized():
        raise BubblecastError("record: torch.distributed is not initialised (call it on every "
                              "rank of the pipeline, after init_process_group)")
    injections = parse_inject(inject) if isinstance(inject, str) else list(inject or [])
    timer = _timer(stages, opts.timing)
    check = (lambda rid: None) if parts_dir is not None else parts  # its caller manages it
    origin, rid, counts = _gather(stages, run_id, check, origin_wall)
    group = stages[0].group
    estimate = estimate_offsets(group, step=first_step) if enabled else None
    if meta is None:
        first = {i: sum(counts[j] for j in counts if j < i) for i in counts}
        layers = layers if layers is not None else local_layers(stages, first)
        meta = _default_meta(schedule, stages, counts, opts, timer, inject, injections)
    recorder = Recorder(
        run_id=rid, rank=dist.get_rank(), stage=stages[0].group_rank, origin_wall=origin,
        meta_fn=meta, events_dir=None if parts(rid) is None else str(parts(rid)),
        flush_every=opts.flush_every, min_part_s=opts.min_part_s,
        layer_cost_every=opts.layer_cost_every, record=enabled,
        injections=injections, replica=opts.replica, device=str(stages[0].device),
        timer=timer, metrics_every=metrics_every, clock=estimate, clock_group=group,
        clock_every=clock_every)
    recording = Recording(recorder, first_step=first_step, tokens=opts.tokens,
                          events_dir=parts(rid), origin_wall=origin)
    recording.attach(schedule, layers=layers, optimizer=optimizer)
    return recording


def _default_meta(schedule: Any, stages: list[Any], counts: dict[int, int],
                  opts: RecordOptions, timer: Any, inject: str | list[Injection] | None,
                  injections: list[Injection]) -> Callable[[], RunMeta]:
    """Run metadata from what the schedule holds (fixed for the run)."""
    import torch

    pp = int(stages[0].group_size)
    chunks = len(stages)
    partition = [counts[i] for i in sorted(counts)]
    if sorted(counts) != list(range(len(counts))) or len(partition) != pp * chunks:
        partition = None  # type: ignore[assignment]
    extra: dict[str, Any] = {"torch_schedule": type(schedule).__name__,
                             "timing": "host" if timer is None else "device",
                             "torch": torch.__version__,
                             "recorded_with": "bubblecast.record"}
    if injections:
        extra["emulated_slowdown"] = {"spec": inject if isinstance(inject, str) else None,
                                      "injections": [i.to_json() for i in injections]}
    run = RunMeta(schedule=schedule_name(schedule, chunks), stages=pp,
                  microbatches=int(schedule._n_microbatches), chunks=chunks,
                  replicas=opts.replicas, partition=partition, source="bubblecast-record",
                  extra=extra)
    return lambda: run
