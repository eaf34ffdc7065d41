"""In-process predictions: numbers by hand, bubble fractions, model-dependent refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bubblecast.forecast.served import ModelInfo
from bubblecast.policy.actions import Repartition, action_from_json
from bubblecast.serve.predictor import Predictor
from bubblecast.serve.schemas import RequestError
from tests.serve.fakes import Broken, ScaledLast, forecast_request, recommend_request


def make(model=None) -> Predictor:
    return Predictor(model or ScaledLast(), ModelInfo(name="fake", version="7", source="mem"))


def test_forecast_converts_the_delay_signal_back_to_seconds():
    req = forecast_request(stages=2, steps=3, microbatches=4)
    req["ranks"][0].update(compute_s=[1.0, 2.0, 6.0], work=[1.0, 1.0, 3.0])
    req["ranks"][1].update(compute_s=[1.0, 1.0, 4.0], tokens=[100.0, 100.0, 200.0])
    req["next_tokens"] = [300.0, 500.0]
    out = make(ScaledLast(scale=1.5)).forecast(req)
    r0, r1 = out.ranks
    # stage 0: delay 6 / (3 x 4 microbatches) x scale 1.5, back at 3 x 4 of work: 1.5 x 6
    assert r0.p50 == pytest.approx([9.0, 9.0])
    assert r0.p10 == pytest.approx([8.1, 8.1]) and r0.p90 == pytest.approx([9.9, 9.9])
    # stage 1: delay 4 / (1 x 200 tokens) x 1.5, then times the tokens known ahead
    assert r1.p50 == pytest.approx([4 / 200 * 1.5 * 300, 4 / 200 * 1.5 * 500])
    assert out.model.version == "7" and out.horizons == [1, 5]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(4, 8), (3, 1), (2, 6)])
def test_equal_stages_give_the_textbook_bubble(schedule, p, m):
    req = forecast_request(stages=p, microbatches=m, schedule=schedule)
    for r in req["ranks"]:
        r["compute_s"] = [3.0] * len(r["compute_s"])
    out = make().forecast(req)
    assert out.bubble_fraction == pytest.approx([(p - 1) / (m + p - 1)] * 2)
    assert out.step_time_s == pytest.approx([3.0 * (m + p - 1) / m] * 2)


def test_a_slow_stage_raises_the_bubble_and_ranks_come_back_in_stage_order():
    even = make().forecast(forecast_request(stages=4))
    req = forecast_request(stages=4, slow_stage=2)
    req["ranks"].reverse()
    slow = make().forecast(req)
    assert [r.stage for r in slow.ranks] == [0, 1, 2, 3]
    assert [r.rank for r in slow.ranks] == [10, 11, 12, 13]
    assert slow.bubble_fraction[0] > even.bubble_fraction[0] + 0.1


def test_window_shorter_than_the_model_needs_names_the_field():
    with pytest.raises(RequestError) as err:
        make(ScaledLast(min_window=5)).forecast(forecast_request(steps=3))
    assert err.value.field == "ranks[0].compute_s" and "at least 5" in err.value.message


def test_horizon_the_model_does_not_know_names_the_field():
    with pytest.raises(RequestError) as err:
        make(ScaledLast(horizons=(1, 5, 10))).forecast(forecast_request(horizons=(1, 7)))
    assert err.value.field == "horizons" and "[7]" in err.value.message


def test_non_finite_model_output_is_a_request_error_not_a_crash():
    with pytest.raises(RequestError) as err:
        make(Broken()).forecast(forecast_request())
    assert err.value.field == "ranks"


def test_dict_requests_are_validated_like_http_ones():
    req = forecast_request()
    req["ranks"][1]["compute_s"][0] = -1.0
    with pytest.raises(RequestError) as err:
        make().forecast(req)
    assert err.value.field == "ranks[1].compute_s[0]"


def test_recommend_moves_layers_off_a_slow_stage():
    out = make().recommend(recommend_request(stages=4, slow_stage=3))
    action = action_from_json(out.action)
    assert isinstance(action, Repartition)
    assert action.partition[3] < 4 and sum(action.partition) == 16
    assert out.step_time_with_action_s < out.step_time_s
    assert out.migration_s == pytest.approx(0.05)  # no parameter bytes given: the pause only
    gain = (out.step_time_s - out.step_time_with_action_s) * out.horizon
    assert out.saving_s == pytest.approx(gain - out.migration_s)
    assert "stage 3" in out.reason


def test_recommend_keeps_a_balanced_pipeline():
    req = recommend_request(stages=4)
    for r in req["ranks"]:
        r["compute_s"] = [1.0] * len(r["compute_s"])
    out = make().recommend(req)
    assert out.action["action"] == "noop" and out.action["reason"] == out.reason
    assert out.step_time_with_action_s == out.step_time_s and out.migration_s == 0.0


def test_recommend_declines_when_migration_does_not_pay_back():
    req = recommend_request(stages=4, slow_stage=3)
    req["migration"] = {"pause_s": 1000.0}
    out = make().recommend(req)
    assert out.action["action"] == "noop" and "migration" in out.reason


def test_recommend_holds_after_a_recent_move_and_waits_for_history():
    req = recommend_request(stages=4, slow_stage=3)
    req["steps_since_action"] = 1
    assert "holding" in make().recommend(req).reason
    short = recommend_request(stages=4, slow_stage=3, steps=3)
    assert make().recommend(short).action["action"] == "noop"


def test_recommend_counts_bytes_moved():
    req = recommend_request(stages=2, layers_per_stage=4, slow_stage=1)
    req["migration"] = {"param_bytes": [1e9] * 8, "bandwidth_bytes_per_s": 7e9,
                        "pause_s": 0.0, "optimizer_factor": 6.0}
    req["policy"] = {"horizon": 4096}
    out = make().recommend(req)
    moved = abs(out.action["partition"][0] - 4)
    assert moved >= 1 and out.migration_s == pytest.approx(moved * 1.0)


def test_recommend_accepts_per_op_layer_costs():
    req = recommend_request(stages=2, layers_per_stage=3, slow_stage=0)
    req["layer_costs"] = [[1.0, 2.0, 1.0]] * 6
    out = make().recommend(req)
    assert out.action["action"] == "repartition" and out.action["partition"][0] < 3


def test_recommend_partition_must_match_layers():
    req = recommend_request(stages=4)
    req["layer_costs"] = req["layer_costs"][:-1]
    with pytest.raises(RequestError) as err:
        make().recommend(req)
    assert err.value.field == "partition"


def test_reload_swaps_the_model_and_old_references_stay_valid():
    versions = iter(["1", "2"])

    def loader():
        v = next(versions)
        return ScaledLast(scale=float(v)), ModelInfo(name="fake", version=v, source="mem")

    model, info = loader()
    pred = Predictor(model, info, loader=loader)
    before = pred.loaded
    assert pred.reload().version == "2"
    assert before.info.version == "1" and before.model.scale == 1.0  # untouched
    req = forecast_request()
    last = req["ranks"][0]["compute_s"][-1]
    out = pred.forecast(req)
    assert out.model.version == "2" and out.ranks[0].p50[0] == pytest.approx(2 * last)


def test_in_process_and_http_give_the_same_answer(client, predictor):
    req = forecast_request(slow_stage=1)
    local = predictor.forecast(req).model_dump()
    remote = client.post("/v1/forecast", json=req)
    assert remote.status_code == 200
    assert remote.json() == json.loads(json.dumps(local))
    assert np.all(np.isfinite(remote.json()["bubble_fraction"]))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_forecast_json_is_the_bytes_of_the_response_model(predictor, seed):
    """The hot route's bytes (no response models built) equal model_dump_json's."""
    from tests.serve.fakes import forecast_request

    req = forecast_request(seed=seed, slow_stage=seed, horizons=(1, 2 + seed))
    req["ranks"] = req["ranks"][::-1]  # ranks out of stage order
    assert predictor.forecast_json(req) == predictor.forecast(req).model_dump_json().encode()


def test_recommend_records_the_policys_decision_as_it_is(monkeypatch):
    """The response carries the Decision's numbers and reason, not numbers of its own."""
    from bubblecast.policy.decision import Decision
    from bubblecast.policy.policies import PredictivePolicy

    decision = Decision(Repartition((5, 3, 4, 4)), 2.0, 1.5, 0.25, "the policy's own reason")
    monkeypatch.setattr(PredictivePolicy, "decide", lambda self, state: decision)
    req = recommend_request(stages=4, slow_stage=3)
    req["policy"] = {"horizon": 64}
    out = make().recommend(req)
    assert action_from_json(out.action) == decision.action
    assert (out.step_time_s, out.step_time_with_action_s, out.migration_s) == (2.0, 1.5, 0.25)
    assert out.saving_s == (2.0 - 1.5) * 64 - 0.25
    assert out.reason == "the policy's own reason"


def test_recommend_fills_in_the_step_time_when_the_policy_kept_the_plan_early():
    """Holding after a move, the policy predicts nothing; the service adds the current plan's
    predicted step time (with and without the action equal, no migration)."""
    req = recommend_request(stages=4, slow_stage=3)
    req["steps_since_action"] = 1
    out = make().recommend(req)
    assert "holding" in out.reason and out.action["action"] == "noop"
    assert out.step_time_s > 0 and out.step_time_with_action_s == out.step_time_s
    assert out.migration_s == 0.0 and out.saving_s == 0.0


@pytest.mark.parametrize("schedule, held", [("interleaved", [4.0, 4.0]), ("zbv", [6.0, 2.0])])
def test_recommend_sums_each_ranks_virtual_stages_by_the_schedules_placement(
        monkeypatch, schedule, held):
    """Looped placement: rank r holds virtual stages r and r + P; V-shape: r and 2P - 1 - r."""
    import bubblecast.serve.recommend as rec

    seen = {}
    real = rec.request_window

    def spy(req, default_cost):
        seen["held"] = np.asarray(default_cost).tolist()
        return real(req, default_cost=default_cost)

    monkeypatch.setattr(rec, "request_window", spy)
    req = recommend_request(stages=2, schedule=schedule, microbatches=4)
    req["pipeline"]["chunks"] = 2
    req["partition"], req["layer_costs"] = [3, 1, 1, 3], [1.0] * 8
    out = make().recommend(req)
    assert seen["held"] == held
    assert out.action["action"] in {"noop", "repartition"}


def test_chunks_with_a_single_chunk_schedule_name_the_multi_chunk_ones():
    req = recommend_request(stages=2)
    req["pipeline"]["chunks"] = 2
    with pytest.raises(RequestError, match="zbv"):
        make().recommend(req)
