"""The packed GPT (issue 25 item 1): attention causal within each document, computed per
document, so a micro-batch's CPU time follows its ``tokens_sq``; documents independent of
their neighbours; padding out of the computation; the update independent of the packing."""

from __future__ import annotations

import time

import pytest
import torch

from bubblecast.errors import BubblecastError
from bubblecast.runtime.balanced_sampler import global_token_loss, loss_tokens, packed_microbatch
from bubblecast.runtime.networks import LayerModel
from bubblecast.runtime.packed_gpt import document_positions, segments
from bubblecast.runtime.train_config import ModelSpec, TrainConfig

VOCAB = 31


def _model(budget: int, layers: int = 4, hidden: int = 16, heads: int = 2,
           dtype: str = "float64") -> torch.nn.Module:
    spec = ModelSpec(kind="packed", layers=layers, hidden=hidden, seq_len=budget, vocab=VOCAB,
                     heads=heads, dtype=dtype)
    model = LayerModel.example(spec, seed=3)
    return model.stack([model.build(i) for i in range(layers)])


def _doc(seed: int, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (n,), generator=g)


def test_segments_and_positions() -> None:
    docs = packed_microbatch([_doc(0, 3), _doc(1, 2)], 8).documents
    assert segments(docs[0]) == [3, 2]
    assert document_positions(docs).tolist() == [[0, 1, 2, 0, 1, 0, 0, 0]]


def test_segments_of_arbitrary_ids_cost_one_per_token_at_most() -> None:
    """Ids as large as uninitialized memory holds: runs of equal ids, no bin per id value
    (``bincount`` would ask for ~40 GB here)."""
    huge = torch.tensor([5_000_000_000, 5_000_000_000, 7, -3, 5_000_000_000])
    assert segments(huge) == [2, 1, 1]


def test_a_document_does_not_see_its_neighbours_and_padding_gets_no_logits() -> None:
    stack = _model(64)
    a, b, c = _doc(1, 5), _doc(2, 9), _doc(3, 3)
    together = packed_microbatch([a, b, c], 64)
    alone = packed_microbatch([b], 64)
    with torch.no_grad():
        both = stack(together.tokens, documents=together.documents)
        solo = stack(alone.tokens, documents=alone.documents)
    assert torch.allclose(both[0, 5:14], solo[0, :9], atol=1e-12, rtol=0)
    assert both[0, 17:].abs().max() == 0  # padding: zero logits


def test_the_update_does_not_depend_on_the_packing() -> None:
    """The same documents packed two ways (2 and 3 micro-batches): equal gradients, float64."""
    docs = [_doc(10 + i, n) for i, n in enumerate((7, 12, 5, 9, 3, 11))]
    total = loss_tokens([len(d) for d in docs])

    def grads(groups: list[list[int]]) -> list[torch.Tensor]:
        stack = _model(64)
        for mb in groups:
            p = packed_microbatch([docs[i] for i in mb], 64)
            out = stack(p.tokens, documents=p.documents)
            global_token_loss(out, p.labels, total).backward()
        return [q.grad.clone() for q in stack.parameters()]

    one, two = grads([[0, 1, 2], [3, 4, 5]]), grads([[5, 0], [2, 4, 3], [1]])
    assert max(float((x - y).abs().max()) for x, y in zip(one, two, strict=True)) < 1e-12


def _seconds(stack: torch.nn.Module, lengths: list[int], budget: int, repeats: int = 7) -> float:
    p = packed_microbatch([_doc(i, n) for i, n in enumerate(lengths)], budget)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = stack(p.tokens, documents=p.documents)
        global_token_loss(out, p.labels, budget).backward()
        best = min(best, time.perf_counter() - t0)
    return best


def test_cpu_time_grows_with_tokens_sq_at_fixed_tokens() -> None:
    """1,024 tokens as one document (tokens_sq 1,048,576) against sixteen of 64 (65,536),
    forward and backward of one block, one thread, best of 7: the long document takes
    clearly longer (measured 1.7x here)."""
    torch.set_num_threads(1)
    stack = _model(1024, layers=3, hidden=64, heads=4, dtype="float32")
    _seconds(stack, [64] * 16, 1024, 2)  # warm up
    long, short = _seconds(stack, [1024], 1024), _seconds(stack, [64] * 16, 1024)
    assert long > 1.2 * short, (long, short)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"model": {"kind": "packed", "seq_len": 32}}, "token budget must be >= 64"),
    ({"model": {"kind": "gpt"}, "documents": "lognormal"}, "needs the packed model"),
    ({"model": {"kind": "packed", "seq_len": 64}, "planner": "balance"}, "needs a cost model"),
    ({"model": {"kind": "packed", "seq_len": 64}, "planner": "fast"}, "choose from"),
    ({"model": {"kind": "packed", "seq_len": 64}, "schedule": "interleaved",
      "microbatches": 4}, "single-chunk"),
])
def test_bad_packed_configs(kwargs: dict, message: str) -> None:
    with pytest.raises(BubblecastError, match=message):
        TrainConfig(**kwargs)


def test_a_document_longer_than_the_budget_is_refused_before_launch(tmp_path) -> None:
    lengths = tmp_path / "lengths.json"
    lengths.write_text("[12, 40, 200, 9]")
    with pytest.raises(BubblecastError, match=r"document of 200 tokens is longer than the "
                                              r"token budget 128; split it"):
        TrainConfig(model={"kind": "packed", "seq_len": 128}, documents=str(lengths))
    with pytest.raises(BubblecastError, match="neither a preset"):
        TrainConfig(model={"kind": "packed", "seq_len": 128}, documents="nowhere.json")
