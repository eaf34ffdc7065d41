"""The packed model's training step on one rank: :class:`PackedSteps`.

Each step (the same on every rank of the job):

1. the step's plan, a :class:`~bubblecast.policy.work_plan.WorkPlan` over the data loader's
   global batch (:mod:`bubblecast.runtime.document_loader`): the loader's own packing, or the
   live planner's (:attr:`PackedSteps.planner`, :mod:`bubblecast.runtime.live_plan`);
2. this replica's micro-batches packed into ``(m, budget)`` tensors; the loss's denominator set
   to the loss tokens of the whole global batch (every replica);
3. the schedule object for ``m`` micro-batches (one per count, built on first use with its own
   ``PipelineStage`` objects over the same layers: a replica may run a different count from
   step to step and from the other replicas) runs the step, recorded with each micro-batch's
   ``tokens``, ``tokens_sq`` and ``documents`` (:meth:`Recording.set_documents`);
4. gradients summed over the replicas (the data-parallel group of this rank's stage), the
   optimizer steps; the step's loss (the mean token loss of the global batch) is summed over
   the replicas' last stages.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from bubblecast.runtime.balanced_sampler import global_token_loss, loss_tokens
from bubblecast.runtime.document_loader import DocumentLoader

if TYPE_CHECKING:
    from bubblecast.policy.work_plan import WorkPlan


class PackedSteps:
    """The packed model's steps on ``trainer``'s rank (see the module doc).

    :attr:`planner`: None (the loader's packing) or an object with ``plan(step) ->
    WorkPlan`` (the same plan on every rank), ``observe(step, seconds)`` after each step and
    ``close()``. :attr:`counts`: each step's micro-batches per replica."""

    def __init__(self, trainer: Any) -> None:
        c = trainer.config
        self.trainer = trainer
        self.loader = DocumentLoader(budget=c.model.seq_len, vocab=c.model.vocab, seed=c.seed,
                                     replicas=c.replicas, microbatches=c.microbatches,
                                     stages=c.stages, schedule=c.plan.schedule,
                                     documents=c.documents)
        self.global_tokens = 1
        self.planner: Any = None
        self.counts: dict[int, list[int]] = {}
        self._runtimes: dict[int, tuple[list[Any], Any]] = {}
        self._attached: int | None = None
        self._mean_length: float | None = None

    def loss(self, logits: Any, labels: Any) -> Any:
        """A micro-batch's summed token losses over the global batch's loss tokens."""
        return global_token_loss(logits, labels, self.global_tokens)

    def plan(self, step: int) -> WorkPlan:
        """Step ``step``'s plan: the planner's, else the loader's packing."""
        if self.planner is not None:
            return self.planner.plan(step)
        return self.loader.static_plan(step)

    def schedule(self, m: int) -> Any:
        """The schedule running ``m`` micro-batches, attached to the recording."""
        t = self.trainer
        if m not in self._runtimes:
            if m == t.plan.microbatches and not self._runtimes:
                self._runtimes[m] = (t.stages, t.schedule)  # the trainer's own, attached
                self._attached = m
            else:
                self._runtimes[m] = t.build_runtime(replace(t.plan, microbatches=m), t.layers)
        if self._attached != m:
            t.recording.attach(self._runtimes[m][1], layers=t.chunk_layers(),
                               optimizer=t.optimizer)
            self._attached = m
        return self._runtimes[m][1]

    def run(self, step: int) -> float | None:
        """Train step ``step``; the global batch's mean token loss on a last-stage rank."""
        import time

        t = self.trainer
        plan = self.plan(step)
        self.counts[step] = plan.counts
        t.max_microbatches = max(t.max_microbatches, *plan.counts)
        mine = plan.microbatches[t.replica]
        batch = self.loader.tensors(step, mine)
        self.global_tokens = loss_tokens(self.loader.lengths(step))
        schedule = self.schedule(len(mine))
        vstages = t.plan.vstages_of(t.rank)
        first, last = 0 in vstages, t.plan.virtual_stages - 1 in vstages
        t.recording.step = step
        t.recording.set_documents(batch.lengths)
        losses: list[Any] | None = [] if last else None
        dev = t.device
        t0 = time.perf_counter()
        schedule.step(*((batch.tokens.to(dev),) if first else ()),
                      documents=batch.documents.to(dev),
                      target=batch.labels.to(dev) if last else None, losses=losses,
                      return_outputs=False)
        if t.dp_group is not None:
            from bubblecast.runtime.replicas import allreduce_grads

            allreduce_grads(t.parameters(), t.dp_group)
        t.optimizer.step()
        t.optimizer.zero_grad(set_to_none=True)
        t.recording.end_step()
        if self.planner is not None:
            self.planner.observe(step, time.perf_counter() - t0)
        if losses is None:
            return None
        loss = sum(float(v.item()) for v in losses)
        if t.dp_group is not None:
            from bubblecast.runtime.replicas import allreduce_sum

            loss = allreduce_sum(loss, t.dp_group, dev)
        return loss

    def meta(self) -> dict[str, Any]:
        """Run metadata ``documents``: the source, token budget, planner, micro-batches per
        replica, each step's document lengths (the loader's batches, from step 0) and the
        micro-batches each replica ran."""
        loader, c = self.loader, self.trainer.config
        if self._mean_length is None:
            self._mean_length = loader.source.mean_length()
        counts = dict(self.counts)
        last = max(counts) if counts else -1
        return {"source": loader.source.to_json(), "token_budget": loader.budget,
                "mean_length": self._mean_length, "planner": c.planner,
                "microbatches": c.microbatches,
                "lengths": [loader.lengths(k).tolist() for k in range(last + 1)],
                "counts": {str(k): v for k, v in sorted(counts.items())}}

    def close(self) -> None:
        """Stop the planner (its worker process), if any."""
        if self.planner is not None:
            self.planner.close()
