"""sim/documents: the data loader's packing, the seeded document stream, micro-batch statistics,
the attention cost model and the bad-input errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bubblecast.errors import BubblecastError
from bubblecast.sim.documents import (
    MIN_LENGTH,
    DocumentSource,
    WorkCost,
    check_lengths,
    draw_batches,
    load_documents,
    microbatch_stats,
    next_fit,
)

SETTINGS = settings(max_examples=60, deadline=None)


@st.composite
def budget_and_lengths(draw: st.DrawFn) -> tuple[int, list[int]]:
    budget = draw(st.integers(1, 300))
    lengths = draw(st.lists(st.integers(1, budget), min_size=0, max_size=60))
    return budget, lengths


@SETTINGS
@given(case=budget_and_lengths())
def test_next_fit_is_sequential_first_fit(case):
    budget, lengths = case
    owner = next_fit(lengths, budget)
    assert owner.shape == (len(lengths),)
    if not lengths:
        return
    assert owner[0] == 0
    steps = np.diff(owner)
    assert set(steps.tolist()) <= {0, 1}  # in arrival order, one micro-batch after another
    used = np.bincount(owner, weights=lengths)
    assert used.max() <= budget and (used > 0).all()
    # a document opens a new micro-batch exactly when it does not fit the current one
    for i in np.flatnonzero(steps) + 1:
        assert used[owner[i - 1]] + lengths[i] > budget


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), bins=st.integers(1, 12), steps=st.integers(1, 4),
       kind=st.sampled_from(["lognormal", "long-tail"]),
       budget=st.sampled_from([64, 512, 4096]))
def test_draw_batches_fill_exactly_the_bins(seed, bins, steps, kind, budget):
    source = DocumentSource(kind, budget)
    batches = draw_batches(source, seed, steps, bins)
    assert len(batches) == steps
    for s, batch in enumerate(batches):
        assert batch.dtype == np.int64
        assert batch.min() >= min(MIN_LENGTH, budget) and batch.max() <= budget
        owner = next_fit(batch, budget)
        assert owner[-1] == bins - 1  # exactly `bins` micro-batches
        if s + 1 < steps:  # the next step's first document did not fit this step's last one
            last = batch[owner == bins - 1].sum()
            assert last + batches[s + 1][0] > budget
    again = draw_batches(source, seed, steps, bins)
    assert all(np.array_equal(a, b) for a, b in zip(batches, again, strict=True))


def test_seeds_and_presets_shape_the_stream():
    lognormal = np.concatenate(draw_batches(DocumentSource("lognormal", 4096), 1, 20, 8))
    tail = np.concatenate(draw_batches(DocumentSource("long-tail", 4096), 1, 20, 8))
    other = np.concatenate(draw_batches(DocumentSource("lognormal", 4096), 2, 20, 8))
    assert lognormal.max() <= 4096 // 4 and lognormal.min() >= MIN_LENGTH
    assert tail.max() > 4096 // 4  # single documents far beyond the short regime's cap
    assert not np.array_equal(lognormal[:100], other[:100])


def test_file_source_samples_its_lengths():
    source = DocumentSource("file", 256, (10, 100, 250), "mine")
    drawn = source.sample(np.random.default_rng(0), 500)
    assert set(drawn.tolist()) == {10, 100, 250}
    assert source.mean_length() == pytest.approx(120.0, rel=1e-12)
    assert DocumentSource.from_json(json.loads(json.dumps(source.to_json()))) == source
    preset = DocumentSource("long-tail", 1024)
    assert DocumentSource.from_json(preset.to_json()) == preset


@SETTINGS
@given(lengths=st.lists(st.integers(1, 50), min_size=1, max_size=40), bins=st.integers(1, 6),
       seed=st.integers(0, 1000))
def test_microbatch_stats_sum_each_micro_batch(lengths, bins, seed):
    owner = np.random.default_rng(seed).integers(0, bins, len(lengths))
    tokens, tokens_sq, documents = microbatch_stats(np.array(lengths), owner, bins)
    x = np.array(lengths)
    for j in range(bins):
        assert tokens[j] == x[owner == j].sum()
        assert tokens_sq[j] == (x[owner == j] ** 2).sum()
        assert documents[j] == (owner == j).sum()


@pytest.mark.parametrize("share", [0.0, 0.25, 0.5, 0.9])
def test_full_microbatch_of_mean_length_documents_costs_one(share):
    budget, mean = 4096, 256.0
    cost = WorkCost.attention(share, mean, budget)
    n = budget // 256
    full = cost.microbatch(budget, n * 256.0 ** 2, n)
    assert float(full) == pytest.approx(1.0, rel=1e-12)
    # quadratic in document length: one 1024-token document costs more than four of 256
    one, four = cost.documents_cost([1024]), cost.documents_cost([256] * 4).sum()
    assert (one[0] > four) == (share > 0)
    assert cost.microbatch(0, 0.0, 0) == 0.0  # an empty micro-batch costs nothing


def test_document_costs_add_up_to_the_microbatch():
    cost = WorkCost(per_token=0.5, per_token_sq=0.01, per_document=2.0, per_microbatch=3.0)
    lengths = np.array([10, 20, 30])
    whole = cost.microbatch(lengths.sum(), (lengths ** 2).sum(), 3)
    assert float(whole) == pytest.approx(cost.documents_cost(lengths).sum() + 3.0, rel=1e-12)
    assert WorkCost.from_json(cost.to_json()) == cost


@pytest.mark.parametrize(("make", "field"), [
    (lambda: WorkCost.attention(1.0, 100, 4096), "--attention-share"),
    (lambda: WorkCost.attention(-0.1, 100, 4096), "--attention-share"),
    (lambda: WorkCost(per_token=0.0), "cost"),
    (lambda: WorkCost(per_token=-1.0), "per_token"),
    (lambda: DocumentSource("uniform", 4096), "unknown preset"),
    (lambda: DocumentSource("lognormal", 10), "--token-budget"),
])
def test_bad_cost_and_source_parameters(make, field):
    with pytest.raises(BubblecastError, match=field):
        make()


@pytest.mark.parametrize(("lengths", "min_documents", "match"), [
    ([], 1, r"lengths: the batch is empty"),
    ([5, 6], 3, r"has 2 documents, fewer than the 3 micro-batches"),
    ([5, -1], 1, r"lengths\[1\]: length -1 must be >= 1"),
    ([5, 0], 1, r"lengths\[1\]: length 0 must be >= 1"),
    ([5.0, 2.5], 1, r"lengths\[1\]: .*2\.5.* is not an integer"),
    ([5, 200], 1, r"lengths\[1\]: document of 200 tokens is longer than the token budget 100; "
                  r"split it into pieces of at most 100 tokens"),
    ([[1, 2]], 1, r"flat list"),
    (["a"], 1, r"integer document lengths"),
])
def test_check_lengths_names_the_problem(lengths, min_documents, match):
    with pytest.raises(BubblecastError, match=match):
        check_lengths(lengths, 100, "lengths", min_documents)


def test_check_lengths_accepts_integral_floats():
    assert check_lengths([3.0, 7], 10).tolist() == [3, 7]


def test_load_documents_presets_and_files(tmp_path):
    assert load_documents("long-tail", 2048) == DocumentSource("long-tail", 2048)
    plain, keyed = tmp_path / "plain.json", tmp_path / "keyed.json"
    plain.write_text("[100, 200, 300]")
    keyed.write_text(json.dumps({"lengths": [7, 9]}))
    assert load_documents(str(plain), 512).lengths == (100, 200, 300)
    source = load_documents(str(keyed), 512)
    assert (source.kind, source.name, source.lengths) == ("file", "keyed", (7, 9))


@pytest.mark.parametrize(("content", "match"), [
    (None, r"neither a preset \(lognormal, long-tail\) nor a file"),
    ("not json", r"not valid JSON"),
    ('{"sizes": [1]}', r"expected a list of lengths"),
    ("[10, 600]", r"lengths\[1\]: document of 600 tokens is longer than the token budget 512"),
])
def test_load_documents_refuses_bad_files(tmp_path, content, match):
    path = tmp_path / "docs.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(BubblecastError, match=match):
        load_documents(str(path), 512)
