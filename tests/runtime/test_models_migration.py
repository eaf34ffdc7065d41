"""Example models (partition-independent init, deterministic data) and per-layer state packing."""

from __future__ import annotations

import torch

from bubblecast.runtime.migration import install_state, pack_layer, plan_moves, unpack_layer
from bubblecast.runtime.networks import (
    build_layer,
    empty_layer,
    loss_fn,
    make_batch,
    make_optimizer,
)
from bubblecast.runtime.train_config import ModelSpec

GPT = ModelSpec(kind="gpt", layers=5, hidden=16, seq_len=8, vocab=32, heads=2, dtype="float64")


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_layer_init_depends_only_on_seed_and_index() -> None:
    first = build_layer(GPT, 2, seed=3)
    build_layer(GPT, 1, seed=3)  # building other layers in between changes nothing
    torch.manual_seed(12345)  # nor does the global RNG
    assert _same(first, build_layer(GPT, 2, seed=3))
    assert not _same(first, build_layer(GPT, 2, seed=4))
    assert not _same(build_layer(GPT, 1, seed=3), build_layer(GPT, 2, seed=3))
    kinds = [type(build_layer(GPT, i, 0)).__name__ for i in range(GPT.layers)]
    assert kinds == ["Embedding", "Block", "Block", "Block", "Head"]
    assert next(first.parameters()).dtype == torch.float64


def test_batches_are_deterministic_and_shifted() -> None:
    x, y = make_batch(GPT, 0, 5, 4)
    x2, y2 = make_batch(GPT, 0, 5, 4)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert not torch.equal(x, make_batch(GPT, 0, 6, 4)[0])
    assert torch.equal(x[:, 1:], y[:, :-1])  # next-token targets
    mlp = ModelSpec(kind="mlp", layers=3, hidden=8)
    xm, ym = make_batch(mlp, 1, 0, 6)
    assert xm.shape == (6, 8) and ym.shape == (6, 8) and xm.dtype == torch.float32


def _trained(spec: ModelSpec, index: int,
             optimizer: str) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    layer = build_layer(spec, index, 0)
    opt = make_optimizer(optimizer, list(layer.parameters()), lr=1e-2)
    x = torch.randn(4, spec.hidden, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for _ in range(2):
        layer(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    return layer, opt


def test_pack_unpack_carries_parameters_and_optimizer_state() -> None:
    spec = ModelSpec(kind="mlp", layers=3, hidden=8, dtype="float64")
    for name in ("adam", "sgd", "adamw"):
        layer, opt = _trained(spec, 1, name)
        header, tensors = pack_layer(layer, opt)
        assert any(n.startswith("o|") for n in header["names"])
        copy = empty_layer(spec, 1)
        states = unpack_layer(copy, header, [t.clone() for t in tensors])
        assert _same(layer, copy)
        opt2 = make_optimizer(name, list(copy.parameters()), lr=1e-2)
        for pname, p in copy.named_parameters():
            install_state(opt2, p, states[pname])
        x = torch.ones(2, spec.hidden, dtype=torch.float64)
        for lay, o in ((layer, opt), (copy, opt2)):
            lay(x).sum().backward()
            o.step()
        assert _same(layer, copy), name  # the next update is identical only with the state


def test_dropping_optimizer_state_changes_the_next_update() -> None:
    spec = ModelSpec(kind="mlp", layers=3, hidden=8, dtype="float64")
    layer, opt = _trained(spec, 0, "adam")
    header, tensors = pack_layer(layer, opt, drop_optimizer_state=True)
    assert not any(n.startswith("o|") for n in header["names"])
    copy = empty_layer(spec, 0)
    unpack_layer(copy, header, tensors)
    opt2 = make_optimizer("adam", list(copy.parameters()), lr=1e-2)
    x = torch.ones(2, spec.hidden, dtype=torch.float64)
    for lay, o in ((layer, opt), (copy, opt2)):
        lay(x).sum().backward()
        o.step()
    assert not _same(layer, copy)


def test_plan_moves_and_loss() -> None:
    moves = plan_moves([0, 0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1, 1, 1])
    assert [(m.layer, m.src, m.dst) for m in moves] == [(3, 0, 1)]
    assert plan_moves([0, 1], [0, 1]) == []
    logits = torch.zeros(2, 3, 5)
    assert loss_fn(GPT)(logits, torch.zeros(2, 3, dtype=torch.long)).item() > 0
