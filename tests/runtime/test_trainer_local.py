"""The trainer in this process (a one-rank gloo group): exact math against the single-process
reference, plan changes on one rank, telemetry files, checkpoints, the controller hook."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks.oracles.runtime_reference import Reference
from bubblecast.policy.actions import NoOp, Repartition, SetMicrobatches, SetSchedule
from bubblecast.runtime.train_config import ModelSpec, TrainConfig
from bubblecast.telemetry import read_events

dist = torch.distributed
SPEC = ModelSpec(kind="gpt", layers=6, hidden=16, seq_len=8, vocab=32, heads=2, dtype="float64")


@pytest.fixture(scope="module", autouse=True)
def one_rank(tmp_path_factory: pytest.TempPathFactory):
    """This module's own one-rank gloo group, whatever ran before: a default group left in
    this process by an earlier test is destroyed first (the trainer uses the default group),
    and ours is destroyed at teardown, so the result does not depend on test order."""
    if dist.is_initialized():
        dist.destroy_process_group()
    store = dist.FileStore(str(tmp_path_factory.mktemp("store") / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _config(**kw) -> TrainConfig:
    base = {"model": SPEC, "stages": 1, "microbatches": 2, "schedule": "1f1b", "batch_size": 8,
            "optimizer": "adam", "lr": 1e-2, "layer_cost_every": 2, "flush_every": 2}
    base.update(kw)
    return TrainConfig(**base)


def _max_diff(a: dict, b: dict) -> float:
    return max((a[i][k] - b[i][k]).abs().max().item() for i in b for k in b[i])


def test_matches_reference_across_plan_changes() -> None:
    from bubblecast.runtime.trainer import Trainer

    cfg = _config(schedule="interleaved", chunks=2, microbatches=2)
    t = Trainer(cfg, record=False)
    script = {1: Repartition((1, 5)), 2: SetMicrobatches(4), 3: SetSchedule("gpipe"),
              4: SetSchedule("zb-h1"), 5: NoOp("nothing")}
    records = {}
    for step in range(7):
        if step in script:
            records[step] = t.apply(script[step])
        t.train_step()
    assert all(r["ok"] for r in records.values()), records
    assert t.plan.schedule == "zb-h1" and t.plan.partition == (6,) and t.plan.microbatches == 4
    ref = Reference(cfg)
    ref_losses = ref.run(7, microbatches=lambda s: 2 if s < 2 else 4)
    losses = t.gather_losses()
    assert list(losses) == list(range(7))
    assert max(abs(losses[s] - ref_losses[s]) for s in losses) < 1e-9
    assert _max_diff(t.layer_state(), ref.layer_state()) < 1e-6
    t.close()


def test_refused_action_and_rollback_keep_the_plan() -> None:
    from bubblecast.runtime.trainer import Trainer

    t = Trainer(_config(schedule="interleaved", chunks=2), record=False)
    t.train_step()
    before, plan = t.layer_state(), t.plan
    bad = t.apply(SetMicrobatches(3))  # 8 samples do not split into 3 equal micro-batches
    assert not bad["ok"] and "does not split" in bad["error"] and t.plan == plan

    def fault(phase: str, layer: int | None) -> None:
        if phase == "build":
            raise RuntimeError("injected")

    t.fault_hook = fault
    rec = t.apply(Repartition((2, 4)))
    assert not rec["ok"] and "injected" in rec["error"]
    assert t.plan == plan and rec["to"] == list(plan.partition)
    assert _max_diff(t.layer_state(), before) == 0.0
    t.fault_hook = None
    assert t.apply(Repartition((2, 4)))["ok"] and t.plan.partition == (2, 4)
    t.close()


def test_events_file_layer_costs_and_controller_hook(tmp_path: Path) -> None:
    from bubblecast.runtime.trainer import Trainer

    cfg = _config(schedule="zb-h1", events_dir=str(tmp_path / "parts"), run_id="local",
                  inject="rank=0,factor=1.5,start=2")
    t = Trainer(cfg)
    calls = []

    def controller(trainer: Trainer, loss: float | None) -> SetMicrobatches | None:
        calls.append(trainer.step)
        return SetMicrobatches(4) if trainer.step == 2 else None

    t.run(5, on_step_end=controller, control_every=2)
    assert calls == [2, 4] and t.plan.microbatches == 4
    out = tmp_path / "events.parquet"
    rows = t.close(out=str(out))
    ev = read_events(out)
    assert rows == len(ev)
    meta = ev.runs["local"]
    assert meta.source == "bubblecast-runtime" and meta.schedule == "zb-h1"
    assert meta.microbatches == 4 and meta.partition == [6]
    assert meta.extra["emulated_slowdown"]["spec"] == "rank=0,factor=1.5,start=2"
    assert [a["action"]["action"] for a in meta.extra["actions"]] == ["set_microbatches"]
    costs = meta.extra["layer_costs"]
    assert sorted(set(costs["step"])) == [0, 2, 4] and set(costs["layer"]) == set(range(6))
    assert all(v > 0 for v in costs["forward_s"])
    f = ev.frame
    counts = f.groupby(["step", "op"], observed=True).size().unstack()
    m = [2, 2, 4, 4, 4]  # micro-batches per step (the controller switched after step 1)
    assert counts["F"].tolist() == m and counts["B"].tolist() == m and counts["W"].tolist() == m
    assert counts["OPTIMIZER"].tolist() == [1] * 5
    assert (f["layers"] == 6).all()
    assert set(f.loc[f["op"] == "F", "tokens"]) == {4 * 8, 2 * 8}  # samples/mb x seq_len


def test_checkpoint_resumes_under_another_plan(tmp_path: Path) -> None:
    from bubblecast.runtime.trainer import Trainer

    a = Trainer(_config(), record=False)
    for _ in range(2):
        a.train_step()
    a.save_checkpoint(str(tmp_path / "ckpt"))
    for _ in range(2):
        a.train_step()
    b = Trainer(_config(schedule="interleaved", chunks=2, partition=(4, 2)),
                resume=str(tmp_path / "ckpt"), record=False)
    assert b.step == 2
    for _ in range(2):
        b.train_step()
    la, lb = a.gather_losses(), b.gather_losses()
    assert [lb[s] for s in (2, 3)] == [la[s] for s in (2, 3)]
    assert _max_diff(b.layer_state(), a.layer_state()) == 0.0
    a.close()
    b.close()


def test_sleep_emulation_is_proportional(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    from bubblecast.runtime import rank_recorder as rec_mod
    from bubblecast.runtime.inject import parse_inject
    from bubblecast.telemetry.schema import RunMeta

    slept: list[float] = []
    clock = {"t": 10.0}

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock["t"] += seconds

    monkeypatch.setattr(rec_mod, "time", types.SimpleNamespace(
        perf_counter=lambda: clock["t"], sleep=sleep))

    class FakeStage:
        def forward_one_chunk(self, mb, *a, **k):
            clock["t"] += 0.001
            return mb

        def backward_one_chunk(self, mb, *a, **k):
            clock["t"] += 0.002
            return None

        def backward_weight_one_chunk(self, mb, *a, **k):
            return None

    rec = rec_mod.Recorder(run_id="r", rank=1, stage=1, origin_wall=0.0,
                           meta_fn=lambda: RunMeta(), injections=parse_inject(
                               "rank=1,factor=3,start=1;rank=0,factor=9"))
    stage = FakeStage()
    rec.attach([stage], {0: {}})
    for step in range(2):
        rec.begin_step(step, 4)
        stage.forward_one_chunk(0)
        stage.backward_one_chunk(0)
        rec.end_step()
    assert len(slept) == 2  # only step 1, only this rank's injection
    frame = rec.frame()
    measured = frame.loc[frame["step"] == 1, "duration_s"].to_numpy()
    assert slept == pytest.approx([0.002, 0.004])  # (factor - 1) x the op's own time
    assert measured == pytest.approx([0.003, 0.006])
    assert list(frame["op"]) == ["F", "B", "F", "B"] and len(measured) == 2


def test_custom_sequential_model() -> None:
    from bubblecast.errors import BubblecastError
    from bubblecast.runtime.networks import LayerModel
    from bubblecast.runtime.trainer import Trainer

    nn = torch.nn
    with torch.random.fork_rng():
        torch.manual_seed(0)  # every rank must construct the same Sequential
        seq = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.Tanh(),
                            nn.Linear(8, 2)).double()

    def batch(step: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(n, 4, generator=torch.Generator().manual_seed(step), dtype=torch.float64)
        return x, x[:, :2].sin()

    model = LayerModel.from_sequential(seq, torch.nn.functional.mse_loss, batch)
    cfg = _config(model=ModelSpec(kind="mlp", layers=5), schedule="interleaved", chunks=2,
                  partition=(2, 3), optimizer="sgd", lr=0.1)
    with pytest.raises(BubblecastError, match="has 5 layers"):
        Trainer(_config(model=ModelSpec(kind="mlp", layers=4)), model=model, record=False)
    t = Trainer(cfg, model=model, record=False)
    t.train_step()
    assert t.apply(Repartition((4, 1)))["ok"]
    t.train_step()
    ref = Reference(cfg, model=model)
    ref_losses = ref.run(2)
    losses = t.gather_losses()
    assert max(abs(losses[s] - ref_losses[s]) for s in range(2)) < 1e-12
    assert _max_diff(t.layer_state(), ref.layer_state()) < 1e-9
    t.close()
