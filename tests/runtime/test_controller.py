"""The closed-loop controller: telemetry packing, fail-open decisions, ``bubblecast run``.

The ``dist`` tests launch two processes (gloo): a reactive policy facing a 3x straggler moves
layers on both ranks at the same step boundary and the training math still equals the
single-process reference; a forecaster that raises, then hangs, leaves training on the
current plan with NoOps that say why.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from bubblecast.cli import main
from bubblecast.errors import BubblecastError
from bubblecast.runtime.control.control_config import ControllerConfig
from bubblecast.runtime.control.decision_thread import DecisionThread, Ticket
from bubblecast.runtime.control.forecasters import ForecastUnavailable
from bubblecast.runtime.control.observe import History, held_cost, pack, unpack

ROOT = Path(__file__).resolve().parents[2]
TOL = 1e-6


class FlakyForecaster:
    """Raises on its first call, hangs (2 s) on every later one."""

    name = "flaky"

    def __init__(self) -> None:
        self.calls = 0

    def forecast(self, state: object, horizons: np.ndarray) -> np.ndarray:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("forecaster down")
        time.sleep(2.0)
        return np.ones((len(horizons), 2, 3))


def flaky_forecaster() -> FlakyForecaster:
    return FlakyForecaster()


def served_fake() -> object:
    """A served model (the service tests' fake) behind the one model-to-speed adapter."""
    from bubblecast.policy.speeds import ModelSpeeds
    from tests.serve.fakes import ScaledLast

    return ModelSpeeds(ScaledLast(), name="fake")


# -- pure pieces --------------------------------------------------------------------------
def test_pack_unpack_round_trip() -> None:
    samples = [{"layer": 2, "forward_s": 0.5, "total_s": 1.5},
               {"layer": 2, "forward_s": 0.25, "total_s": 1.0}]  # the latest wins
    a = pack([1.0, 2.0, 3.0], 4, samples, 5)
    b = pack([4.0, 5.0, 6.0, 7.0, 8.0], 4, [], 5)  # more steps than the window: the last 4
    compute, fwd, tot = unpack(np.stack([a, b]), 4, 5)
    assert compute.shape == (3, 2)  # the shorter rank bounds the common steps
    assert compute[:, 0].tolist() == [1.0, 2.0, 3.0] and compute[:, 1].tolist() == [5, 6, 7]
    assert fwd[0, 2] == 0.25 and tot[0, 2] == 1.0 and np.isnan(tot[1]).all()


def test_speeds_recover_a_slowdown_whatever_the_partition() -> None:
    layers, m = 12, 4
    h = History(2, layers, cost_samples=3)
    per_layer = np.linspace(1.0, 2.0, layers)  # forward seconds per layer, unequal
    h.add_samples(np.tile(per_layer, (2, 1)), np.tile(3 * per_layer, (2, 1)))
    costs = h.costs()
    assert np.allclose(costs.sum(axis=1), 3 * per_layer)
    parts = [(6, 6), (6, 6), (8, 4), (9, 3)]
    slow = np.array([1.0, 2.0])
    held = held_cost(np.asarray(parts), costs.sum(axis=1), 2)
    compute = held * m * slow
    h.add([0, 1, 2, 3], compute, parts, [m] * 4)
    assert np.allclose(h.speeds(costs), np.tile(slow, (4, 1)))


def test_held_cost_follows_interleaved_placement() -> None:
    # 2 ranks x 2 chunks: virtual stage v runs on rank v % 2
    held = held_cost(np.array([[1, 2, 3, 4]]), np.ones(10), 2)
    assert held.tolist() == [[4.0, 6.0]]


def test_decider_feeds_a_served_model_and_records_its_decision_as_is() -> None:
    from bubblecast.runtime.control.decide import Decider
    from bubblecast.runtime.plan import check_plan

    every, layers = 5, 8
    config = ControllerConfig(policy="predictive", every=every, forecaster=f"{__name__}:"
                              "served_fake", policy_params={"min_history": 4})
    plan = check_plan("1f1b", 2, 4, layers)
    decider = Decider(config, plan, np.full(layers, 1e3))
    samples = [{"layer": i, "forward_s": 0.1, "total_s": 0.3} for i in range(layers)]
    for b in range(4):  # rank 1 three times slower than rank 0
        rows = np.stack([pack([1.0] * every, every, samples, layers),
                         pack([3.0] * every, every, samples, layers)])
        decider.observe(rows, [(b * every + i, plan.partition, 4) for i in range(every)])
    decision, record = decider.decide(plan, 4 * every, None)
    assert decider.forecaster is not None and decider.forecaster.inner.window.steps == 20
    assert decision.acts and decision.action.partition[0] > 4  # layers leave rank 1
    assert record["action"] == decision.to_json()["action"] and record["step"] == 22
    assert record["reason"] == decision.reason
    assert record["predicted_step_s"] == decision.predicted_step_s is not None
    assert record["predicted_migration_s"] == decision.migration_s
    assert record["predicted_saving_s"] == pytest.approx(decision.predicted_saving_s)
    assert record["speed_plan"][1] > record["speed_plan"][0]


def test_decision_thread_runs_jobs_in_order_gives_up_and_refuses_while_busy() -> None:
    # No race with the clock: a job expected back in time gets a generous 30 s, and the job
    # expected to time out blocks on an event until the test releases it.
    patient = DecisionThread(30.0)
    ticket = patient.submit(lambda t, x: (threading.current_thread().name, x + 1), 1)
    assert patient.result(ticket) == ("bubblecast-decide", 2)  # not the caller's thread
    with pytest.raises(ValueError, match="boom"):
        patient.result(patient.submit(lambda t: (_ for _ in ()).throw(ValueError("boom"))))
    started, release = threading.Event(), threading.Event()
    ran: list[tuple[int, bool]] = []  # (job, abandoned when it ran)

    def job(t: Ticket, i: int, hang: bool) -> int:
        if hang:
            started.set()
            release.wait()
        ran.append((i, t.abandoned))
        return i

    short = DecisionThread(0.05)
    try:
        hung = short.submit(job, 0, True)  # submit returns while the job hangs
        queued = short.submit(job, 1, False)
        assert started.wait(30.0)
        with pytest.raises(ForecastUnavailable, match="timed out after 0.05 s"):
            short.result(hung)
        with pytest.raises(ForecastUnavailable, match="abandoned after 0.05 s, is still running"):
            short.result(queued)  # refused at once: the hung job still holds the thread
    finally:
        release.set()
    assert queued.done.wait(30.0)
    short.timeout_s = 30.0
    assert short.result(short.submit(job, 2, False)) == 2
    # every job ran, in order; the ones given up on knew it (the controller keeps their
    # observations and skips their decisions)
    assert ran == [(0, True), (1, True), (2, False)]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"policy": "oracle"}, "--policy"),
    ({"every": 0}, "--every"),
    ({"policy": "static", "model": "models/x"}, "only the predictive policy"),
    ({"policy": "predictive", "model": "m", "service": "http://x"}, "not both"),
    ({"policy": "predictive", "service": "ftp://x"}, "expected an http"),
    ({"timeout_s": 0.0}, "--forecast-timeout"),
    ({"lead_rise": 0.0}, "--lead-rise"),
    ({"policy": "reactive", "policy_params": {"windw": 3}}, "policy_params"),
])
def test_controller_config_refuses_bad_values(kwargs: dict, message: str) -> None:
    with pytest.raises(BubblecastError, match=message):
        ControllerConfig(**kwargs)


# -- the CLI refuses bad input before anything starts ------------------------------------
BASE = ["run", "--arch", "mlp", "--layers", "8", "--stages", "2", "--microbatches", "4",
        "--steps", "5"]


@pytest.mark.parametrize(("extra", "message"), [
    (["--policy", "magic"], "--policy"),
    (["--every", "0"], "--every"),
    (["--policy", "static", "--model", "models/default"], "only the predictive policy"),
    (["--policy", "predictive", "--model", "no/such/dir"], "not a model directory"),
    (["--policy", "predictive", "--service", "localhost:8000"], "http(s)://"),
    (["--policy", "reactive", "--schedule", "zbv"], "models gpipe, 1f1b"),
    (["--partition", "3,4"], "sums to 7"),
    (["--inject", "rank=1,factor=fast"], "'factor' must be a number"),
    (["--forecast-timeout", "0"], "--forecast-timeout"),
    (["--policy", "predictive", "--lead-rise", "-0.1"], "--lead-rise"),
    (["--policy", "reactive", "--decide-in", "gpu"], "--decide-in"),
    (["--action", "3:teleport=1"], "--action"),
])
def test_bad_options_exit_2_with_one_line(extra: list[str], message: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import bubblecast.runtime.control.job as job

    def no_launch(*a: object, **k: object) -> None:
        raise AssertionError("launched despite a bad request")

    monkeypatch.setattr(job, "launch_controlled", no_launch)
    code = main([*BASE, *extra, "--out", str(tmp_path / "e.parquet")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("bubblecast: error:") and message in err[0]
    assert list(tmp_path.iterdir()) == []


# -- two processes ---------------------------------------------------------------------------
def _reference_losses(steps: int) -> list[float]:
    from benchmarks.oracles.runtime_reference import Reference
    from bubblecast.runtime.train_config import ModelSpec, TrainConfig

    config = TrainConfig(model=ModelSpec(kind="mlp", layers=8, hidden=32, dtype="float64"),
                         stages=2, microbatches=4, steps=steps, batch_size=16,
                         optimizer="adam", lr=1e-2, seed=0)
    return Reference(config).run(steps)


@pytest.mark.dist
def test_reactive_moves_layers_on_both_ranks_at_one_boundary(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from bubblecast.telemetry import read_events

    steps = 24
    out = tmp_path / "run.parquet"
    code = main([*BASE[:-2], "--steps", str(steps), "--hidden", "32", "--dtype", "float64",
                 "--lr", "1e-2", "--policy", "reactive", "--every", "5",
                 "--inject", "rank=1,factor=3.0", "--out", str(out), "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    doc = json.loads((tmp_path / "run.actions.json").read_text())
    # the events, the actions log and the ranks' merged device metrics (OUT.metrics), no more
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.actions.json", "run.metrics",
                                                          "run.parquet"]
    moves = [a for a in doc["applied"] if a["ok"] and a["from"] != a["to"]]
    assert moves and result["actions_taken"] == len(moves)
    first = moves[0]
    assert first["to"][0] > first["from"][0]  # layers leave the slowed rank
    decided = [d for d in doc["decisions"] if d["action"]["action"] == "repartition"]
    assert decided[0]["step"] == first["step"] and decided[0]["latency_s"] >= 0
    assert all(d["reason"] for d in doc["decisions"])
    # Both ranks switch at the same step boundary: the layers each held, per step.
    f = read_events(out).frame
    held = f.loc[f["op"] == "F"].groupby(["step", "stage"])["layers"].first().unstack()
    assert (held.sum(axis=1) == 8).all()
    changed = held.index[(held.diff().abs().sum(axis=1) > 0)].tolist()
    assert changed[0] == first["step"]
    assert held.loc[first["step"]].tolist() == first["to"]
    assert held.loc[first["step"] - 1].tolist() == first["from"]
    # The math is the single-process reference's, migrations included.
    ref = _reference_losses(steps)
    assert abs(result["first_loss"] - ref[0]) < TOL and abs(result["last_loss"] - ref[-1]) < TOL


@pytest.mark.dist
@pytest.mark.parametrize("decide_in", ["process", "thread"])
def test_a_failing_or_hanging_forecaster_keeps_the_plan(
        decide_in: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bubblecast.runtime.control.job import launch_controlled
    from bubblecast.runtime.train_config import ModelSpec, TrainConfig

    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the workers import the flaky forecaster
    steps = 30
    config = TrainConfig(model=ModelSpec(kind="mlp", layers=8, hidden=32, dtype="float64"),
                         stages=2, microbatches=4, steps=steps, batch_size=16,
                         optimizer="adam", lr=1e-2, seed=0, inject="rank=1,factor=3.0",
                         run_id="flaky")
    # 1 s: generous for the first call's immediate raise on a fresh thread, and still half the
    # 2 s the later calls hang for
    control = ControllerConfig(policy="predictive", every=5, timeout_s=1.0,
                               decide_in=decide_in, forecaster=f"{__name__}:flaky_forecaster",
                               policy_params={"min_history": 4})  # live default: 30 steps
    s = launch_controlled(config, control, tmp_path / "flaky.parquet", timeout=240)
    reasons = [d["reason"] for d in s["decisions"]]
    assert all(d["action"]["action"] == "noop" for d in s["decisions"])
    assert any("decision failed (RuntimeError: forecaster down)" in r for r in reasons)
    assert any("timed out after 1 s" in r for r in reasons)
    assert all(d["applied"] is None for d in s["decisions"])
    assert s["actions"] == [] and s["partition"] == [4, 4]
    assert len(s["step_end_s"]) == steps  # training went on
    ref = _reference_losses(steps)
    losses = list(s["losses"].values())
    assert np.allclose(losses, ref, rtol=0, atol=TOL)


@pytest.mark.dist
def test_run_asks_a_service_through_the_injected_decider(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``run --service``: the workers import the decider the CLI names (runtime never imports
    serve) and record the service's decisions as they are."""
    from tests.serve.conftest import fake_server
    from tests.serve.fakes import write_model_dir

    out = tmp_path / "svc.parquet"
    with fake_server(write_model_dir(tmp_path / "model")) as (port, _):
        code = main([*BASE[:-2], "--steps", "40", "--policy", "predictive", "--every", "5",
                     "--inject", "rank=1,factor=3.0", "--service", f"http://127.0.0.1:{port}",
                     "--forecast-timeout", "5", "--out", str(out), "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert result["forecaster"] == f"service http://127.0.0.1:{port} (/v1/recommend)"
    doc = json.loads((tmp_path / "svc.actions.json").read_text())
    late = [d for d in doc["decisions"] if d["decided_after_step"] >= 30]  # live min_history
    assert late and all(d["predicted_step_s"] is not None for d in late)
    assert not any("keeping the current plan" in d["reason"] for d in doc["decisions"])
