"""The gradient does not depend on the plan (issue 24, item 4): the same global batch of
documents packed the data loader's way and the planner's way (other micro-batches, other
counts per replica) gives the same gradient, accumulated over every micro-batch of every
replica, when attention is causal within each document, positions restart per document and
the loss is the sum of token losses over the global batch's tokens. float64, single process.

Negative controls show the test can fail: a per-micro-batch mean loss, or attention that
crosses document boundaries, changes the gradient with the packing.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import bubblecast
from bubblecast.policy import work_plan
from bubblecast.runtime.balanced_sampler import (
    IGNORE_INDEX,
    document_mask,
    global_token_loss,
    loss_tokens,
    packed_microbatch,
)
from bubblecast.sim.documents import DocumentSource, draw_batches

BUDGET, VOCAB, HIDDEN, HEADS = 64, 23, 16, 2
REPLICAS, MICROBATCHES = 2, 4


class TinyGPT(nn.Module):
    """Embeddings, one pre-norm attention + MLP block, a head; float64."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.tok = nn.Embedding(VOCAB, HIDDEN)
        self.pos = nn.Embedding(BUDGET, HIDDEN)
        self.norm1, self.norm2 = nn.LayerNorm(HIDDEN), nn.LayerNorm(HIDDEN)
        self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN)
        self.proj = nn.Linear(HIDDEN, HIDDEN)
        self.mlp = nn.Sequential(nn.Linear(HIDDEN, 2 * HIDDEN), nn.GELU(),
                                 nn.Linear(2 * HIDDEN, HIDDEN))
        self.head = nn.Linear(HIDDEN, VOCAB)
        self.double()

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        h = self.tok(tokens) + self.pos(positions)
        b, t, _ = h.shape
        q, k, v = (z.view(b, t, HEADS, -1).transpose(1, 2)
                   for z in self.qkv(self.norm1(h)).chunk(3, dim=-1))
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        h = h + self.proj(a.transpose(1, 2).reshape(b, t, HIDDEN))
        h = h + self.mlp(self.norm2(h))
        return self.head(h)


def _batch(seed: int) -> tuple[np.ndarray, list[torch.Tensor]]:
    """A step's documents as the loader cuts the stream, with random tokens."""
    lengths = draw_batches(DocumentSource("long-tail", BUDGET), seed, 1,
                           REPLICAS * MICROBATCHES)[0]
    g = torch.Generator().manual_seed(seed)
    return lengths, [torch.randint(0, VOCAB, (int(n),), generator=g) for n in lengths]


def _gradient(plan: bubblecast.WorkPlan, docs: list[torch.Tensor], lengths: np.ndarray,
              loss: str = "global", causal_only: bool = False) -> torch.Tensor:
    """The step's gradient: every micro-batch of every replica, backward after each
    (accumulating, as the replicas' all-reduce sum would)."""
    model = TinyGPT()
    total_mbs = sum(plan.counts)
    for replica in plan.microbatches:
        for mb in replica:
            p = packed_microbatch([docs[i] for i in mb], BUDGET)
            mask = document_mask(p.documents)
            if causal_only:
                mask = torch.ones(BUDGET, BUDGET, dtype=torch.bool).tril()
            logits = model(p.tokens, p.positions, mask)
            if loss == "global":
                value = global_token_loss(logits, p.labels, loss_tokens(lengths))
            else:  # the usual per-micro-batch mean, averaged over micro-batches
                if not (p.labels != IGNORE_INDEX).any():
                    continue
                value = torch.nn.functional.cross_entropy(
                    logits[0], p.labels[0], ignore_index=IGNORE_INDEX) / total_mbs
            value.backward()
    return torch.cat([q.grad.reshape(-1) for q in model.parameters()])


def _plans(lengths: np.ndarray) -> tuple[bubblecast.WorkPlan, bubblecast.WorkPlan]:
    """The loader's plan and a balanced one with a slow replica (fewer micro-batches)."""
    config = work_plan.PlanConfig(BUDGET, REPLICAS, MICROBATCHES, 4)
    static = work_plan.plan_static(lengths, config)
    balanced = bubblecast.plan_batch(lengths, token_budget=BUDGET, replicas=REPLICAS,
                                     microbatches=MICROBATCHES, stages=4,
                                     cost={"per_token": 1.0, "per_token_sq": 1.0 / BUDGET},
                                     speeds=[1.0, 2.0])
    return static, balanced


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gradient_is_the_same_under_the_loaders_and_the_balanced_plan(seed):
    lengths, docs = _batch(seed)
    static, balanced = _plans(lengths)
    assert balanced.fallback is None
    assert balanced.counts != static.counts  # another micro-batch count per replica
    assert balanced.microbatches != static.microbatches
    a = _gradient(static, docs, lengths)
    b = _gradient(balanced, docs, lengths)
    assert float(a.abs().max()) > 1e-3  # a real gradient, not zeros
    assert float((a - b).abs().max()) < 1e-6


def test_negative_control_a_per_microbatch_mean_depends_on_the_packing():
    lengths, docs = _batch(0)
    static, balanced = _plans(lengths)
    a = _gradient(static, docs, lengths, loss="mean")
    b = _gradient(balanced, docs, lengths, loss="mean")
    assert float((a - b).abs().max()) > 1e-3


def test_negative_control_attention_across_documents_depends_on_the_packing():
    lengths, docs = _batch(0)
    static, balanced = _plans(lengths)
    a = _gradient(static, docs, lengths, causal_only=True)
    b = _gradient(balanced, docs, lengths, causal_only=True)
    assert float((a - b).abs().max()) > 1e-3
