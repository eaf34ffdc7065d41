"""The packed model's data loader: each step's global batch of documents, its plans, and the
packed micro-batch tensors a replica runs.

Step ``k``'s global batch is what the data loader's stream gives (the same on every rank):
documents drawn from a preset or a file of lengths (:func:`bubblecast.sim.documents.load_documents`)
and cut by sequential first-fit into exactly ``replicas x microbatches`` micro-batches of
``budget`` tokens (:func:`bubblecast.sim.documents.draw_batches`, seeded by the run's seed).
Document ``j`` of step ``k`` is an arithmetic sequence mod ``vocab`` from its own start and
stride (seeded by ``(seed, k)``), so its tokens do not depend on where a plan puts it.

:meth:`DocumentLoader.static_plan` is the loader's own plan (its packing, in order, replica
``r`` running micro-batches ``r*M .. r*M+M-1``); any other
:class:`~bubblecast.policy.work_plan.WorkPlan` of the same lengths (the planner's) gives the
same documents. :meth:`DocumentLoader.tensors` packs one replica's micro-batches into
``(m, budget)`` tensors (:func:`bubblecast.runtime.balanced_sampler.packed_microbatch`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, NamedTuple

import numpy as np

from bubblecast.policy import work_plan
from bubblecast.policy.plan_api import plan_config
from bubblecast.policy.work_plan import PlanConfig, WorkPlan
from bubblecast.sim.documents import DocumentSource, draw_batches, load_documents

#: Default document source of the packed model.
DEFAULT_DOCUMENTS = "lognormal"


def fewest_microbatches(schedule: str, stages: int, most: int) -> int:
    """The fewest micro-batches (up to ``most``) the runtime runs ``schedule`` with on
    ``stages`` stages (:func:`bubblecast.runtime.plan.check_plan`'s rules, torch's)."""
    from bubblecast.errors import BubblecastError
    from bubblecast.runtime.plan import check_plan

    for m in range(1, most + 1):
        try:
            check_plan(schedule, stages, m, stages)
        except BubblecastError:
            continue
        return m
    return most


class PackedBatch(NamedTuple):
    """One replica's micro-batches of a step, each ``(m, budget)`` int64: ``tokens``,
    ``documents`` (document number within its micro-batch, -1 on padding), ``labels`` (next
    token of the same document, ``IGNORE_INDEX`` elsewhere); ``lengths[j]``: the lengths of
    micro-batch ``j``'s documents."""

    tokens: Any
    documents: Any
    labels: Any
    lengths: list[list[int]]


class DocumentLoader:
    """Every step's documents for a run (see the module doc); the same on every rank.

    ``budget``: tokens per micro-batch; ``vocab``: token ids ``0..vocab-1``; ``documents``: a
    preset or a JSON file of lengths; ``replicas``/``microbatches``/``stages``/``schedule``:
    the step's shape (``microbatches`` per replica). :attr:`config` (the planner's) lets a
    replica run no fewer micro-batches than torch's schedule accepts (1F1B: one per stage)."""

    def __init__(self, *, budget: int, vocab: int, seed: int, replicas: int, microbatches: int,
                 stages: int, schedule: str, documents: str | None = None) -> None:
        self.budget, self.vocab, self.seed = int(budget), int(vocab), int(seed)
        self.source: DocumentSource = load_documents(documents or DEFAULT_DOCUMENTS,
                                                     self.budget)
        config = plan_config(token_budget=self.budget, replicas=replicas,
                             microbatches=microbatches, stages=stages, schedule=schedule)
        self.config: PlanConfig = replace(config, min_microbatches=fewest_microbatches(
            schedule, stages, microbatches))
        self._batches: list[np.ndarray] = []

    def lengths(self, step: int) -> np.ndarray:
        """Step ``step``'s document lengths, in the stream's order."""
        if step >= len(self._batches):  # the stream is prefix-stable: draw more, keep the rest
            want = max(step + 1, 2 * len(self._batches), 16)
            self._batches = draw_batches(self.source, self.seed, want, self.config.total)
        return self._batches[step]

    def static_plan(self, step: int) -> WorkPlan:
        """The data loader's own plan of step ``step`` (its packing, in order)."""
        return work_plan.plan_static(self.lengths(step), self.config)

    def starts_strides(self, step: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Each of step ``step``'s ``n`` documents' first token and stride."""
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, int(step), 17]))
        return (rng.integers(0, self.vocab, n),
                rng.integers(1, max(2, self.vocab // 4), n))

    def document(self, step: int, index: int, length: int,
                 start_stride: tuple[np.ndarray, np.ndarray] | None = None) -> Any:
        """Document ``index`` of step ``step`` (``length`` token ids, int64)."""
        import torch

        starts, strides = start_stride or self.starts_strides(step, index + 1)
        a, s = int(starts[index]), int(strides[index])
        return (a + s * torch.arange(length, dtype=torch.int64)) % self.vocab

    def tensors(self, step: int, microbatches: Any) -> PackedBatch:
        """The packed tensors of micro-batches ``microbatches`` (lists of indices into step
        ``step``'s documents; e.g. one replica's share of a plan)."""
        import torch

        from bubblecast.runtime.balanced_sampler import packed_microbatch

        x = self.lengths(step)
        seeds = self.starts_strides(step, len(x))
        packed, lengths = [], []
        for mb in microbatches:
            docs = [self.document(step, int(i), int(x[i]), seeds) for i in mb]
            packed.append(packed_microbatch(docs, self.budget))
            lengths.append([int(x[i]) for i in mb])
        tokens = torch.cat([p.tokens for p in packed])
        documents = torch.cat([p.documents for p in packed])
        labels = torch.cat([p.labels for p in packed])
        return PackedBatch(tokens, documents, labels, lengths)
