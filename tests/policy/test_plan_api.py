"""``bubblecast.plan_batch``: the public planner (policy/plan_api.py), its cost arguments and
its one-line errors."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import bubblecast
from bubblecast.errors import BubblecastError
from bubblecast.policy import plan_api, work_plan
from bubblecast.sim.documents import DocumentSource, WorkCost, draw_batches


def _lengths(total: int = 8, seed: int = 0, budget: int = 1024, kind: str = "lognormal"
             ) -> np.ndarray:
    """A step's global batch as the data loader cuts it: the documents of a seeded stream
    that fill ``total`` micro-batches of ``budget`` tokens by sequential first-fit."""
    return draw_batches(DocumentSource(kind, budget), seed, 1, total)[0]


def _check_plan(plan: bubblecast.WorkPlan, lengths: np.ndarray, budget: int, total: int) -> None:
    """Every document once, no micro-batch over budget, ``total`` micro-batches in all."""
    placed = [i for r in plan.microbatches for mb in r for i in mb]
    assert sorted(placed) == list(range(len(lengths)))
    assert sum(plan.counts) == total
    for r in plan.microbatches:
        for mb in r:
            assert int(lengths[list(mb)].sum()) <= budget


def test_public_names_resolve_to_the_planner_types():
    assert bubblecast.plan_batch is plan_api.plan_batch
    assert bubblecast.WorkCost is WorkCost
    assert bubblecast.PlanConfig is work_plan.PlanConfig
    assert bubblecast.WorkPlan is work_plan.WorkPlan


def test_cost_none_is_token_balancing_through_the_planner():
    x = _lengths(8)
    plan = bubblecast.plan_batch(x, token_budget=1024, replicas=2, microbatches=4, stages=2)
    config = work_plan.PlanConfig(1024, 2, 4, 2)
    want = work_plan.plan_batch(x, config, work_plan.TOKENS, None, "tokens")
    assert plan.to_json() == want.to_json()
    assert plan.method == "tokens" and plan.fallback is None


@pytest.mark.parametrize("seed", range(6))
def test_every_document_placed_once_within_budget(seed):
    budget, m = 512 + 256 * seed, 2 + seed
    x = _lengths(3 * m, seed, budget, "long-tail" if seed % 2 else "lognormal")
    speeds = [1.0, 1.0 + 0.2 * seed, 1.0]
    plan = bubblecast.plan_batch(x, token_budget=budget, replicas=3, microbatches=m, stages=2,
                                 cost={"per_token": 1.0, "per_token_sq": 1.0 / budget},
                                 speeds=speeds)
    _check_plan(plan, x, budget, 3 * m)


def test_a_slow_replica_gets_fewer_microbatches():
    x = _lengths(16, 3, 2048)
    plan = bubblecast.plan_batch(x, token_budget=2048, replicas=2, microbatches=8, stages=4,
                                 speeds=[1.0, 2.0])
    assert plan.counts[1] < plan.counts[0]
    assert sum(plan.counts) == 16


def test_cost_dict_equals_the_workcost():
    x = _lengths(6, 1)
    coeffs = {"per_token": 0.5, "per_token_sq": 0.01, "per_microbatch": 2.0}
    a = bubblecast.plan_batch(x, token_budget=1024, replicas=2, microbatches=3, cost=coeffs)
    b = bubblecast.plan_batch(x, token_budget=1024, replicas=2, microbatches=3,
                              cost=WorkCost(**coeffs))
    assert a.to_json() == b.to_json()
    assert a.method == "balance"
    assert a.cost != bubblecast.plan_batch(x, token_budget=1024, replicas=2,
                                           microbatches=3).cost


class FakeCostModel:
    """The loaded-model contract: ``.work_cost()`` and ``.kind_weights()``."""

    def __init__(self, tokens_sq: bool = True) -> None:
        self.tokens_sq = tokens_sq

    def work_cost(self) -> WorkCost:
        return WorkCost(per_token=1e-3, per_token_sq=2e-6)

    def kind_weights(self) -> tuple[float, float, float]:
        return (1.0, 2.0, 0.0)


@pytest.fixture
def cost_model_module(monkeypatch):
    """``bubblecast.forecast.cost_modeldir``'s ``require_tokens_sq`` refusing models trained
    without ``tokens_sq`` (the fake's flag) and ``load_cost_model`` returning a fake model."""
    import bubblecast.forecast.cost_modeldir as module

    loaded: list[str] = []

    def require_tokens_sq(model, where):
        if not model.tokens_sq:
            raise BubblecastError(f"cost model {where} was trained without tokens_sq")

    def load_cost_model(source, tracking_uri=None):
        loaded.append(source)
        model = FakeCostModel(tokens_sq="old" not in source)
        model.source_ = source
        return model

    monkeypatch.setattr(module, "require_tokens_sq", require_tokens_sq)
    monkeypatch.setattr(module, "load_cost_model", load_cost_model)
    return loaded


def test_a_loaded_cost_model_sets_cost_and_kind_weights(cost_model_module):
    x = _lengths(8, 2)
    plan = bubblecast.plan_batch(x, token_budget=1024, replicas=2, microbatches=4, stages=2,
                                 cost=FakeCostModel())
    config = work_plan.PlanConfig(1024, 2, 4, 2, kind_weights=(1.0, 2.0, 0.0))
    want = work_plan.plan_batch(x, config, FakeCostModel().work_cost(), None, "balance")
    assert plan.to_json() == want.to_json()


def test_a_cost_model_directory_is_loaded(cost_model_module, tmp_path):
    x = _lengths(8, 2)
    plan = bubblecast.plan_batch(x, token_budget=1024, replicas=2, microbatches=4, stages=2,
                                 cost=tmp_path / "model")
    assert cost_model_module == [str(tmp_path / "model")]
    assert plan.to_json() == bubblecast.plan_batch(
        x, token_budget=1024, replicas=2, microbatches=4, stages=2,
        cost=FakeCostModel()).to_json()


def test_a_cost_model_without_tokens_sq_is_refused(cost_model_module):
    with pytest.raises(BubblecastError, match="^cost model models:/old@prod was trained "
                       "without tokens_sq$"):
        bubblecast.plan_batch(_lengths(), token_budget=1024, cost="models:/old@prod")
    with pytest.raises(BubblecastError, match="^cost model cost was trained without"):
        bubblecast.plan_batch(_lengths(), token_budget=1024, cost=FakeCostModel(False))


@pytest.mark.parametrize("lengths, match", [
    ([10, 2000, 5, 7], r"^lengths\[1\]: document of 2000 tokens is longer than the token budget "
                    r"1024; split it into pieces of at most 1024 tokens"),
    ([], r"^lengths: the batch is empty$"),
    ([10, 20, 30], r"^lengths: the batch has 3 documents, fewer than the 4 micro-batches"),
    ([10, -5, 30, 40], r"^lengths\[1\]: length -5 must be >= 1$"),
    ([10, 2.5, 30, 40], r"^lengths\[1\]: length .*2\.5.* is not an integer$"),
    (["a", "b", "c", "d"], r"^lengths: expected integer document lengths"),
])
def test_bad_lengths_name_the_value(lengths, match):
    with pytest.raises(BubblecastError, match=match) as err:
        bubblecast.plan_batch(lengths, token_budget=1024, replicas=2, microbatches=2)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("cost, match", [
    ({"per_token": 1.0, "per_tokn_sq": 1.0}, r"^cost\.per_tokn_sq: unknown cost coefficient"),
    ({"per_token": True}, r"^cost\.per_token: must be a number, got True$"),
    ({"per_token": -1.0}, r"^cost 'per_token': must be a finite number >= 0"),
    ({"per_token": 0.0}, r"^cost: every coefficient is 0$"),
    (3.0, r"^cost: expected None, a WorkCost, a dict of coefficients, .* got float$"),
])
def test_bad_cost_names_the_field(cost, match):
    with pytest.raises(BubblecastError, match=match):
        bubblecast.plan_batch(_lengths(), token_budget=1024, cost=cost)


@pytest.mark.parametrize("kwargs, match", [
    ({"token_budget": 0}, r"^token_budget: must be an integer >= 1, got 0$"),
    ({"token_budget": 1024, "replicas": 0}, r"^replicas: must be an integer >= 1"),
    ({"token_budget": 1024, "speeds": [1.0, 0.0]}, r"^speeds: must be finite and > 0$"),
    ({"token_budget": 1024, "speeds": [1.0]}, r"^speeds: expected 2 values"),
])
def test_bad_config_names_the_field(kwargs, match):
    kwargs = {"replicas": 2, "microbatches": 2, **kwargs}
    with pytest.raises(BubblecastError, match=match):
        bubblecast.plan_batch(_lengths(), **kwargs)


def test_a_fallback_is_reported_and_logged(caplog):
    # next_fit packs [5, 5] [4, 3, 3]; cost-ordered LPT puts 5|5, 4|3 and finds no room for
    # the last 3 (rooms 1 and 2): the loader's packing, said so.
    with caplog.at_level(logging.WARNING, logger="bubblecast.plan"):
        plan = bubblecast.plan_batch([5, 5, 4, 3, 3], token_budget=10, microbatches=2)
    assert plan.fallback and "loader's packing" in plan.fallback
    assert plan.microbatches == (((0, 1), (2, 3, 4)),)
    assert any("fell back" in r.getMessage() for r in caplog.records)
