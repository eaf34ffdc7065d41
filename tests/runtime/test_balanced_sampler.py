"""BalancedBatchSampler: every document once per epoch across replicas and steps, the budget
kept, one plan on every replica, the loader's cut of the stream, static vs balance; and the
packed-tensor helpers."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import bubblecast
from bubblecast.errors import BubblecastError
from bubblecast.policy import work_plan
from bubblecast.runtime.balanced_sampler import (
    IGNORE_INDEX,
    BalancedBatchSampler,
    document_mask,
    global_token_loss,
    loss_tokens,
    packed_microbatch,
)
from bubblecast.sim.documents import DocumentSource, next_fit

BUDGET = 1024


def _dataset(n: int = 700, seed: int = 0, kind: str = "long-tail") -> np.ndarray:
    return DocumentSource(kind, BUDGET).sample(np.random.default_rng(seed), n)


def _replicas(lengths, replicas: int = 3, **kw) -> list[BalancedBatchSampler]:
    kw = {"microbatches": 4, "token_budget": BUDGET, "stages": 2, "seed": 5, **kw}
    return [BalancedBatchSampler(lengths, replica=r, replicas=replicas, **kw)
            for r in range(replicas)]


def _run_epoch(samplers: list[BalancedBatchSampler]) -> list[list[list[list[int]]]]:
    """Per step, every replica's yield; asserts the replicas hold one plan per step."""
    steps = []
    for per_replica in zip(*samplers, strict=True):
        plans = [s.last_plan for s in samplers]
        assert all(p == plans[0] for p in plans)  # the same plan on every replica
        assert all(p is not plans[0] for p in plans[1:])  # computed by each one
        steps.append(list(per_replica))
    return steps


@pytest.mark.parametrize("method", ["balance", "static"])
@pytest.mark.parametrize("drop_last", [False, True])
def test_every_document_exactly_once_per_epoch_within_budget(method, drop_last):
    lengths = _dataset()
    samplers = _replicas(lengths, method=method, drop_last=drop_last,
                         speeds=[1.0, 1.6, 1.0] if method == "balance" else None)
    steps = _run_epoch(samplers)
    assert len(steps) == len(samplers[0]) > 3
    seen = [i for step in steps for mbs in step for mb in mbs for i in mb]
    assert len(seen) == len(set(seen))
    order = samplers[0].order()
    if drop_last:  # exactly the documents before the last, partial step
        kept = samplers[0].steps()
        assert sorted(seen) == sorted(np.concatenate(kept).tolist())
        assert len(seen) < len(lengths)
    else:
        assert sorted(seen) == list(range(len(lengths)))
    for step in steps:
        for mbs in step:
            for mb in mbs:
                assert int(lengths[mb].sum()) <= BUDGET
        assert sum(len(mbs) for mbs in step) == 12
    assert sorted(order.tolist()) == list(range(len(lengths)))


def test_steps_are_the_loaders_cut_of_the_shuffled_stream():
    lengths = _dataset()
    s = _replicas(lengths, replicas=2)[0]
    order = s.order()
    steps = s.steps()
    assert np.array_equal(np.concatenate(steps), order)  # consecutive, in stream order
    for k, idx in enumerate(steps):
        bins = next_fit(lengths[idx], BUDGET)
        if k < len(steps) - 1:
            assert bins[-1] + 1 == 8  # fills exactly replicas x microbatches
            nxt = lengths[steps[k + 1][0]]
            last = lengths[idx][bins == 7].sum()
            assert last + nxt > BUDGET  # the next step's first document did not fit
        else:
            assert bins[-1] + 1 <= 8


def test_static_is_the_loaders_plan_and_balance_the_planners():
    lengths = _dataset(kind="long-tail")
    static = _replicas(lengths, replicas=2, method="static")
    balance = _replicas(lengths, replicas=2)
    config = work_plan.PlanConfig(BUDGET, 2, 4, 2)
    differ = full = 0
    for a0, a1, b0, b1 in zip(*static, *balance, strict=True):
        x, idx = static[0].last_lengths, static[0].last_indices
        assert np.array_equal(x, balance[1].last_lengths)
        assert static[1].last_plan == static[0].last_plan
        if next_fit(x, BUDGET)[-1] + 1 < 8:
            continue  # the epoch's last, partial step
        full += 1
        want_static = work_plan.plan_static(x, config)
        want_balance = work_plan.plan_batch(x, config, method="tokens")
        assert [a0, a1] == [[[int(idx[i]) for i in mb] for mb in r]
                            for r in want_static.microbatches]
        assert [b0, b1] == [[[int(idx[i]) for i in mb] for mb in r]
                            for r in want_balance.microbatches]
        differ += [a0, a1] != [b0, b1]
    assert full == len(static[0].steps()) - 1 > 3
    assert differ == full  # the planner changed every full step's packing
    assert static[0].last_plan.method == "static"
    assert balance[0].last_plan.method == "tokens"


def test_set_epoch_reshuffles_and_is_reproducible():
    lengths = _dataset(200)
    a, b = _replicas(lengths, replicas=1)[0], _replicas(lengths, replicas=1)[0]
    first = list(a)
    a.set_epoch(1)
    assert list(a) != first
    b.set_epoch(1)
    assert list(b) == list(a)
    plain = BalancedBatchSampler(lengths, replica=0, replicas=1, microbatches=4,
                                 token_budget=BUDGET, shuffle=False)
    assert np.array_equal(plain.order(), np.arange(200))


def test_callable_lengths_and_callable_speeds():
    lengths = _dataset(300)
    calls = []

    def speeds():
        calls.append(1)
        return [1.0, 2.0]

    a = BalancedBatchSampler(lambda i: int(lengths[i]), num_documents=300, replica=1,
                             replicas=2, microbatches=4, token_budget=BUDGET, stages=4,
                             speeds=speeds)
    b = BalancedBatchSampler(list(lengths), replica=1, replicas=2, microbatches=4,
                             token_budget=BUDGET, stages=4, speeds=[1.0, 2.0])
    assert list(a) == list(b)
    assert len(calls) == len(a)
    assert a.last_plan.counts[1] < a.last_plan.counts[0] or a.last_plan.fallback


def test_a_fallback_is_logged_and_recorded(caplog):
    # the epoch's last step has 2 documents for 4 micro-batches: the loader's packing, padded
    lengths = [600, 500, 400, 300, 900, 100, 50, 60]
    a, b = (BalancedBatchSampler(lengths, replica=r, replicas=2, microbatches=2,
                                 token_budget=1024, shuffle=False) for r in range(2))
    with caplog.at_level(logging.WARNING, logger="bubblecast.plan"):
        got = list(zip(a, b, strict=True))
    assert a.last_plan.fallback and "padded with empty micro-batches" in a.last_plan.fallback
    assert a.last_plan == b.last_plan
    assert any("fall-back" in r.getMessage() for r in caplog.records)
    assert got[-1] == ([[6, 7], []], [[], []])  # 50 + 60 in one micro-batch, the rest empty
    assert sorted(i for step in got for mbs in step for mb in mbs for i in mb) == \
        list(range(8))


@pytest.mark.parametrize("kwargs, match", [
    ({"replica": 2}, r"^replica: must be an integer in \[0, 2\), got 2$"),
    ({"method": "lpt"}, r"^method: unknown 'lpt'"),
    ({"token_budget": 100}, r"^lengths\[0\]: document of 600 tokens is longer than the token "
                            r"budget 100; split it"),
])
def test_bad_arguments_name_the_value(kwargs, match):
    kw = {"replica": 0, "replicas": 2, "microbatches": 2, "token_budget": 1024, **kwargs}
    with pytest.raises(BubblecastError, match=match):
        list(BalancedBatchSampler([600, 500, 400, 300, 900], **kw))


def test_a_callable_needs_num_documents():
    with pytest.raises(BubblecastError, match="^num_documents: an integer >= 1 is required"):
        BalancedBatchSampler(len, replica=0, replicas=1, microbatches=2, token_budget=64)


def test_it_is_a_torch_sampler_exported_by_the_package():
    assert bubblecast.BalancedBatchSampler is BalancedBatchSampler
    assert issubclass(BalancedBatchSampler, torch.utils.data.Sampler)


# ---- packed tensors ----------------------------------------------------------------------


def test_packed_microbatch_positions_labels_and_padding():
    p = packed_microbatch([torch.tensor([5, 6, 7]), [8, 9]], 8, pad_id=0)
    assert p.tokens.tolist() == [[5, 6, 7, 8, 9, 0, 0, 0]]
    assert p.positions.tolist() == [[0, 1, 2, 0, 1, 0, 0, 0]]
    assert p.documents.tolist() == [[0, 0, 0, 1, 1, -1, -1, -1]]
    i = IGNORE_INDEX
    assert p.labels.tolist() == [[6, 7, i, 9, i, i, i, i]]
    assert int((p.labels != i).sum()) == loss_tokens([3, 2])
    with pytest.raises(BubblecastError, match="9 tokens do not fit the token budget 8"):
        packed_microbatch([[1] * 5, [2] * 4], 8)


def test_document_mask_is_causal_within_each_document_only():
    m = document_mask(torch.tensor([[0, 0, 1, 1, 1, -1]]))[0, 0]
    want = torch.tensor([
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [0, 0, 1, 0, 0, 0],
        [0, 0, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 0],
        [0, 0, 0, 0, 0, 1],
    ], dtype=torch.bool)
    assert torch.equal(m, want)


def test_global_token_loss_is_the_sum_over_global_tokens():
    torch.manual_seed(0)
    logits = torch.randn(1, 4, 5, dtype=torch.float64)
    labels = torch.tensor([[1, IGNORE_INDEX, 3, 4]])
    each = torch.nn.functional.cross_entropy(logits[0], labels[0], ignore_index=IGNORE_INDEX,
                                             reduction="none")
    assert float(global_token_loss(logits, labels, 10)) == pytest.approx(
        float(each.sum()) / 10, rel=1e-15)


# ---- the example under torchrun ------------------------------------------------------------

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "balanced_pipeline.py"


def _example(tmp_path: Path, method: str, *extra: str) -> list[float]:
    """Run the example on 2 ranks; its per-step losses (rank 0's lines)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", str(EXAMPLE), "--method", method, "--steps", "3", "--documents", "600",
           "--token-budget", "256", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = [float(m) for m in re.findall(r"^step \d+: [\d.]+ ms, loss ([\d.]+)",
                                           proc.stdout, re.M)]
    assert len(losses) == 3, proc.stdout
    return losses


@pytest.mark.dist
def test_the_example_trains_the_same_under_static_and_balance_and_records(tmp_path):
    """Same documents, same model: the losses of static and balanced packing agree (the loss
    is the global token mean); the balanced run's telemetry has the document columns."""
    static = _example(tmp_path, "static")
    balanced = _example(tmp_path, "balance", "--out", str(tmp_path / "tel"))
    assert static == pytest.approx(balanced, abs=1e-5)
    assert static[2] < static[0]  # it trains
    f = bubblecast.read_events(tmp_path / "tel" / "run_id=balanced-balance").frame
    compute = f.loc[f["op"] == "F"]
    assert len(compute) == 3 * 2 * 4 and (compute["documents"] >= 1).all()
    assert ((compute["tokens"] <= 256) & (compute["tokens_sq"] <= compute["tokens"] ** 2)).all()
