"""The pipeline trainer: one process per rank, torch.distributed.pipelining underneath.

A :class:`Trainer` owns the layers its rank holds under the current :class:`Plan`, an
optimizer over them, the ``PipelineStage`` objects and the schedule. ``train_step`` runs one
optimizer step; ``apply(action)`` changes the plan at a step boundary (layers migrate with
their optimizer state, two-phase: see :mod:`bubblecast.runtime.transition`); ``run`` loops
and offers a controller hook. Construct it after ``torch.distributed`` is initialised (e.g.
by :func:`init_distributed` under torchrun) with a world size equal to the stage count, or
``replicas x stages`` with ``config.replicas`` data-parallel copies of the pipeline
(:mod:`bubblecast.runtime.replicas`: gradients all-reduced between them after each step). The
packed model (``--model packed``) trains on packed documents
(:mod:`bubblecast.runtime.packed_step`): each step's plan may give replicas different numbers
of micro-batches, each count running its own schedule object.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from bubblecast.errors import BubblecastError
from bubblecast.policy.actions import Action, action_from_json, action_to_json
from bubblecast.runtime import checkpoint
from bubblecast.runtime.migration import FaultHook, install_state
from bubblecast.runtime.networks import LayerModel, make_optimizer
from bubblecast.runtime.plan import Plan
from bubblecast.runtime.rank_recorder import merge_parts
from bubblecast.runtime.record import ChunkLayers
from bubblecast.runtime.record import record as record_schedule
from bubblecast.runtime.train_config import TrainConfig
from bubblecast.runtime.transition import apply_action
from bubblecast.telemetry.schema import RunMeta

#: Device metrics sampled every this many steps (``rank<r>.metrics``, merged into OUT.metrics).
METRICS_EVERY = 10
#: Steps ahead the trainer's data loader announces tokens per micro-batch (known-future).
ANNOUNCE_AHEAD = 10
#: Steps between clock-offset estimates against rank 0 (besides the one at start).
CLOCK_EVERY = 100

#: ``on_step_end(trainer, loss)`` runs on rank 0 and returns an action to broadcast, or None.
StepCallback = Callable[["Trainer", "float | None"], "Action | dict | None"]


def init_distributed(backend: str = "auto") -> str:
    """Initialise the default process group from torchrun's environment; the backend used.

    ``BUBBLECAST_DIST_TIMEOUT_S`` (seconds) bounds how long a collective waits for a peer. A
    gloo (CPU) rank keeps its freed host memory for reuse, as a GPU rank's caching allocator
    does (:mod:`bubblecast.runtime.host_allocator`; ``BUBBLECAST_HOST_MALLOC=system`` opts out).
    """
    if not dist.is_initialized():
        from datetime import timedelta

        timeout = os.environ.get("BUBBLECAST_DIST_TIMEOUT_S")
        kwargs = {"timeout": timedelta(seconds=float(timeout))} if timeout else {}
        if backend == "auto":
            local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
            backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= local \
                else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        if backend == "gloo":
            from bubblecast.runtime.host_allocator import keep_freed_memory

            keep_freed_memory()
        dist.init_process_group(backend=backend, **kwargs)
    return dist.get_backend()


def _device(group: Any) -> torch.device:
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def broadcast_action(action: Action | dict | None, src: int = 0,
                     group: Any = None) -> Action | None:
    """Collective: every rank gets ``src``'s action (JSON form on the wire) or None."""
    if isinstance(action, dict):
        action = action_from_json(action)
    box = [action_to_json(action) if action is not None else None]
    dist.broadcast_object_list(box, src=src, group=group, device=_device(group))
    return action_from_json(box[0]) if box[0] is not None else None


def _label_for_profiler(stage: Any) -> None:
    """Wrap a stage's F and B in ``PP:<stage><op><mb>`` record_function labels, as the
    runtime schedules do, so Kineto traces of GPipe and 1F1B runs are importable too."""
    from torch.profiler import record_function

    index = stage.stage_index
    fwd, bwd = stage.forward_one_chunk, stage.backward_one_chunk

    def forward_one_chunk(mb: int, *args: Any, **kwargs: Any) -> Any:
        with record_function(f"PP:{index}F{mb}"):
            return fwd(mb, *args, **kwargs)

    def backward_one_chunk(mb: int, *args: Any, **kwargs: Any) -> Any:
        with record_function(f"PP:{index}B{mb}"):
            return bwd(mb, *args, **kwargs)

    stage.forward_one_chunk, stage.backward_one_chunk = forward_one_chunk, backward_one_chunk


class Trainer:
    """Pipeline-parallel training on this rank; see the module docstring.

    ``model``: the layers, data and loss (default: the built-in model of ``config.model``;
    a custom one must have ``config.model.layers`` layers). ``resume``: a checkpoint
    directory (any partition) to start from. ``origin_wall``: the wall-clock time (epoch
    seconds) event times count from (default: now; a resumed run passes its first attempt's,
    so that both attempts' events share one clock). ``record``: record telemetry. ``fault_hook``
    and ``test_drop_optimizer_state`` exist for tests only.
    """

    def __init__(self, config: TrainConfig, *, model: LayerModel | None = None,
                 resume: str | None = None, record: bool = True, group: Any = None,
                 device: torch.device | None = None, origin_wall: float | None = None) -> None:
        if not dist.is_initialized():
            raise BubblecastError("Trainer: torch.distributed is not initialised "
                                  "(launch with torchrun or call init_distributed())")
        from bubblecast.runtime.replicas import Layout, make_groups

        self.layout = Layout(config.stages, config.replicas)
        self.global_rank = dist.get_rank()
        if config.replicas > 1:
            if dist.get_world_size() != self.layout.world:
                raise BubblecastError(f"--replicas: {config.replicas} replicas x {config.stages} "
                                      f"stages need {self.layout.world} processes, this job "
                                      f"has {dist.get_world_size()}")
            group, self.dp_group = make_groups(self.layout)
            #: the group of collectives over the whole job (telemetry at close)
            self.job_group: Any = None
        else:
            self.dp_group, self.job_group = None, group
        self.replica = self.layout.replica_of(self.global_rank) if config.replicas > 1 else 0
        self.config, self.group = config, group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self.plan: Plan = config.plan
        if self.world != self.plan.stages:
            raise BubblecastError(f"--stages: {self.plan.stages} stages need {self.plan.stages} "
                                  f"processes, this job has {self.world}")
        self.device = device or _device(group)
        if config.replicas > 1:  # every replica's events on global rank 0's clock origin
            from bubblecast.runtime.replicas import shared_origin

            origin_wall = shared_origin(origin_wall, _device(None))
        self.spec = config.model
        self.model = model or LayerModel.example(self.spec, config.seed)
        if self.model.layers != self.spec.layers:
            raise BubblecastError(f"--layers: the model has {self.model.layers} layers, the "
                                  f"config says {self.spec.layers}")
        self._loss = self.model.loss
        #: the packed model's steps (documents, plans, a schedule per micro-batch count)
        self.packed: Any = None
        if self.model.packed:
            from bubblecast.runtime.packed_step import PackedSteps

            self.packed = PackedSteps(self)
        self.step = 0
        self._announced_from: int | None = None
        self.losses: dict[int, float] = {}
        self.actions: list[dict[str, Any]] = []
        self.fault_hook: FaultHook | None = None
        self.test_drop_optimizer_state = False
        self.max_microbatches, self.max_chunks = self.plan.microbatches, self.plan.chunks
        self.initial_plan = self.plan
        mine = self.plan.layers_of(self.rank)
        if resume is None:
            self.layers = {i: self.model.build(i).to(self.device) for i in mine}
            self.optimizer = self.new_optimizer(self.layers)
        else:
            self._load(resume, mine)
        self.stages, self.schedule = self.build_runtime(self.plan, self.layers)
        self._label()
        # the public record API, told the plan: parts in events_dir, the trainer's metadata
        self.recording = record_schedule(
            self.schedule, out=None, parts_dir=config.events_dir, run_id=config.run_id,
            optimizer=self.optimizer, flush_every=config.flush_every, min_part_s=0.0,
            layer_cost_every=config.layer_cost_every, inject=config.injections,
            first_step=self.step, meta=self.run_meta, layers=self.chunk_layers(),
            enabled=record, origin_wall=origin_wall, metrics_every=METRICS_EVERY,
            clock_every=CLOCK_EVERY, replica=self.replica, replicas=config.replicas)
        #: scheduled steps for run metadata ``calendar`` (e.g. ``{"checkpoint_every": N}``),
        #: set by whoever schedules them; known-future covariates of the dataset
        self.calendar: dict[str, int] = {}
        self.recorder = self.recording.recorder
        self.origin_wall = self.recording.origin_wall
        if self.packed is not None and config.planner != "static":  # planned live
            from bubblecast.runtime.live_plan import LivePlanner

            self.packed.planner = LivePlanner(self, config.planner, config.cost_model)

    # -- construction -------------------------------------------------------------------
    def new_optimizer(self, layers: dict[int, nn.Module]) -> torch.optim.Optimizer:
        params = [p for i in sorted(layers) for p in layers[i].parameters()]
        c = self.config
        return make_optimizer(c.optimizer, params, c.lr, c.momentum, c.weight_decay)

    def build_runtime(self, plan: Plan, layers: dict[int, nn.Module]) -> tuple[list[Any], Any]:
        """PipelineStage objects (chunk order) and the schedule for ``plan``; no communication."""
        from torch.distributed.pipelining import PipelineStage, schedules

        stages = [
            PipelineStage(self.model.stack([layers[i] for i in plan.layer_range(v)]), v,
                          plan.virtual_stages, self.device, group=self.group)
            for v in plan.vstages_of(self.rank)
        ]
        cls = getattr(schedules, plan.info.torch_class)
        if self.packed is not None:  # summed token losses over the global batch's tokens
            return stages, cls(stages if plan.info.multi else stages[0], plan.microbatches,
                               loss_fn=self.packed.loss, scale_grads=False)
        schedule = cls(stages if plan.info.multi else stages[0], plan.microbatches,
                       loss_fn=self._loss, scale_grads=True)
        return stages, schedule

    def _label(self) -> None:
        if self.config.profile_dir and not self.plan.info.multi:
            for stage in self.stages:
                _label_for_profiler(stage)

    def chunk_layers(self) -> ChunkLayers:
        """``chunk -> {global layer index: module}`` of this rank's stages (the recorder's)."""
        return {c: {i: self.layers[i] for i in self.plan.layer_range(v)}
                for c, v in enumerate(self.plan.vstages_of(self.rank))}

    def _load(self, path: str, mine: list[int]) -> None:
        from dataclasses import asdict

        meta = checkpoint.read_meta(path)
        if meta.get("model") != asdict(self.spec):
            raise BubblecastError(f"{path}: checkpoint model {meta.get('model')} differs from "
                                  f"this run's {asdict(self.spec)}")
        self.layers, states = {}, {}
        for i in mine:
            module_state, states[i] = checkpoint.load_layer(path, i)
            layer = self.model.make_empty(i).to(self.device)
            layer.load_state_dict(module_state)
            self.layers[i] = layer
        self.optimizer = self.new_optimizer(self.layers)
        for i, layer in self.layers.items():
            for pname, p in layer.named_parameters():
                install_state(self.optimizer, p, states[i].get(pname, {}))
        self.step = int(meta["step"])

    # -- training -----------------------------------------------------------------------
    def train_step(self) -> float | None:
        """One optimizer step; the mean micro-batch loss on the rank holding the last stage
        (with replicas: over the whole global batch, on every replica's last stage)."""
        if self.packed is not None:
            loss = self.packed.run(self.step)
            if loss is not None:
                self.losses[self.step] = loss
            self.step += 1
            return loss
        plan, step, c = self.plan, self.step, self.config
        vstages = plan.vstages_of(self.rank)
        first, last = 0 in vstages, plan.virtual_stages - 1 in vstages
        x, y = self.model.batch(step, c.batch_size)
        if c.replicas > 1:  # this replica's share of the global batch
            share = c.batch_size // c.replicas
            x, y = (t[self.replica * share:(self.replica + 1) * share] for t in (x, y))
        tokens = c.batch_size // c.replicas // plan.microbatches * self.model.tokens_per_sample
        self.recording.step, self.recording.tokens = step, tokens
        # the data loader knows the next batches: announce ANNOUNCE_AHEAD steps ahead
        fresh = self._announced_from is None
        self._announced_from = step if fresh else self._announced_from
        for ahead in range(0 if fresh else ANNOUNCE_AHEAD, ANNOUNCE_AHEAD + 1):
            self.recording.announce_tokens(step + ahead, tokens)
        losses: list[torch.Tensor] | None = [] if last else None
        args = (x.to(self.device),) if first else ()
        self.schedule.step(*args, target=y.to(self.device) if last else None, losses=losses,
                           return_outputs=False)  # one recorded step
        if self.dp_group is not None:  # the mean over replicas of their mean losses' grads
            from bubblecast.runtime.replicas import allreduce_grads

            allreduce_grads(self.parameters(), self.dp_group, divide=float(c.replicas))
        self.optimizer.step()  # the recording times it (OPTIMIZER)
        self.optimizer.zero_grad(set_to_none=True)
        self.recording.end_step()
        self.step += 1
        if losses is None:
            return None
        loss = sum(float(v.item()) for v in losses) / len(losses)
        if self.dp_group is not None:
            from bubblecast.runtime.replicas import allreduce_sum

            loss = allreduce_sum(loss, self.dp_group, _device(self.dp_group)) / c.replicas
        self.losses[step] = loss
        return loss

    def parameters(self) -> list[nn.Parameter]:
        """This rank's parameters, layer by layer (the optimizer's order)."""
        return [p for i in sorted(self.layers) for p in self.layers[i].parameters()]

    def run(self, steps: int, *, on_step_end: StepCallback | None = None,
            control_every: int = 0, progress: Callable[[int, float | None], None] | None = None
            ) -> None:
        """Train ``steps`` steps. Every ``control_every`` steps (0 = never; the same on every
        rank) rank 0 calls ``on_step_end``; its action is broadcast and applied by all ranks
        at that step boundary. ``progress(step, loss)`` is called locally after each step."""
        for _ in range(steps):
            loss = self.train_step()
            if progress is not None:
                progress(self.step, loss)
            if control_every and self.step % control_every == 0:
                action = on_step_end(self, loss) if (self.rank == 0 and on_step_end) else None
                action = broadcast_action(action, group=self.group)
                if action is not None:
                    self.apply(action)

    def apply(self, action: Action | dict) -> dict[str, Any]:
        """Apply an action at this step boundary (collective); its record (``ok``, timing)."""
        if self.packed is not None or self.config.replicas > 1:
            raise BubblecastError("actions: the packed model and replicated pipelines do not "
                                  "change their plan live (no repartition or micro-batch change)")
        if isinstance(action, dict):
            action = action_from_json(action)
        return apply_action(self, action)

    def commit(self, plan: Plan, layers: dict[int, nn.Module], optimizer: torch.optim.Optimizer,
               stages: list[Any], schedule: Any) -> None:
        """Switch to a new plan (called by the transition once every rank voted yes)."""
        self.plan, self.layers, self.optimizer = plan, layers, optimizer
        self.stages, self.schedule = stages, schedule
        self.max_microbatches = max(self.max_microbatches, plan.microbatches)
        self.max_chunks = max(self.max_chunks, plan.chunks)
        self._label()
        self.recording.attach(schedule, layers=self.chunk_layers(), optimizer=optimizer)

    # -- state, checkpoints, telemetry --------------------------------------------------
    def layer_state(self) -> dict[int, dict[str, torch.Tensor]]:
        """CPU copies of the module state of the layers this rank holds."""
        return {i: {k: v.detach().cpu().clone() for k, v in layer.state_dict().items()}
                for i, layer in self.layers.items()}

    def save_checkpoint(self, path: str) -> None:
        """Collective: write a partition-independent checkpoint (resume with ``resume=``)."""
        from dataclasses import asdict

        meta = {"step": self.step, "model": asdict(self.spec), "seed": self.config.seed,
                "optimizer": self.config.optimizer, "partition": list(self.plan.partition),
                "schedule": self.plan.schedule, "layers": self.spec.layers}
        checkpoint.save(path, self.layers, self.optimizer, meta, self.group)

    def gather_losses(self) -> dict[int, float]:
        """Collective (whole job): every step's loss, from whichever rank held the last stage
        then."""
        boxes: list[Any] = [None] * dist.get_world_size(self.job_group)
        dist.all_gather_object(boxes, self.losses, group=self.job_group)
        out: dict[int, float] = {}
        for part in boxes:
            out.update(part)
        return dict(sorted(out.items()))

    def gather_layer_costs(self) -> list[dict[str, Any]]:
        """Collective: every rank's per-layer cost samples so far, by (step, layer)."""
        boxes: list[Any] = [None] * dist.get_world_size(self.job_group)
        dist.all_gather_object(boxes, self.recorder.layer_costs, group=self.job_group)
        return sorted((r for part in boxes for r in part), key=lambda r: (r["step"], r["layer"]))

    def gather_clock(self) -> list[Any]:
        """Collective: every rank's clock-offset estimates against rank 0."""
        boxes: list[Any] = [None] * dist.get_world_size(self.job_group)
        dist.all_gather_object(boxes, self.recording.clock, group=self.job_group)
        return [e for part in boxes for e in part]

    def run_meta(self, layer_costs: list[dict[str, Any]] | None = None,
                 clock: list[Any] | None = None) -> RunMeta:
        """SPEC run metadata: the initial plan, plus actions, emulation, layer costs and the
        ranks' clock offsets against rank 0 (``clock``: estimates and uncertainties)."""
        from dataclasses import asdict

        init, c = self.initial_plan, self.config
        extra: dict[str, Any] = {
            "model": asdict(self.spec), "optimizer": c.optimizer, "lr": c.lr, "seed": c.seed,
            "batch_size": c.batch_size, "actions": list(self.actions),
            "torch_schedule": init.info.torch_class, "timing": self.recording.timing,
        }
        if self.calendar:
            extra["calendar"] = dict(self.calendar)
        if clock:
            from bubblecast.runtime.clock import summarize

            extra["clock"] = summarize(clock, CLOCK_EVERY)
        if c.inject:
            extra["emulated_slowdown"] = {"spec": c.inject,
                                          "injections": [i.to_json() for i in c.injections]}
        if layer_costs is not None:
            extra["layer_costs"] = {"every": c.layer_cost_every,
                                    **{k: [r[k] for r in layer_costs] for k in
                                       ("step", "layer", "rank", "forward_s", "total_s")}}
        chunks = self.max_chunks
        partition: list[int] | None = list(init.partition)
        if len(partition) not in (init.stages, init.stages * chunks):
            extra["initial_partition"], partition = partition, None
        if self.packed is not None:
            extra["documents"] = self.packed.meta()
        return RunMeta(schedule=init.schedule, stages=init.stages,
                       microbatches=self.max_microbatches, chunks=chunks, replicas=c.replicas,
                       partition=partition, source="bubblecast-runtime", extra=extra)

    def close(self, out: str | None = None) -> int | None:
        """Collective (whole job): flush telemetry; the lead rank merges the parts into
        ``out``; its row count."""
        if self.packed is not None:
            self.packed.close()
        self.recording.close()
        costs, clock = self.gather_layer_costs(), self.gather_clock()
        rows = None
        if self.is_lead and out is not None and self.config.events_dir is not None:
            rows = merge_parts(self.config.events_dir, out, self.config.run_id,
                               self.run_meta(costs, clock))
            _merge_metrics(self.config.events_dir, out)
        dist.barrier(group=self.job_group)
        return rows

    @property
    def is_lead(self) -> bool:
        """Whether this rank writes the job's outputs: global rank 0 with replicas, else
        rank 0 of the pipeline group."""
        return self.global_rank == 0 if self.config.replicas > 1 else self.rank == 0


def _merge_metrics(parts_dir: str, out: str) -> None:
    """The ranks' ``*.metrics`` files merged beside ``out`` (``OUT.metrics``), when any."""
    from bubblecast.telemetry.metrics import metrics_path, read_metrics, write_metrics

    frame = read_metrics(parts_dir)
    if len(frame):
        write_metrics(frame.sort_values(["step", "rank", "metric"], kind="stable"),
                      metrics_path(out))
