"""What-if scenarios (SPEC §3 ``whatif``) against runs whose counterfactual is known."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from bubblecast.cli import main
from bubblecast.sim.replay import ReplayModel
from bubblecast.sim.whatif import balanced_durations, ideal_durations, whatif
from bubblecast.telemetry import Events, write_events
from tests.sim.test_replay import synthetic_run

KEYS = {"observed_step_s", "replayed_step_s", "replay_error", "scenarios"}
SCENARIOS = {"ideal", "fix_bottleneck", "no_slow_ranks", "balanced"}


def test_uniform_run_has_nothing_to_gain():
    w = whatif(synthetic_run("1f1b", 4, 8, replicas=2, steps=3, comm=1e-4, allreduce=1e-3))
    assert set(w) >= KEYS and set(w["scenarios"]) == SCENARIOS
    assert w["replay_error"] == pytest.approx(0.0, abs=1e-12)
    assert w["replayed_step_s"] == pytest.approx(w["observed_step_s"])
    for sc in w["scenarios"].values():
        assert set(sc) == {"step_s", "speedup"}
        assert sc["speedup"] == pytest.approx(1.0, abs=1e-9)


def test_balanced_equals_a_run_simulated_with_balanced_stages():
    # Stage s does scale[s] times the work; balancing gives every stage the mean.
    scale = [1.0, 1.0, 1.0, 2.2]
    kw = {"replicas": 2, "steps": 2, "comm": 2e-4}
    w = whatif(synthetic_run("1f1b", 4, 8, stage_scale=scale, **kw))
    even = synthetic_run("1f1b", 4, 8, stage_scale=[float(np.mean(scale))] * 4, **kw)
    expected = ReplayModel(even).run().observed_step_s.mean()
    assert w["scenarios"]["balanced"]["step_s"] == pytest.approx(expected, rel=1e-9)
    assert w["scenarios"]["balanced"]["speedup"] > 1.2
    assert w["bottleneck_stage"] == 3


def test_fix_bottleneck_gives_the_bottleneck_the_mean_durations():
    scale = [1.0, 1.0, 1.8, 1.0]
    ev = synthetic_run("1f1b", 4, 8, stage_scale=scale, steps=2)
    model = ReplayModel(ev)
    ideal = ideal_durations(model)
    comp = model.is_compute
    for op in ("F", "B"):
        rows = comp & (model.frame["op"] == op).to_numpy()
        np.testing.assert_allclose(ideal[rows], model.observed[rows].mean())
    w = whatif(ev)
    assert w["bottleneck_stage"] == 2
    # Every F (B) at its mean: a uniform pipeline of mean-length ops.
    mean = float(np.mean(scale))
    uniform = synthetic_run("1f1b", 4, 8, stage_scale=[mean] * 4, steps=2)
    assert w["scenarios"]["ideal"]["step_s"] == pytest.approx(
        ReplayModel(uniform).run().observed_step_s.mean(), rel=1e-9)
    fixed = synthetic_run("1f1b", 4, 8, stage_scale=[1.0, 1.0, mean, 1.0], steps=2)
    assert w["scenarios"]["fix_bottleneck"]["step_s"] == pytest.approx(
        ReplayModel(fixed).run().observed_step_s.mean(), rel=1e-9)


def test_no_slow_ranks_gives_the_slow_rank_the_mean_durations():
    kw = {"replicas": 2, "steps": 4, "allreduce": 1e-3}
    ev = synthetic_run("1f1b", 4, 8, speed=lambda s, r: 1.6 if r == 6 else 1.0, **kw)
    w = whatif(ev)
    assert w["slow_ranks"] == [6]
    assert w["scenarios"]["no_slow_ranks"]["speedup"] > 1.15
    # The slow rank's ops at their type's mean over all 8 ranks: 1.6 -> (7 + 1.6) / 8.
    fixed = synthetic_run("1f1b", 4, 8, speed=lambda s, r: 8.6 / 8 if r == 6 else 1.0, **kw)
    assert w["scenarios"]["no_slow_ranks"]["step_s"] == pytest.approx(
        ReplayModel(fixed).run().observed_step_s.mean(), rel=1e-9)


def test_balanced_keeps_each_replicas_total_compute():
    ev = synthetic_run("1f1b", 3, 4, replicas=2, steps=2, stage_scale=[1, 2, 3], jitter=0.2)
    model = ReplayModel(ev)
    bal = balanced_durations(model)
    f = model.frame.assign(orig=model.observed, bal=bal)[model.is_compute]
    per = f.groupby(["replica", "stage"])[["orig", "bal"]].sum()
    np.testing.assert_allclose(per.groupby(level=0)["bal"].sum(),
                               per.groupby(level=0)["orig"].sum())
    np.testing.assert_allclose(per["bal"].groupby(level=0).std(), 0.0, atol=1e-12)


def test_whatif_cli(tmp_path, capsys):
    a = synthetic_run("1f1b", 4, 4, steps=2, run_id="a")
    b = synthetic_run("gpipe", 4, 4, steps=2, stage_scale=[1, 1, 1, 2], run_id="b")
    path = tmp_path / "two.parquet"
    write_events(Events.concat([a, b]), path)
    assert main(["whatif", str(path), "--json"]) == 2  # two runs and no --run
    assert "--run" in capsys.readouterr().err
    assert main(["whatif", str(path), "--run", "b", "--json", "--format", "bubblecast"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= KEYS and out["run_id"] == "b"
    assert out["scenarios"]["balanced"]["speedup"] > 1.0
    assert main(["whatif", str(path), "--run", "a"]) == 0
    assert "fix_bottleneck" in capsys.readouterr().out


def test_steps_are_means_over_the_run():
    ev = synthetic_run("1f1b", 3, 4, steps=4, jitter=0.3, seed=9)
    w = whatif(ev)
    f = ev.frame
    per_step = (f["start_s"] + f["duration_s"]).groupby(f["step"]).max() - \
        f["start_s"].groupby(f["step"]).min()
    assert w["observed_step_s"] == pytest.approx(float(per_step.mean()))
    assert isinstance(pd.Series(w["scenarios"]).to_dict(), dict)


def _v_run(schedule: str, **kw: object) -> Events:
    from bubblecast.sim.simulator import SimConfig, simulate_events

    cfg = {"stages": 4, "microbatches": 8, "steps": 3, "comm": 0.2, "b": 1.7, "w": 0.6,
           "scenario": "jitter", "seed": 5, **kw}
    return simulate_events(SimConfig(schedule=schedule, **cfg))


@pytest.mark.parametrize("schedule", ["zb-v", "dualpipev", "torch-csv"])
def test_v_shape_runs_replay_and_an_unchanged_counterfactual_reproduces_them(schedule, tmp_path):
    """A simulated V-shape run (rank r holds virtual stages r and 2P - 1 - r) replays exactly:
    every op's start and end, and whatif's scenarios run (no dependency cycle)."""
    from bubblecast.sim.analysis import BubbleAnalysis
    from bubblecast.sim.schedules import build_schedule, to_torch_actions
    from bubblecast.sim.torch_actions import write_csv

    if schedule == "torch-csv":  # a csv: order whose file is gone by the time of the replay
        path = tmp_path / "zbv.csv"
        write_csv(path, to_torch_actions(build_schedule("zbv", 4, 8)))
        ev = _v_run(f"csv:{path}")
        path.unlink()
    else:
        ev = _v_run(schedule)
    model = ReplayModel(ev)
    assert model.v_shape
    assert model.placement[:, 1].tolist() == [7, 6, 5, 4]
    result = model.run(model.pure)  # the counterfactual that changes nothing
    np.testing.assert_allclose(result.start, model.start, atol=1e-12)
    np.testing.assert_allclose(result.end, model.start + model.observed, atol=1e-12)
    np.testing.assert_allclose(result.replayed_step_s, result.observed_step_s, rtol=1e-12)
    w = BubbleAnalysis(ev).whatif()
    assert w["replay_error"] == pytest.approx(0.0, abs=1e-12)
    assert set(w["scenarios"]) == SCENARIOS
    # Jitter only: the ideal scenario (mean durations) cannot be much slower than observed.
    assert 0.8 < w["scenarios"]["ideal"]["speedup"] < 1.5


def test_an_unknown_v_shape_schedule_is_placed_by_its_forward_order():
    """Without a placement in the metadata and a schedule name bubblecast does not know, the
    order microbatch 0's forwards ran in gives the placement; a looped guess would deadlock."""
    ev = _v_run("dualpipev")
    meta = ev.runs["sim-0"]
    meta.extra.pop("vstages")
    meta.schedule = "MyCustomV"
    model = ReplayModel(ev)
    assert model.placement.tolist() == [[0, 7], [1, 6], [2, 5], [3, 4]]
    np.testing.assert_allclose(model.run().start, model.start, atol=1e-12)


def test_looped_runs_record_no_placement():
    ev = _v_run("interleaved", chunks=2)
    assert "vstages" not in ev.runs["sim-0"].extra
    model = ReplayModel(ev)
    assert not model.v_shape and model.placement[:, 1].tolist() == [4, 5, 6, 7]
    np.testing.assert_allclose(model.run().start, model.start, atol=1e-12)
