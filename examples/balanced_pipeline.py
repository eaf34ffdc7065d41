"""Balance packed documents every step in a torch.distributed.pipelining loop (CPU, gloo).

    torchrun --nproc-per-node 2 examples/balanced_pipeline.py --method balance [--steps 8]
        [--cost-model DIR] [--out telemetry/]
    bubblecast inspect telemetry/run_id=balanced-balance        # with --out

A tiny GPT-like model is split into one stage per rank (PipelineStage + Schedule1F1B). A
dataset of documents of varied lengths is read through ``bubblecast.BalancedBatchSampler``:
each step takes the documents the data loader's stream gives (sequential first-fit into
``--microbatches`` micro-batches of ``--token-budget`` tokens) and, with ``--method tokens``
or ``balance``, re-plans which documents go into which micro-batch and in what order
(``static`` keeps the loader's packing: the A/B switch). ``balance`` prices micro-batches with
the learned cost model of ``--cost-model`` (``bubblecast train EVENTS --model cost``) or, without
one, with attention-aware coefficients (half the cost quadratic at the mean length).

Every micro-batch has the fixed shape ``(1, token_budget)`` (stock shape inference holds) and
carries its documents' boundaries: attention is causal within each document (a block-diagonal
boolean mask for ``scaled_dot_product_attention``), positions restart per document, padding is
out of the loss, and the loss is the sum of token losses over the step's global loss tokens
(``scale_grads=False``), so the gradient does not depend on the packing: the three methods
print the same losses. Rank 0 prints each step's time and the micro-batches' imbalance under
one attention-aware cost (max / mean; comparable across methods); ``--out`` also records
telemetry (``bubblecast.record`` with ``set_documents``).

On CPU, ``scaled_dot_product_attention`` with a boolean mask computes every ``T x T`` score
and the MLP runs over padding too, so a micro-batch's time here hardly depends on what it
holds: the step times show the mechanics, not the speed-up. The speed-up needs kernels that
skip masked blocks and padding (variable-length flash attention, FlexAttention block masks).
"""

import argparse
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

import bubblecast
from bubblecast.runtime.balanced_sampler import (
    document_mask,
    global_token_loss,
    loss_tokens,
    packed_microbatch,
)

VOCAB, HIDDEN, HEADS = 64, 64, 4


class Block(nn.Module):
    """Pre-norm attention (causal within each document) and MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(HIDDEN), nn.LayerNorm(HIDDEN)
        self.qkv, self.proj = nn.Linear(HIDDEN, 3 * HIDDEN), nn.Linear(HIDDEN, HIDDEN)
        self.mlp = nn.Sequential(nn.Linear(HIDDEN, 4 * HIDDEN), nn.GELU(),
                                 nn.Linear(4 * HIDDEN, HIDDEN))

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, _ = h.shape
        q, k, v = (z.view(b, t, HEADS, -1).transpose(1, 2)
                   for z in self.qkv(self.norm1(h)).chunk(3, dim=-1))
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        h = h + self.proj(a.transpose(1, 2).reshape(b, t, HIDDEN))
        return h + self.mlp(self.norm2(h))


class Stage(nn.Module):
    """Blocks of one pipeline stage; the first embeds tokens and positions, the last holds
    the head. Every stage gets the micro-batch's positions and document ids as kwargs."""

    def __init__(self, index: int, stages: int, blocks: int, budget: int) -> None:
        super().__init__()
        torch.manual_seed(1000 + index)  # each stage's weights from its own seed
        self.embed = nn.Embedding(VOCAB, HIDDEN) if index == 0 else None
        self.pos = nn.Embedding(budget, HIDDEN) if index == 0 else None
        self.blocks = nn.ModuleList(Block() for _ in range(blocks))
        self.head = nn.Sequential(nn.LayerNorm(HIDDEN), nn.Linear(HIDDEN, VOCAB)) \
            if index == stages - 1 else None

    def forward(self, x: torch.Tensor, positions: torch.Tensor,
                documents: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) + self.pos(positions) if self.embed is not None else x
        mask = document_mask(documents)
        for block in self.blocks:
            h = block(h, mask)
        return self.head(h) if self.head is not None else h


def document_tokens(i: int, length: int) -> torch.Tensor:
    """Document ``i``: an arithmetic sequence mod VOCAB from its own start and stride."""
    g = torch.Generator().manual_seed(i)
    start, stride = torch.randint(0, VOCAB, (2,), generator=g).tolist()
    return (start + (stride | 1) * torch.arange(length)) % VOCAB


def make_sampler(args: argparse.Namespace, lengths: np.ndarray) -> bubblecast.BalancedBatchSampler:
    """The sampler of ``--method``: static (the loader's packing), tokens or balance."""
    cost = None
    if args.method == "balance":
        cost = args.cost_model or bubblecast.WorkCost.attention(
            0.5, float(lengths.mean()), args.token_budget)
    return bubblecast.BalancedBatchSampler(
        lengths, replica=0, replicas=1, microbatches=args.microbatches,
        token_budget=args.token_budget, stages=dist.get_world_size(), cost=cost,
        method="static" if args.method == "static" else "balance", seed=args.seed)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--method", choices=("static", "tokens", "balance"), default="balance")
    ap.add_argument("--cost-model", default=None, help="cost-model directory or models:/ URI")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--token-budget", type=int, default=512)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--documents", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="record telemetry here (events parts)")
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    rng = np.random.default_rng(args.seed)  # the same dataset on every rank
    lengths = np.clip(np.rint(rng.lognormal(np.log(args.token_budget / 12), 1.1,
                                            args.documents)), 8, args.token_budget).astype(int)
    sampler = make_sampler(args, lengths)
    stage = PipelineStage(Stage(rank, world, 2, args.token_budget), rank, world,
                          torch.device("cpu"))
    step_tokens = {"global": 1}  # the step's loss tokens, read by the loss function

    def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return global_token_loss(logits, labels, step_tokens["global"])

    schedule = Schedule1F1B(stage, n_microbatches=args.microbatches, loss_fn=loss_fn,
                            scale_grads=False)
    opt = torch.optim.AdamW(stage.submod.parameters(), lr=3e-3)
    ref = bubblecast.WorkCost.attention(0.5, float(lengths.mean()), args.token_budget)
    rec = bubblecast.record(schedule, out=args.out, run_id=f"balanced-{args.method}",
                            optimizer=opt) if args.out else None
    batches = iter(sampler)
    for step in range(args.steps):
        try:
            mbs = next(batches)
        except StopIteration:
            sampler.set_epoch(sampler.epoch + 1)
            batches = iter(sampler)
            mbs = next(batches)
        packed = [packed_microbatch([document_tokens(i, int(lengths[i])) for i in mb],
                                    args.token_budget) for mb in mbs]
        tokens, positions, docs, labels = (torch.cat(t) for t in zip(*packed, strict=True))
        step_tokens["global"] = loss_tokens(sampler.last_lengths)
        if rec is not None:
            rec.set_documents([[int(lengths[i]) for i in mb] for mb in mbs])
        losses: list[torch.Tensor] = []
        t0 = time.perf_counter()
        if rank == 0:
            schedule.step(tokens, positions=positions, documents=docs)
        else:
            schedule.step(positions=positions, documents=docs,
                          target=labels if rank == world - 1 else None, losses=losses)
        opt.step()
        opt.zero_grad()
        dist.barrier()
        took = time.perf_counter() - t0
        loss = torch.stack(losses).sum() if losses else torch.zeros(())
        dist.broadcast(loss, src=world - 1)
        if rank == 0:
            cost = np.array([ref.documents_cost(lengths[mb]).sum() for mb in mbs])
            fallback = sampler.last_plan.fallback
            print(f"step {step}: {took * 1e3:.1f} ms, loss {float(loss):.6f}, {args.method} "
                  f"imbalance {cost.max() / cost.mean():.3f}"
                  + (f" (fallback: {fallback})" if fallback else ""), flush=True)
    if rec is not None:
        rec.close()
        if rank == 0:
            print(f"recorded {args.steps} steps in {rec.events_dir}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
