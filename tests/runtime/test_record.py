"""``bubblecast.record`` on a user's own torch pipeline: two gloo processes under torchrun.

One launch runs this file as the job (``__main__`` below): for ``Schedule1F1B``,
``ScheduleGPipe`` and ``ScheduleInterleaved1F1B`` each rank trains a tiny MLP twice from the
same initial weights, once bare and once inside ``bubblecast.record`` (only the public API),
and compares losses and gradients bit for bit. The tests then read the recorded events with
``bubblecast inspect --json`` and ``whatif --json``. The same job records the other torch
schedule classes (``ScheduleLoopedBFS``, ``ScheduleInterleavedZeroBubble``,
``ScheduleZBVZeroBubble``, ``ScheduleDualPipeV``) for ``inspect``. A second launch runs the
README example (``examples/record_pipeline.py``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve()
EXAMPLE = HERE.parents[2] / "examples" / "record_pipeline.py"
SCHEDULES = {"1f1b": "Schedule1F1B", "gpipe": "ScheduleGPipe",
             "interleaved": "ScheduleInterleaved1F1B"}
STEPS, MICROBATCHES = 4, 4
#: The other torch schedule classes (two stages per rank, loop or V placement): recorded only.
OTHERS = {"ScheduleLoopedBFS": "loop", "ScheduleInterleavedZeroBubble": "loop",
          "ScheduleZBVZeroBubble": "v", "ScheduleDualPipeV": "v"}

pytestmark = pytest.mark.dist


# -- the job (each rank, under torchrun) ------------------------------------------------------
def _train(name: str, rank: int, world: int, out: Path | None) -> tuple[list, list]:
    """Train STEPS steps of schedule ``name``; (losses, grads per step) of this rank. Recorded
    into ``out`` when given."""
    import torch
    from torch.distributed.pipelining import PipelineStage, schedules

    import bubblecast

    chunks = 2 if name == "interleaved" else 1
    torch.manual_seed(0)
    layers = [torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
              for _ in range(2 * world * chunks)]
    n = world * chunks
    stages = [PipelineStage(torch.nn.Sequential(*layers[2 * v:2 * v + 2]), v, n,
                            torch.device("cpu")) for v in range(rank, n, world)]
    cls = getattr(schedules, SCHEDULES[name])
    schedule = cls(stages if chunks > 1 else stages[0], MICROBATCHES,
                   loss_fn=torch.nn.functional.mse_loss)
    params = [p for s in stages for p in s.submod.parameters()]
    opt = torch.optim.SGD(params, lr=0.1)
    rec = bubblecast.record(schedule, out=out, run_id=name, optimizer=opt, tokens=8) \
        if out is not None else None
    losses, grads = [], []
    for step in range(STEPS):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(8, 8, generator=g), torch.randn(8, 8, generator=g)
        mb_losses: list = []
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=y, losses=mb_losses)
        losses.append([v.detach().clone() for v in mb_losses])
        grads.append([p.grad.detach().clone() for p in params])
        opt.step()
        opt.zero_grad()
        if step == 1:  # a forward-only pass between steps is not recorded
            schedule.eval(x) if rank == 0 else schedule.eval(target=y)
    if rec is not None:
        rec.close()
    return losses, grads


def _record_other(name: str, rank: int, world: int, out: Path) -> None:
    """Two recorded steps of torch schedule class ``name`` (4 virtual stages on 2 ranks)."""
    import torch
    from torch.distributed.pipelining import PipelineStage, schedules

    import bubblecast

    n = 2 * world
    torch.manual_seed(0)
    layers = [torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()) for _ in range(n)]
    mine = range(rank, n, world) if OTHERS[name] == "loop" else (rank, n - 1 - rank)
    stages = [PipelineStage(layers[v], v, n, torch.device("cpu")) for v in mine]
    schedule = getattr(schedules, name)(stages, MICROBATCHES,
                                        loss_fn=torch.nn.functional.mse_loss)
    opt = torch.optim.SGD([p for s in stages for p in s.submod.parameters()], lr=0.1)
    first, last = any(s.is_first for s in stages), any(s.is_last for s in stages)
    with bubblecast.record(schedule, out=out, run_id=name, optimizer=opt):
        for _ in range(2):
            x, y = torch.randn(8, 8), torch.randn(8, 8)
            schedule.step(*((x,) if first else ()), **({"target": y} if last else {}))
            opt.step()
            opt.zero_grad()


def job(job_dir: Path) -> None:
    import torch
    import torch.distributed as dist

    import bubblecast

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    result: dict[str, Any] = {}
    for name in SCHEDULES:
        bare = _train(name, rank, world, None)
        recorded = _train(name, rank, world, job_dir / "telemetry")
        same = all(torch.equal(a, b) for x, y in zip(bare, recorded, strict=True)
                   for sa, sb in zip(x, y, strict=True) for a, b in zip(sa, sb, strict=True))
        result[name] = {"bit_equal": same, "n_losses": sum(len(v) for v in bare[0])}
    for name in OTHERS:
        _record_other(name, rank, world, job_dir / "telemetry")
    try:  # the same run_id again in the same place: refused on every rank, nothing run
        _train("1f1b", rank, world, job_dir / "telemetry")
    except bubblecast.BubblecastError as exc:
        result["clash"] = str(exc)
    (job_dir / f"result-rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


# -- the tests ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from bubblecast.runtime.launch import failure_message, launch

    out = tmp_path_factory.mktemp("record")
    code = launch(out, 2, script=str(HERE), timeout=240)
    assert code == 0, failure_message(out) + "\n" + (out / "torchrun.log").read_text()[-3000:]
    return out


def _cli_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    from bubblecast.cli import main

    assert main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_recording_never_changes_the_math(recorded: Path) -> None:
    for rank in (0, 1):
        result = json.loads((recorded / f"result-rank{rank}.json").read_text())
        assert sorted(result) == sorted([*SCHEDULES, "clash"])
        for name, r in result.items():
            if name == "clash":
                continue
            assert r["bit_equal"], (name, rank)
    last = json.loads((recorded / "result-rank1.json").read_text())
    assert all(last[name]["n_losses"] == STEPS * MICROBATCHES for name in SCHEDULES)


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_events_are_read_by_inspect_and_whatif(recorded: Path, name: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    from bubblecast import read_events

    path = recorded / "telemetry" / f"run_id={name}"
    assert sorted(p.name for p in path.iterdir()) == ["rank0000-000000.parquet",
                                                       "rank0001-000000.parquet"]
    events = read_events(path)
    meta = events.runs[name]
    chunks = 2 if name == "interleaved" else 1
    assert (meta.schedule, meta.stages, meta.chunks, meta.microbatches) == \
        (name, 2, chunks, MICROBATCHES)
    assert meta.extra["timing"] == "host" and meta.extra["torch_schedule"] == SCHEDULES[name]
    assert meta.partition == [2] * (2 * chunks)
    f = events.frame
    counts = f.groupby(["step", "rank", "op"], observed=True).size()
    assert counts.xs("F", level="op").tolist() == [MICROBATCHES * chunks] * (2 * STEPS)
    assert counts.xs("B", level="op").tolist() == [MICROBATCHES * chunks] * (2 * STEPS)
    assert counts.xs("OPTIMIZER", level="op").tolist() == [1] * (2 * STEPS)  # eval not counted
    assert sorted(set(f["chunk"])) == list(range(chunks))
    assert set(f.loc[f["op"] == "F", "tokens"]) == {8}
    summary = _cli_json(capsys, "inspect", str(path))
    assert summary["steps"] == STEPS and summary["stages"] == 2 and summary["timing"] == "host"
    assert 0.0 <= summary["bubble_fraction"] < 1.0
    whatif = _cli_json(capsys, "whatif", str(path))
    assert whatif["observed_step_s"] > 0 and whatif["scenarios"]["ideal"]["speedup"] > 0


@pytest.mark.parametrize("name", list(OTHERS))
def test_every_other_schedule_class_is_recorded(recorded: Path, name: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from bubblecast import read_events

    path = recorded / "telemetry" / f"run_id={name}"
    events = read_events(path)
    meta = events.runs[name]
    assert (meta.stages, meta.chunks, meta.extra["torch_schedule"]) == (2, 2, name)
    f = events.frame
    per_rank = f.loc[f["op"] == "F"].groupby(["step", "rank"], observed=True).size()
    assert per_rank.tolist() == [2 * MICROBATCHES] * 4  # 2 steps x 2 ranks, both chunks
    assert sorted(set(f["chunk"])) == [0, 1]
    split = name != "ScheduleLoopedBFS"  # the zero-bubble schedules split the backward
    assert ((f["op"] == "W").sum() > 0) == split
    summary = _cli_json(capsys, "inspect", str(path))
    assert summary["steps"] == 2 and summary["stages"] == 2


def test_a_second_recording_under_the_same_run_id_is_refused(recorded: Path) -> None:
    for rank in (0, 1):
        result = json.loads((recorded / f"result-rank{rank}.json").read_text())
        assert "already holds rank" in result["clash"] and "run '1f1b'" in result["clash"]


def test_readme_example_runs_under_torchrun(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    from bubblecast.runtime.launch import failure_message, launch

    code = launch(tmp_path, 2, script=str(EXAMPLE), extra=["--steps", "6"], timeout=240)
    assert code == 0, failure_message(tmp_path) + (tmp_path / "torchrun.log").read_text()[-3000:]
    summary = _cli_json(capsys, "inspect", str(tmp_path / "run_id=example"))
    assert summary["steps"] == 6 and summary["stages"] == 2
    from bubblecast import read_events

    f = read_events(tmp_path / "run_id=example").frame
    compute = f.loc[f["op"] != "OPTIMIZER"]
    assert (compute["documents"] == 3).all()  # the example's set_documents
    assert (compute["tokens_sq"] >= compute["tokens"] ** 2 / 3).all()


if __name__ == "__main__":
    from bubblecast.runtime.shutdown import exit_process

    job(Path(sys.argv[1]))
    exit_process(0)  # no finalization: see bubblecast.runtime.shutdown
