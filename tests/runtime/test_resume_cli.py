"""``collect --checkpoint-dir/--checkpoint-every/--resume``: a run SIGKILLed (the command, its
torchrun and, through them, its ranks) resumes from its last checkpoint with the losses of an
uninterrupted run, bit for bit, and its events file holds every step once, on one clock."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from bubblecast.cli import main
from tests.runtime.test_collect import CLI, ROOT, TINY, _rank_pid, _wait_for

STEPS = 100
ARGS = [*TINY, "--steps", str(STEPS), "--flush-every", "10", "--checkpoint-every", "10"]


def _collect(capsys: pytest.CaptureFixture, *args: str) -> dict:
    code = main([*ARGS, *args, "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)


@pytest.mark.dist
def test_killed_run_resumes_bit_identically(tmp_path: Path,
                                            capsys: pytest.CaptureFixture) -> None:
    from bubblecast.telemetry import read_events

    straight = _collect(capsys, "--checkpoint-dir", str(tmp_path / "ckpt-a"),
                        "--out", str(tmp_path / "straight.parquet"))
    assert straight["first_step"] == 0 and len(straight["losses"]) == STEPS
    assert len(list((tmp_path / "ckpt-a").glob("step-*/meta.json"))) == STEPS // 10

    ckpt, out = tmp_path / "ckpt-b", tmp_path / "resumed.parquet"
    proc = subprocess.Popen([*CLI, *ARGS, "--checkpoint-dir", str(ckpt), "--out", str(out)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)},
                            start_new_session=True)
    job = tmp_path / "resumed.parquet.partial"
    try:
        _wait_for(lambda: (ckpt / "step-00000020" / "meta.json").exists(), proc,
                  "checkpoint 20")
        os.killpg(proc.pid, signal.SIGKILL)  # the command and torchrun, at once
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    for _ in range(500):  # the ranks die with torchrun rather than train on
        if _rank_pid(job, 0) is None and _rank_pid(job, 1) is None:
            break
        time.sleep(0.02)
    assert _rank_pid(job, 0) is None and _rank_pid(job, 1) is None
    assert not out.exists() and any(job.glob("parts-0/*.parquet"))
    done = sorted(p.parent.name for p in ckpt.glob("step-*/meta.json"))
    assert 2 <= len(done) < STEPS // 10

    resumed = _collect(capsys, "--checkpoint-dir", str(ckpt), "--resume", "--out", str(out))
    start = resumed["first_step"]
    assert f"step-{start:08d}" == done[-1]  # the last complete checkpoint
    assert list(resumed["losses"]) == [str(s) for s in range(start, STEPS)]
    assert resumed["losses"] == {s: v for s, v in straight["losses"].items()
                                 if int(s) >= start}  # bit-identical, not merely close
    assert resumed["last_loss"] == straight["last_loss"] and not job.exists()
    # The events file holds every step once: the killed attempt's before the checkpoint.
    ev, ref = read_events(out).frame, read_events(tmp_path / "straight.parquet").frame
    key = ["step", "rank", "op", "microbatch"]
    assert len(ev) == len(ref) and not ev.duplicated(key).any()
    assert sorted(ev["step"].unique()) == list(range(STEPS))
    by_step = ev.groupby("step")["start_s"]
    assert by_step.min().loc[start] > by_step.max().loc[start - 1]  # one clock, in order


def test_resume_refuses_a_checkpoint_that_does_not_fit(tmp_path: Path) -> None:
    from dataclasses import asdict

    from bubblecast.errors import BubblecastError
    from bubblecast.runtime.checkpoint import CheckpointOptions, step_dir
    from bubblecast.runtime.train_config import ModelSpec

    model = asdict(ModelSpec(layers=4, hidden=16))
    for step in (10, 20):
        step_dir(tmp_path, step).mkdir()
        (step_dir(tmp_path, step) / "meta.json").write_text(json.dumps({"step": step,
                                                                         "model": model}))
    step_dir(tmp_path, 30).mkdir()  # killed while saving: no meta.json, not complete
    options = CheckpointOptions(str(tmp_path), every=10, resume=True)
    resume, start, at = options.resolve(model, 50)
    assert (resume, start) == (str(step_dir(tmp_path, 20)), 20)
    assert at == {30: str(step_dir(tmp_path, 30)), 40: str(step_dir(tmp_path, 40)),
                  50: str(step_dir(tmp_path, 50))}
    with pytest.raises(BubblecastError, match="--steps 20 leaves nothing to run"):
        options.resolve(model, 20)
    with pytest.raises(BubblecastError, match="--resume: checkpoint .* is of model"):
        options.resolve({**model, "hidden": 32}, 50)


def test_job_folder_locks_refuses_and_carries(tmp_path: Path) -> None:
    """OUT.partial without processes: a second job is locked out; a failed job's parts stay
    and bar a fresh job; a resuming one carries the rows before its checkpoint, once."""
    from bubblecast.errors import BubblecastError
    from bubblecast.runtime.jobdir import JobDir
    from bubblecast.telemetry import read_events, write_events
    from tests.dataset.synth import make_events

    out = tmp_path / "run.parquet"
    first = JobDir(out).open()
    with pytest.raises(BubblecastError, match="another collect or run is writing"):
        JobDir(out).open()
    ev = make_events(runs=1, steps=30, stages=2, prefix="run")
    write_events(ev, first.parts / "rank0000-000000.parquet")
    failed = first.failed("training failed: rank 1 was killed by SIGKILL")
    assert str(failed).endswith(f"(steps 0-29 in 1 part file) kept in {first.parts}")
    with pytest.raises(BubblecastError, match="holds the telemetry of an unfinished run"):
        JobDir(out).open()
    other = JobDir(out, resuming=True).open()
    with pytest.raises(BubblecastError, match="holds run 'run0', this run is 'other'"):
        other.carry(20, "other")
    assert other.close(ok=False) == first.parts
    again = JobDir(out, resuming=True).open()
    assert again.parts.name == "parts-1" and again.carry(20, "run0") > 0
    kept = read_events(again.parts).frame
    assert sorted(kept["step"].unique()) == list(range(20))
    assert [p.name for p in again.attempts()] == ["parts-1"]  # parts-0 gone once carried
    assert again.close(ok=True) is None and not again.root.exists()
