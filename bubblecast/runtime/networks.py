"""Example models as ordered layer lists, plus their deterministic data and loss.

Layer ``i`` is built from its own seed (``seed``, ``i``), so its initial weights do not depend
on which rank builds it or how the model is partitioned: a rank builds only the layers it
owns, and every partition starts from the same model. Imported only inside workers (torch).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache, partial

import torch
import torch.nn.functional as F
from torch import nn

from bubblecast.runtime.train_config import ModelSpec

_LAYER_SALT = 1_000_003
_DATA_SALT = 7_919


def torch_dtype(spec: ModelSpec) -> torch.dtype:
    return torch.float64 if spec.dtype == "float64" else torch.float32


class MLPLayer(nn.Module):
    """Linear(hidden, hidden), followed by tanh except on the last layer."""

    def __init__(self, hidden: int, activation: bool) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        return torch.tanh(y) if self.activation else y


class Embedding(nn.Module):
    """Token plus learned position embeddings: (batch, seq) ints -> (batch, seq, hidden)."""

    def __init__(self, vocab: int, seq_len: int, hidden: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, hidden)
        self.positions = nn.Embedding(seq_len, hidden)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.tokens(idx) + self.positions(pos)


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention then a 4x GELU MLP."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=2)
        q, k, v = (z.view(b, t, self.heads, h // self.heads).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, h))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Head(nn.Module):
    """Final LayerNorm and projection to vocabulary logits."""

    def __init__(self, hidden: int, vocab: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(x))


def _construct(spec: ModelSpec, index: int) -> nn.Module:
    if not 0 <= index < spec.layers:
        raise IndexError(f"layer {index} out of range for {spec.layers} layers")
    if spec.kind == "packed":
        from bubblecast.runtime.packed_gpt import construct

        return construct(spec.layers, index, hidden=spec.hidden, heads=spec.heads,
                         vocab=spec.vocab, budget=spec.seq_len)
    if spec.kind == "mlp":
        return MLPLayer(spec.hidden, activation=index < spec.layers - 1)
    if index == 0:
        return Embedding(spec.vocab, spec.seq_len, spec.hidden)
    if index == spec.layers - 1:
        return Head(spec.hidden, spec.vocab)
    return Block(spec.hidden, spec.heads)


def build_layer(spec: ModelSpec, index: int, seed: int,
                device: torch.device | str = "cpu") -> nn.Module:
    """Global layer ``index`` of the model, initialised from (``seed``, ``index``) only."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed * _LAYER_SALT + index)
        layer = _construct(spec, index)
    return layer.to(device=device, dtype=torch_dtype(spec))


def empty_layer(spec: ModelSpec, index: int, device: torch.device | str = "cpu") -> nn.Module:
    """Layer ``index`` with uninitialised storage, to be filled by ``load_state_dict``."""
    with torch.device("meta"):
        layer = _construct(spec, index).to(torch_dtype(spec))
    return layer.to_empty(device=device)


@lru_cache(maxsize=8)
def _teacher(seed: int, hidden: int, dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed * _DATA_SALT + 17)
    return (torch.randn(hidden, hidden, generator=gen, dtype=torch.float64) / hidden**0.5).to(dtype)


def make_batch(spec: ModelSpec, seed: int, step: int,
               batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The (input, target) batch of ``step``: identical on every rank and every partition.
    (The packed model reads documents instead: :mod:`bubblecast.runtime.document_loader`.)"""
    if spec.kind == "packed":
        raise ValueError("the packed model's batches come from its document loader")
    gen = torch.Generator().manual_seed((seed * _DATA_SALT + step) % (2**63))
    if spec.kind == "mlp":
        dtype = torch_dtype(spec)
        x = torch.randn(batch_size, spec.hidden, generator=gen, dtype=torch.float64).to(dtype)
        return x, torch.tanh(x @ _teacher(seed, spec.hidden, dtype))
    # Arithmetic sequences mod vocab: the next token follows from the context.
    start = torch.randint(0, spec.vocab, (batch_size, 1), generator=gen)
    stride = torch.randint(1, max(2, spec.vocab // 4), (batch_size, 1), generator=gen)
    t = torch.arange(spec.seq_len + 1).unsqueeze(0)
    seq = (start + stride * t) % spec.vocab
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def loss_fn(spec: ModelSpec) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Per-micro-batch loss (mean-reduced, as the schedules' gradient scaling assumes)."""
    if spec.kind == "mlp":
        return F.mse_loss
    if spec.kind == "packed":
        raise ValueError("the packed model's loss is global_token_loss over the step's tokens")
    return _lm_loss


def _no_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    raise ValueError("the packed model's loss is global_token_loss over the step's tokens")


def _lm_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())


def make_optimizer(name: str, params: list[torch.nn.Parameter], lr: float, momentum: float = 0.9,
                   weight_decay: float = 0.0) -> torch.optim.Optimizer:
    """The run's optimizer over ``params``; every rank uses the same hyper-parameters."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)


@dataclass
class LayerModel:
    """Any model as an ordered list of ``layers`` layers, as the trainer needs it.

    ``build(i)`` returns layer ``i`` (on CPU) with the same initial weights on every rank and
    for every partition; ``batch(step, batch_size)`` the (input, target) of a step, the same
    on every rank; ``loss(output, target)`` a mean-reduced micro-batch loss; ``empty(i)``
    (optional) layer ``i`` with storage to be overwritten (defaults to ``build``).
    ``packed``: the layers take the micro-batch's ``documents`` too (the packed GPT: its
    batches and loss come from the trainer's document loader, not ``batch``/``loss``).
    """

    layers: int
    build: Callable[[int], nn.Module]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    batch: Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]
    tokens_per_sample: int = 1
    empty: Callable[[int], nn.Module] | None = None
    packed: bool = False

    def make_empty(self, index: int) -> nn.Module:
        return (self.empty or self.build)(index)

    @classmethod
    def example(cls, spec: ModelSpec, seed: int) -> LayerModel:
        """The built-in MLP, GPT or packed GPT of ``spec``."""
        packed = spec.kind == "packed"
        return cls(layers=spec.layers, build=partial(build_layer, spec, seed=seed),
                   loss=_no_loss if packed else loss_fn(spec),
                   batch=partial(make_batch, spec, seed),
                   tokens_per_sample=spec.tokens_per_sample(),
                   empty=partial(empty_layer, spec), packed=packed)

    def stack(self, layers: list[nn.Module]) -> nn.Module:
        """One stage's module: its layers in order (``packed``: each given the documents)."""
        if self.packed:
            from bubblecast.runtime.packed_gpt import DocumentStack

            return DocumentStack(*layers)
        return nn.Sequential(*layers)

    @classmethod
    def from_sequential(cls, model: nn.Sequential,
                        loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                        batch: Callable[[int, int], tuple[torch.Tensor, torch.Tensor]],
                        tokens_per_sample: int = 1) -> LayerModel:
        """Layers of an ``nn.Sequential`` (every rank must construct the same one, e.g. under
        the same seed); each rank keeps deep copies of the layers it owns."""
        return cls(layers=len(model), build=lambda i: copy.deepcopy(model[i]), loss=loss,
                   batch=batch, tokens_per_sample=tokens_per_sample)
