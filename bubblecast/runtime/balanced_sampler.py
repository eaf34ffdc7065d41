"""A ``torch.utils.data`` sampler that plans every step's packed micro-batches:
:class:`BalancedBatchSampler`, plus the packed-tensor helpers a training loop needs.

Each rank of a data-parallel group makes the same sampler with its own ``replica``::

    sampler = BalancedBatchSampler(lengths, replica=dp_rank, replicas=dp_size,
                                   microbatches=8, token_budget=4096, stages=4)
    for step_microbatches in sampler:      # this replica's micro-batches, in run order
        packed = [packed_microbatch([dataset[i] for i in mb], 4096) for mb in
                  step_microbatches]
        ...                                # loss = global_token_loss(..., global_tokens)

A step's global batch is what the data loader's stream gives: the documents in (shuffled)
order, filling ``replicas * microbatches`` micro-batches by sequential first-fit
(:func:`~bubblecast.sim.documents.next_fit`); the document that does not fit opens the next
step. The step is then planned with :func:`bubblecast.policy.plan_api.plan_batch` (or, with
``method="static"``, kept as the loader packs it) and this replica's micro-batches are yielded
as lists of dataset indices. Every replica computes the same plan from the same inputs
(seed, epoch, lengths, ``speeds``), so no communication is needed; ``speeds`` given as a
callable must return the same values on every replica (an ``all_gather`` of step times, say).
A balanced plan may give replicas different numbers of micro-batches (a slower replica runs
fewer); a schedule per count is the caller's.

The epoch's last documents, when they fill fewer than ``replicas * microbatches``
micro-batches, form a last step (unless ``drop_last``): planned as usual when there are at
least as many documents as micro-batches, otherwise the loader's packing padded with empty
micro-batches, reported as a fall-back. A fall-back is never silent: ``last_plan.fallback``
says why and a warning is logged.

With the loss summed over tokens and divided by the global batch's loss tokens
(:func:`global_token_loss`; gradients summed, not averaged, over replicas) the gradient does
not depend on the plan.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import Sampler

from bubblecast.errors import BubblecastError
from bubblecast.policy import work_plan
from bubblecast.policy.plan_api import plan_config, resolve_cost
from bubblecast.policy.work_plan import WorkPlan
from bubblecast.sim.documents import check_lengths, microbatch_stats, next_fit

log = logging.getLogger("bubblecast.plan")

METHODS = ("balance", "static")
IGNORE_INDEX = -100


class BalancedBatchSampler(Sampler[list[list[int]]]):
    """Yields, per step, this ``replica``'s micro-batches (lists of dataset indices) in run
    order; see the module doc.

    ``lengths``: each document's length in tokens, a sequence or a callable ``index ->
    length`` (then ``num_documents`` is required; it is read once, on first use);
    ``replica``/``replicas``: this data-parallel rank and the group size; ``microbatches``:
    per replica per step (on average, in a balanced plan); ``token_budget``: tokens per
    micro-batch; ``stages``/``schedule``: the pipeline the plan is timed for; ``cost``: as
    :func:`bubblecast.plan_batch` (None: token balancing); ``speeds``: None, per-replica
    time multipliers, or a callable returning the latest ones; ``method``: ``balance`` or
    ``static`` (the loader's own packing: the A/B switch); ``seed``/``shuffle``: the document
    order (a permutation seeded by ``seed`` and the epoch); ``drop_last``: drop the epoch's
    last, partial step. After each yield, :attr:`last_plan` is the step's :class:`WorkPlan`
    (indices into :attr:`last_lengths`), :attr:`last_indices` its documents' dataset indices
    and :attr:`last_lengths` their lengths.
    """

    def __init__(self, lengths: Sequence[int] | Callable[[int], int], *, replica: int,
                 replicas: int, microbatches: int, token_budget: int, stages: int = 1,
                 schedule: str = "1f1b", cost: Any = None, speeds: Any = None,
                 method: str = "balance", seed: int = 0, shuffle: bool = True,
                 drop_last: bool = False, num_documents: int | None = None) -> None:
        if method not in METHODS:
            raise BubblecastError(f"method: unknown '{method}' (known: {', '.join(METHODS)})")
        self.work, weights, label = resolve_cost(cost)
        self.label = "static" if method == "static" else label
        self.config = plan_config(token_budget=token_budget, replicas=replicas,
                                  microbatches=microbatches, stages=stages, schedule=schedule,
                                  kind_weights=weights)
        if isinstance(replica, bool) or not isinstance(replica, (int, np.integer)) or \
                not 0 <= replica < replicas:
            raise BubblecastError(f"replica: must be an integer in [0, {replicas}), "
                                  f"got {replica!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise BubblecastError(f"seed: must be an integer, got {seed!r}")
        bad_count = isinstance(num_documents, bool) or not isinstance(num_documents, int) or \
            num_documents < 1
        if callable(lengths) and bad_count:
            raise BubblecastError("num_documents: an integer >= 1 is required when lengths "
                                  "is a callable")
        self._source = lengths
        self._count = num_documents
        self._lengths: np.ndarray | None = None
        self.replica = int(replica)
        self.method = method
        self.speeds = speeds
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        self.epoch = 0
        self.last_plan: WorkPlan | None = None
        self.last_indices: np.ndarray = np.zeros(0, dtype=np.int64)
        self.last_lengths: np.ndarray = np.zeros(0, dtype=np.int64)

    @property
    def lengths(self) -> np.ndarray:
        """Every document's length (int64), read and checked once."""
        if self._lengths is None:
            src = self._source
            raw = [src(i) for i in range(self._count or 0)] if callable(src) else src
            self._lengths = check_lengths(raw, self.config.token_budget, "lengths")
        return self._lengths

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s document order (as ``DistributedSampler.set_epoch``)."""
        self.epoch = int(epoch)

    def order(self) -> np.ndarray:
        """This epoch's document order (dataset indices)."""
        n = len(self.lengths)
        if not self.shuffle:
            return np.arange(n, dtype=np.int64)
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, self.epoch]))
        return rng.permutation(n).astype(np.int64)

    def steps(self) -> list[np.ndarray]:
        """This epoch's global batches (dataset indices, in stream order), as the loader's
        sequential first-fit cuts the stream (see the module doc)."""
        order = self.order()
        owner = next_fit(self.lengths[order], self.config.token_budget)
        total = self.config.total
        step_of = owner // total
        bounds = np.searchsorted(step_of, np.arange(int(step_of[-1]) + 2))
        out = [order[bounds[k]:bounds[k + 1]] for k in range(len(bounds) - 1)]
        if self.drop_last and int(owner[-1]) % total != total - 1:
            out.pop()
        return out

    def __len__(self) -> int:
        return len(self.steps())

    def __iter__(self) -> Iterator[list[list[int]]]:
        for idx in self.steps():
            x = self.lengths[idx]
            plan = self.plan(x)
            if plan.fallback:
                log.warning("bubblecast sampler: step planned by fall-back: %s", plan.fallback)
            self.last_plan, self.last_indices, self.last_lengths = plan, idx, x
            yield [[int(idx[i]) for i in mb] for mb in plan.microbatches[self.replica]]

    def plan(self, x: np.ndarray) -> WorkPlan:
        """The plan of one global batch of lengths ``x`` (see the module doc)."""
        config = self.config
        full = int(next_fit(x, config.token_budget)[-1]) + 1 == config.total
        if self.method == "static":
            return work_plan.plan_static(x, config, self.work) if full else \
                padded_loader_plan(x, config, self.work, "static", None)
        why = (f"the epoch's last {len(x)} documents are fewer than the {config.total} "
               "micro-batches: the loader's packing, padded with empty micro-batches")
        if len(x) >= config.total:
            speeds = self.speeds() if callable(self.speeds) else self.speeds
            try:
                return work_plan.plan_batch(x, config, self.work, speeds, self.label)
            except BubblecastError as exc:
                if full:
                    raise
                why = f"the epoch's last step could not be planned ({exc}): the loader's " \
                    "packing, padded with empty micro-batches"
        return padded_loader_plan(x, config, self.work, self.label, why)


def padded_loader_plan(x: np.ndarray, config: work_plan.PlanConfig, cost: Any, method: str,
                       fallback: str | None) -> WorkPlan:
    """The loader's packing of a last, partial step: sequential first-fit, ``microbatches``
    consecutive micro-batches per replica, the missing ones empty."""
    owner = next_fit(x, config.token_budget)
    total, m = config.total, config.microbatches
    tokens, tokens_sq, docs = microbatch_stats(x, owner, total)
    c = cost.microbatch(tokens, tokens_sq, docs)
    plan = tuple(tuple(tuple(np.flatnonzero(owner == r * m + j).tolist()) for j in range(m))
                 for r in range(config.replicas))
    costs = tuple(tuple(float(v) for v in c[r * m:(r + 1) * m]) for r in range(config.replicas))
    return WorkPlan(plan, costs, None, fallback, method)


class PackedMicrobatch(NamedTuple):
    """One packed micro-batch, each ``(1, token_budget)`` int64: ``tokens`` (padding
    ``pad_id``), ``positions`` (restarting at 0 in every document), ``documents`` (the
    document's number within the micro-batch, -1 on padding) and ``labels`` (the next token
    of the same document, ``IGNORE_INDEX`` at each document's last token and on padding)."""

    tokens: torch.Tensor
    positions: torch.Tensor
    documents: torch.Tensor
    labels: torch.Tensor


def packed_microbatch(documents: Sequence[Any], token_budget: int, pad_id: int = 0
                      ) -> PackedMicrobatch:
    """Pack ``documents`` (1-D integer token sequences) into one fixed-shape micro-batch;
    BubblecastError when they hold more than ``token_budget`` tokens."""
    tokens = torch.full((token_budget,), pad_id, dtype=torch.int64)
    positions = torch.zeros(token_budget, dtype=torch.int64)
    doc_ids = torch.full((token_budget,), -1, dtype=torch.int64)
    labels = torch.full((token_budget,), IGNORE_INDEX, dtype=torch.int64)
    at = 0
    for d, doc in enumerate(documents):
        t = torch.as_tensor(doc, dtype=torch.int64).reshape(-1)
        n = len(t)
        if at + n > token_budget:
            raise BubblecastError(f"documents: {at + n} tokens do not fit the token budget "
                                  f"{token_budget}")
        tokens[at:at + n] = t
        positions[at:at + n] = torch.arange(n)
        doc_ids[at:at + n] = d
        labels[at:at + n - 1] = t[1:]
        at += n
    return PackedMicrobatch(tokens[None], positions[None], doc_ids[None], labels[None])


def document_mask(documents: torch.Tensor) -> torch.Tensor:
    """``(batch, 1, T, T)`` boolean mask for ``scaled_dot_product_attention`` from document
    ids ``(batch, T)``: a token attends to itself and the earlier tokens of its own document;
    padding (id -1) only to itself, so no row is empty and no document sees another."""
    t = documents.shape[-1]
    same = documents[:, :, None] == documents[:, None, :]
    causal = torch.ones(t, t, dtype=torch.bool, device=documents.device).tril()
    real = (documents >= 0)[:, :, None]
    eye = torch.eye(t, dtype=torch.bool, device=documents.device)
    return ((same & causal & real) | eye)[:, None]


def loss_tokens(lengths: Any) -> int:
    """Tokens with a next-token label in documents of these lengths: ``sum(length - 1)``."""
    return int(np.sum(np.asarray(lengths, dtype=np.int64) - 1))


def global_token_loss(logits: torch.Tensor, labels: torch.Tensor, global_tokens: int
                      ) -> torch.Tensor:
    """Sum of the micro-batch's per-token cross-entropies over ``global_tokens``, the loss
    tokens of the whole step over every replica: summed over micro-batches and replicas it
    is the step's mean token loss, whatever the packing."""
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE_INDEX,
        reduction="sum") / max(1, int(global_tokens))
