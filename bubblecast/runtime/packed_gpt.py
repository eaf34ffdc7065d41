"""A GPT whose cost follows the documents packed into its micro-batches (``--model packed``).

Every micro-batch has one fixed shape, ``(1, budget)`` (``budget`` = the model's ``seq_len``),
so stock ``PipelineStage`` shape inference holds. It carries its document boundaries as a
second tensor of the same shape, ``documents`` (the document's number within the micro-batch
at each token, ``-1`` on padding; documents are packed from the left, padding last), passed to
every stage as a keyword argument of ``schedule.step`` (torch splits keyword tensors into
micro-batches like the inputs). From it each layer recomputes what it needs:

- the embedding's positions restart at 0 in every document;
- attention is causal within each document, computed document by document
  (``scaled_dot_product_attention(..., is_causal=True)`` on each document's own slice), so its
  CPU time grows with ``tokens_sq`` (sum of squared lengths), not with ``budget**2``: no dense
  ``T x T`` mask is ever built;
- padding costs (almost) nothing: every layer computes on the micro-batch's real tokens only
  and passes the padding through (the head gives it zero logits), so a micro-batch's time
  follows ``a * tokens + b * tokens_sq + c * documents + d``.

The loss is :func:`bubblecast.runtime.balanced_sampler.global_token_loss`: summed over the
micro-batch's tokens and divided by the loss tokens of the step's whole global batch (every
replica), with ``scale_grads=False``; gradients are summed over micro-batches and replicas,
so the update does not depend on how the documents were packed or split.

Imported only inside workers and tests (torch).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def segments(documents: torch.Tensor) -> list[int]:
    """Lengths of the documents of one row of document ids (``(T,)``, packed from the left,
    ``-1`` on padding), in order: the runs of equal ids.

    The work is bounded by the row's length whatever the values: a row of arbitrary ids (an
    uninitialized tensor, say, as a pipeline's shape inference may build from metadata)
    gives at most one segment per token, where counting per id value would allocate a bin
    for every value up to the largest."""
    real = documents[documents >= 0]
    if not len(real):
        return []
    return torch.unique_consecutive(real, return_counts=True)[1].tolist()


def document_positions(documents: torch.Tensor) -> torch.Tensor:
    """Positions restarting at 0 in every document (0 on padding), for ids ``(B, T)``."""
    out = torch.zeros_like(documents)
    for row in range(documents.shape[0]):
        lengths = segments(documents[row])
        if lengths:
            out[row, :sum(lengths)] = torch.cat([torch.arange(n) for n in lengths])
    return out


class PackedEmbedding(nn.Module):
    """Token plus position embeddings, positions restarting in every document."""

    def __init__(self, vocab: int, budget: int, hidden: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, hidden)
        self.positions = nn.Embedding(budget, hidden)

    def forward(self, idx: torch.Tensor, documents: torch.Tensor) -> torch.Tensor:
        return self.tokens(idx) + self.positions(document_positions(documents))


class PackedBlock(nn.Module):
    """Pre-norm transformer block on the real tokens of each row: attention causal within
    each document (one ``scaled_dot_product_attention`` per document), then a 4x GELU MLP;
    padding passes through unchanged."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)

    def _row(self, x: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        """One row ``(1, n, hidden)`` of ``n = sum(lengths)`` real tokens."""
        _, n, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=2)
        q, k, v = (z.view(1, n, self.heads, h // self.heads).transpose(1, 2)
                   for z in (q, k, v))
        parts, at = [], 0
        for length in lengths:
            end = at + length
            parts.append(F.scaled_dot_product_attention(q[:, :, at:end], k[:, :, at:end],
                                                        v[:, :, at:end], is_causal=True))
            at = end
        att = torch.cat(parts, dim=2) if len(parts) > 1 else parts[0]
        x = x + self.proj(att.transpose(1, 2).reshape(1, n, h))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    def forward(self, x: torch.Tensor, documents: torch.Tensor) -> torch.Tensor:
        rows = []
        for row in range(x.shape[0]):
            lengths = segments(documents[row])
            n = sum(lengths)
            if not n:
                rows.append(x[row:row + 1])
                continue
            done = self._row(x[row:row + 1, :n], lengths)
            rows.append(torch.cat([done, x[row:row + 1, n:]], dim=1) if n < x.shape[1]
                        else done)
        return torch.cat(rows) if len(rows) > 1 else rows[0]


class PackedHead(nn.Module):
    """Final LayerNorm and vocabulary projection of the real tokens; zero logits on padding
    (out of the loss)."""

    def __init__(self, hidden: int, vocab: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, x: torch.Tensor, documents: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        rows = []
        for row in range(b):
            n = int((documents[row] >= 0).sum())
            logits = self.out(self.ln(x[row:row + 1, :n]))
            if n < t:
                pad = logits.new_zeros(1, t - n, self.out.out_features)
                logits = torch.cat([logits, pad], dim=1)
            rows.append(logits)
        return torch.cat(rows) if len(rows) > 1 else rows[0]


class DocumentStack(nn.Sequential):
    """A stage's layers in order, each called with the micro-batch's ``documents`` (state-dict
    keys as ``nn.Sequential``'s)."""

    def forward(self, x: torch.Tensor, documents: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        for layer in self:
            x = layer(x, documents)
        return x


def construct(layers: int, index: int, *, hidden: int, heads: int, vocab: int,
              budget: int) -> nn.Module:
    """Layer ``index`` of ``layers``: the embedding first, the head last, blocks between."""
    if not 0 <= index < layers:
        raise IndexError(f"layer {index} out of range for {layers} layers")
    if index == 0:
        return PackedEmbedding(vocab, budget, hidden)
    if index == layers - 1:
        return PackedHead(hidden, vocab)
    return PackedBlock(hidden, heads)
