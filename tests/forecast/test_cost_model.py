"""The micro-batch cost model on simulated packed-document runs, where the truth is linear.

The simulator (``SimConfig(documents=...)``) prices a packed micro-batch's op at
``f x stages / L`` ms per layer (``uniform:L``, here ``f = b = w = 1``) times
``WorkCost.attention``'s cost, times the rank's speed (``slow-replica``: one replica 1.5x slower
from an onset step) and a log-normal noise of sigma 0.01. So the model's ``work_cost()`` (per
layer, summed over F+B+W, at speed 1) should be ``3 x 4 / 12 ms`` times the true coefficients.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from bubblecast.errors import BubblecastError
from bubblecast.forecast.cost_model import SPEED_WINDOWS, CostModel
from bubblecast.forecast.cost_modeldir import (
    load_any_model,
    load_cost_model,
    require_tokens_sq,
    save_cost_model,
)
from bubblecast.forecast.modeldir import load_model
from bubblecast.sim.simulator import SimConfig, simulate_events
from bubblecast.telemetry import EventsBuilder, RunMeta, from_frame

#: Split backward (F, B, W ops), 4 stages of 2/4/3/3 of 12 equal layers, 2 replicas.
SPLIT = dict(schedule="zb-h1", stages=4, microbatches=8, replicas=2, model="uniform:12",
             partition=[2, 4, 3, 3], steps=40, scenario="slow-replica", documents="lognormal",
             token_budget=1024, attention_share=0.5)
#: Per-layer seconds of one op kind per unit of the simulator's cost: 1 ms x 4 stages / 12.
PER_LAYER_S = 1e-3 * 4 / 12
#: The noise's own p90 relative error: |N(0, 0.01)| at 0.9 is 1.645 x 0.01.
NOISE_P90 = 0.01645


def simulate(runs: int, seed: int, run_id: str, **over: object):
    return simulate_events(SimConfig(**{**SPLIT, **over}, runs=runs, seed=seed, run_id=run_id))


@pytest.fixture(scope="module")
def train_events():
    return simulate(8, 5, "doc")


@pytest.fixture(scope="module")
def fresh_events():
    """Runs no model saw (another seed): the held-out test set."""
    return simulate(4, 6, "fresh")


@pytest.fixture(scope="module")
def linear(train_events):
    return CostModel(learner="linear", holdout=0.25).fit(train_events)


def truth(events) -> dict[str, float]:
    return events.runs[events.run_ids[0]].extra["documents"]["cost"]


def test_linear_learner_recovers_the_true_costs(linear, train_events, fresh_events):
    cost = linear.work_cost().to_json()
    true = truth(train_events)
    # The two real terms within 2%: the fit is in relative error over ~46k ops with 1% noise;
    # what is left is tokens vs tokens_sq collinearity within 1024-token micro-batches
    # (measured -0.5% and +0.2%).
    for term in ("per_token", "per_token_sq"):
        assert cost[term] == pytest.approx(3 * PER_LAYER_S * true[term], rel=0.02), term
    # The terms the truth lacks add under 0.5% of a mean micro-batch's cost (measured 0.2%).
    mean = linear.mean_stats_
    spurious = cost["per_document"] * mean[2] + cost["per_microbatch"]
    assert spurious < 0.005 * (cost["per_token"] * mean[0] + cost["per_token_sq"] * mean[1])
    assert linear.kind_weights() == pytest.approx((1 / 3, 1 / 3, 1 / 3), abs=0.005)
    assert linear.learner_ == "linear" and linear.has_tokens_sq
    # Held-out error near the noise floor: the onset step of the slow replica (its recent
    # speed is still 1) is 1 step in 40 on half the ranks, too rare to move the p90.
    score = linear.score(fresh_events)
    assert set(score) == {"mae_s", "p50_rel_error", "p90_rel_error", "coverage_p10_p90", "rows",
                          "learner", "runs"}
    assert score["rows"] == 4 * 40 * 8 * 8 * 3 and score["runs"] == 4
    assert NOISE_P90 * 0.9 < score["p90_rel_error"] < 1.5 * NOISE_P90
    assert linear.heldout_["p90_rel_error"] < 1.5 * NOISE_P90
    assert linear.training_["heldout_runs"] and not (
        set(linear.training_["heldout_runs"]) & set(linear.training_["runs"]))


def test_conformal_bounds_cover_80_percent_of_new_runs(linear, fresh_events):
    """p10-p90 bounds calibrated on 2 held-out runs (15,360 ops) cover 0.8 +- 0.04 of 4 new
    runs' ops. Why that band: split-conformal coverage given the calibration set is
    Beta-distributed around 0.8 with sd sqrt(0.8 x 0.2 / n); the relative errors here are the
    per-op noise (independent), so n ~ 15k gives sd 0.003, and the 30,720 test ops add sd
    0.002. Even counting each (run, rank, step) of 24 ops as one draw (320 calibration, 1,280
    test groups), sd is 0.025 / 0.011: 0.04 is over 1.5 of those sds and > 10 of the per-op
    ones."""
    score = linear.score(fresh_events)
    assert score["coverage_p10_p90"] == pytest.approx(0.8, abs=0.04)
    bounds = linear.predict(fresh_events, quantiles=(0.1, 0.9))
    point = linear.predict(fresh_events)
    assert bounds.shape == (len(point), 2)
    assert (bounds[:, 0] < point).all() and (point < bounds[:, 1]).all()
    assert linear.heldout_["coverage_p10_p90"] == pytest.approx(0.8, abs=0.04)


def test_recent_speed_sees_no_future(linear, fresh_events):
    run = fresh_events.run("fresh-1")
    t = 20
    later = run.frame["step"].to_numpy() > t
    frame = run.frame.copy()
    frame.loc[later, "duration_s"] *= 3.0
    altered = from_frame(frame, run.runs)
    before, after = linear.rows(run), linear.rows(altered)
    steps = before["step"].to_numpy()
    known = steps <= t + 1  # step t + 1 uses steps up to t, still unaltered
    np.testing.assert_array_equal(before["speed_recent"].to_numpy()[known],
                                  after["speed_recent"].to_numpy()[known])
    # ...and the test can fail: once the whole window is altered, so is the recent speed.
    w = linear.speed_window_
    assert w in SPEED_WINDOWS
    grown = after["speed_recent"].to_numpy()[steps == t + 1 + w] / \
        before["speed_recent"].to_numpy()[steps == t + 1 + w]
    np.testing.assert_allclose(grown, 3.0, rtol=1e-9)
    assert (before.loc[before["step"] == 0, "speed_recent"] == 1.0).all()


def test_speeds_are_each_ranks_latest_ratio(linear, fresh_events):
    speeds = linear.speeds(fresh_events)
    assert list(speeds.columns) == ["run_id", "replica", "stage", "rank", "step", "speed"]
    assert len(speeds) == 4 * 8 and (speeds["step"] == 39).all()
    for run_id, part in speeds.groupby("run_id"):
        slow = fresh_events.runs[run_id].extra["scenario"]["realised"]["replica"]
        expected = np.where(part["replica"] == slow, 1.5, 1.0)
        # the 24 ops of a step average the 1% noise down to ~0.2%; 2% leaves the model's
        # own error room
        np.testing.assert_allclose(part["speed"], expected, rtol=0.02)


def test_save_and_load_give_identical_predictions(linear, fresh_events, tmp_path):
    path = save_cost_model(linear, tmp_path / "cost")
    back = load_cost_model(path)
    np.testing.assert_array_equal(back.predict(fresh_events), linear.predict(fresh_events))
    np.testing.assert_array_equal(back.predict(fresh_events, quantiles=(0.1, 0.9)),
                                  linear.predict(fresh_events, quantiles=(0.1, 0.9)))
    assert back.score(fresh_events) == linear.score(fresh_events)
    assert back.work_cost() == linear.work_cost()
    doc = json.loads((path / "model.json").read_text())
    assert doc["kind"] == "cost" and doc["version"] == 1 and doc["learner"] == "linear"
    assert doc["files"] == [] and doc["work_cost_source"] == "linear"
    assert doc["features"] == ["tokens", "tokens_sq", "documents", "layers", "speed_recent",
                               "kind"]
    assert set(doc["coefficients"]) == {"F", "B", "W"} and doc["has_tokens_sq"] is True
    assert len(doc["conformal"]["ratios"]) == len(doc["conformal"]["levels"]) == 99
    assert doc["training"]["runs"] == linear.training_["runs"]
    assert isinstance(load_any_model(path), type(linear))


def test_lightgbm_learner_fits_and_round_trips(tmp_path):
    events = simulate(4, 7, "fused", schedule="1f1b", partition=None, steps=30,
                      documents="long-tail")
    fresh = simulate(2, 8, "fused-new", schedule="1f1b", partition=None, steps=30,
                     documents="long-tail")
    model = CostModel(learner="lgbm", n_estimators=80, holdout=0.25).fit(events)
    assert model.learner_ == "lgbm" and model.kinds_ == ["F", "BW"]
    # 80 trees approximate the linear truth piecewise (long-tail micro-batches span a wide
    # tokens_sq range): measured p90 0.049 on new runs, the linear learner's 0.018.
    assert model.score(fresh)["p90_rel_error"] < 0.07
    # 1F1B: the fused backward carries B + W (2 ms of the 3 per stage).
    assert model.kind_weights() == pytest.approx((1 / 3, 2 / 3, 0.0), abs=0.01)
    # The planner's linear surrogate stays close to the truth: its price of the training
    # rows' mean micro-batch within 3% (measured -0.2%).
    true = truth(events)
    mean = model.mean_stats_
    cost = model.work_cost()
    expected = 3 * PER_LAYER_S * (true["per_token"] * mean[0] + true["per_token_sq"] * mean[1])
    got = cost.per_token * mean[0] + cost.per_token_sq * mean[1] + cost.per_document * mean[2]
    assert got + cost.per_microbatch == pytest.approx(expected, rel=0.03)
    path = save_cost_model(model, tmp_path / "lgbm")
    doc = json.loads((path / "model.json").read_text())
    assert doc["files"] == ["booster.txt"] and doc["work_cost_source"] == "lgbm-surrogate"
    back = load_cost_model(path)
    np.testing.assert_array_equal(back.predict(fresh), model.predict(fresh))
    # A frame of plain statistics: B stands for the fused backward the model learnt.
    rows = model.rows(fresh).head(6)
    frame = rows.assign(kind=rows["kind"].replace({"BW": "B"}))
    np.testing.assert_array_equal(back.predict(frame), model.predict(rows))


def test_auto_keeps_the_learner_with_the_lower_held_out_p90():
    """Linear truth: the linear learner wins. A step the linear terms cannot express (ops of
    micro-batches with more than 8 documents take 1.4x): LightGBM wins."""
    events = simulate(4, 11, "sel", schedule="1f1b", partition=None, steps=30)
    linear_truth = CostModel(holdout=0.25, n_estimators=80).fit(events)
    errors = {k: v["p90_rel_error"] for k, v in linear_truth.metrics_["learners"].items()}
    assert linear_truth.learner_ == "linear" and errors["linear"] < errors["lgbm"]
    frame = events.frame.copy()
    frame["duration_s"] *= np.where(frame["documents"] > 8, 1.4, 1.0)
    stepped = CostModel(holdout=0.25, n_estimators=80).fit(from_frame(frame, events.runs))
    errors = {k: v["p90_rel_error"] for k, v in stepped.metrics_["learners"].items()}
    assert stepped.learner_ == "lgbm" and errors["lgbm"] < errors["linear"]
    assert stepped.heldout_ == stepped.metrics_["learners"]["lgbm"]


def test_tampered_booster_is_refused(tmp_path):
    events = simulate(2, 9, "t", schedule="1f1b", partition=None, steps=12)
    path = save_cost_model(CostModel(learner="lgbm", n_estimators=5).fit(events), tmp_path / "m")
    with open(path / "booster.txt", "a") as fh:
        fh.write("\n")
    with pytest.raises(BubblecastError, match=r"booster.txt does not match its sha256"):
        load_cost_model(path)


def test_without_tokens_sq_the_model_fits_and_says_so(tmp_path):
    events = simulate(3, 10, "tok", schedule="1f1b", partition=None, steps=20)
    plain = from_frame(events.frame.drop(columns=["tokens_sq", "documents"]), events.runs)
    model = CostModel(learner="linear").fit(plain)
    assert not model.has_tokens_sq and "tokens_sq" not in model.features
    assert model.work_cost().per_token_sq == 0.0
    path = save_cost_model(model, tmp_path / "tok")
    assert json.loads((path / "model.json").read_text())["has_tokens_sq"] is False
    with pytest.raises(BubblecastError) as err:
        require_tokens_sq(load_cost_model(path), str(path))
    assert str(err.value) == (f"cost model {path} was trained without tokens_sq; it cannot "
                              "price packed documents (retrain on events with tokens_sq)")
    require_tokens_sq(CostModel(learner="linear").fit(events), "fine")  # no error


def _builder_events(ops: tuple[str, ...], runs: int = 1, **optional: object):
    b = EventsBuilder()
    for r in range(runs):
        b.add_run(f"r{r}", RunMeta(schedule="1f1b", stages=1, microbatches=1))
        for step in range(3):
            for op in ops:
                b.add(f"r{r}", step=step, rank=0, stage=0, op=op, start_s=float(step),
                      duration_s=0.1, microbatch=0 if op in "FBW" else -1, **optional)
    return b.build()


def test_bad_inputs_are_one_line_errors(train_events):
    with pytest.raises(BubblecastError, match=r"^ev: column 'tokens' is missing"):
        CostModel().fit(_builder_events(("F", "B"), runs=2), "ev")
    with pytest.raises(BubblecastError, match=r"^ev: no compute ops \(F, B, W\)"):
        CostModel().fit(_builder_events(("OPTIMIZER",), runs=2, tokens=5), "ev")
    with pytest.raises(BubblecastError, match=r"needs at least 2 runs \(1 to fit, 1 held out\), "
                                              r"got 1"):
        CostModel(holdout=0.2).fit(_builder_events(("F", "B"), tokens=5), "ev")
    CostModel(holdout=0.0).fit(_builder_events(("F", "B"), tokens=5), "ev")  # fine
    frame = train_events.frame.copy()
    frame.loc[frame["run_id"] == "doc-3", "tokens_sq"] = np.nan
    mixed = from_frame(frame, train_events.runs)
    with pytest.raises(BubblecastError, match=r"run 'doc-3' has no tokens_sq on some compute "
                                              r"ops, while other runs have it"):
        CostModel().fit(mixed, "ev")
    with pytest.raises(BubblecastError, match="learner: 'tree' is not one of"):
        CostModel(learner="tree").fit(train_events)


def test_pricing_needs_what_the_model_was_trained_on(linear, train_events):
    lacking = from_frame(train_events.frame.drop(columns=["tokens_sq"]), train_events.runs)
    with pytest.raises(BubblecastError, match=r"^ev: column 'tokens_sq' is missing; this cost "
                                              r"model was trained with it"):
        linear.score(lacking, "ev")
    with pytest.raises(BubblecastError, match="column 'documents' is missing"):
        linear.predict(pd.DataFrame({"kind": ["F"], "tokens": [10], "tokens_sq": [100.0]}))
    with pytest.raises(BubblecastError, match="op kind 'X' was not in its training events"):
        linear.predict(pd.DataFrame({"kind": ["X"], "tokens": [10], "tokens_sq": [100.0],
                                     "documents": [1]}))
    with pytest.raises(BubblecastError, match="not fitted"):
        CostModel().work_cost()


def test_forecaster_and_cost_directories_are_not_confused(linear, tmp_path):
    path = save_cost_model(linear, tmp_path / "cost")
    with pytest.raises(BubblecastError, match=r"a micro-batch cost model \(kind 'cost'\), not a "
                                              r"forecaster"):
        load_model(path)
    doc = json.loads((path / "model.json").read_text())
    (path / "model.json").write_text(json.dumps({**doc, "version": 7}))
    with pytest.raises(BubblecastError, match="cost model version 7, this bubblecast reads 1"):
        load_cost_model(path)


def test_estimator_rules():
    model = CostModel(learner="linear", seed=3)
    assert model.get_params()["seed"] == 3 and not [k for k in vars(model) if k.endswith("_")]
    assert model.set_params(rounds=2).rounds == 2
    with pytest.raises(ValueError, match="unknown parameter"):
        model.set_params(trees=3)


def test_the_model_shape_of_the_training_runs_is_recorded_and_compared(train_events):
    """Simulated runs record no model: no shape, nothing refused; runtime runs record
    ``extra["model"]``: one shape, or ``mixed`` when they differ."""
    import copy

    from bubblecast.forecast.cost_model import model_shape, shape_mismatch
    from bubblecast.telemetry.events import Events

    assert model_shape(train_events) is None
    runs = copy.deepcopy(train_events.runs)
    spec = {"kind": "packed", "layers": 4, "hidden": 64, "heads": 4, "seq_len": 1024,
            "vocab": 128, "dtype": "float32"}
    for meta in runs.values():
        meta.extra["model"] = dict(spec)
    events = Events(train_events.frame, runs)
    assert model_shape(events) == spec
    model = CostModel(learner="linear", holdout=0.0).fit(events)
    assert model.training_["model_shape"] == spec
    assert shape_mismatch(model, spec) is None
    assert shape_mismatch(model, {**spec, "seq_len": 4096}) == \
        "seq_len 1024 (model) vs 4096 (this run)"
    first = next(iter(runs.values()))
    first.extra["model"]["hidden"] = 32
    assert model_shape(Events(train_events.frame, runs))["mixed"][0]["hidden"] == 32


def test_auto_speed_window_is_chosen_on_the_held_out_runs(linear, tmp_path):
    tried = linear.metrics_["speed_window"]
    assert sorted(int(w) for w in tried) == sorted(SPEED_WINDOWS)
    assert tried[str(linear.speed_window_)] == min(tried.values())
    assert linear.heldout_["p90_rel_error"] == tried[str(linear.speed_window_)]
    # a model directory from before the window existed loads with the previous step's speed
    path = save_cost_model(linear, tmp_path / "cost")
    doc = json.loads((path / "model.json").read_text())
    assert doc["speed_window"] == linear.speed_window_
    del doc["speed_window"]
    (path / "model.json").write_text(json.dumps(doc))
    assert load_cost_model(path).speed_window_ == 1


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "median"])
def test_bad_speed_window_is_refused(train_events, bad):
    with pytest.raises(BubblecastError, match="speed_window: must be an integer >= 1 or 'auto'"):
        CostModel(speed_window=bad).fit(train_events)
