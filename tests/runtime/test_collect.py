"""``bubblecast collect``: bad requests refused before launch; an emulated straggler shows up."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bubblecast.cli import main

ROOT = Path(__file__).resolve().parents[2]

BASE = ["collect", "--model", "mlp", "--layers", "8", "--stages", "2", "--microbatches", "4",
        "--steps", "5", "--schedule", "1f1b"]


@pytest.mark.parametrize(("extra", "message"), [
    (["--partition", "3,4"], "sums to 7"),
    (["--partition", "8,0"], "leaves a stage empty"),
    (["--stages", "9"], "need at least 9 layers"),
    (["--microbatches", "1"], "at least as many micro-batches as stages"),
    (["--schedule", "dualpipev", "--microbatches", "3"], "at least 4 micro-batches"),
    (["--schedule", "zb-h2"], "not shipped"),
    (["--inject", "rank=1,factor=fast"], "'factor' must be a number"),
    (["--inject", "rank=5,factor=2"], "rank 5 does not exist"),
    (["--model", "cnn"], "unknown model 'cnn'"),
    (["--batch-size", "6"], "does not split"),
    (["--action", "10:teleport=1"], "--action"),
    (["--partition", "4,x"], "comma-separated integers"),
    (["--checkpoint-every", "5"], "--checkpoint-every: needs --checkpoint-dir"),
    (["--resume"], "--resume: needs --checkpoint-dir"),
    (["--checkpoint-dir", "/nonexistent/ckpt"], "give --checkpoint-every N"),
    (["--checkpoint-dir", "/nonexistent/ckpt", "--checkpoint-every", "0"], "positive integer"),
    (["--checkpoint-dir", "/nonexistent/ckpt", "--resume"], "no complete checkpoint in"),
])
def test_bad_requests_exit_2_before_launch(extra: list[str], message: str, tmp_path: Path,
                                           capsys: pytest.CaptureFixture,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import bubblecast.runtime.launch as launch_mod

    def no_launch(*a, **k):
        raise AssertionError("launched despite a bad request")

    monkeypatch.setattr(launch_mod, "launch", no_launch)
    out = tmp_path / "e.parquet"
    code = main([*BASE, *extra, "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("bubblecast: error:") and message in err[0]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.dist
def test_injected_straggler_becomes_the_bottleneck(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture) -> None:
    import pandas as pd

    from bubblecast.sim.accounting import inspect_summary
    from bubblecast.telemetry import read_events

    out = tmp_path / "run.parquet"
    code = main([*BASE[:-4], "--steps", "30", "--schedule", "1f1b", "--inject",
                 "rank=1,factor=2.0,start=10", "--action", "20:repartition=3,5",
                 "--profile", str(tmp_path / "prof"), "--out", str(out), "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert result["rows"] > 0 and result["partition"] == [3, 5]
    assert [a["ok"] for a in result["actions"]] == [True]
    ev = read_events(out)
    # no leftovers: the events, the profile and the ranks' merged device metrics (OUT.metrics)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prof", "run.metrics", "run.parquet"]
    from bubblecast.telemetry.metrics import is_known_future, read_metrics

    metrics = read_metrics(out)  # sampled at steps run; announced tokens run ahead of them
    sampled = metrics.loc[~metrics["metric"].map(is_known_future)]
    assert set(metrics["run_id"]) == {"run"} and len(sampled)
    assert sampled["step"].between(0, 29).all()
    meta = ev.runs["run"]
    assert meta.source == "bubblecast-runtime" and meta.partition == [4, 4]
    assert meta.extra["emulated_slowdown"]["spec"] == "rank=1,factor=2.0,start=10"
    assert meta.extra["actions"][0]["seconds"] > 0 and meta.extra["actions"][0]["bytes"] > 0
    f = ev.frame
    assert len(ev) == result["rows"] and set(f["step"]) == set(range(30))
    layers = f.loc[f["op"] == "F"].groupby(["step", "stage"])["layers"].first().unstack()
    assert (layers.loc[:19] == [4, 4]).all().all() and (layers.loc[20:] == [3, 5]).all().all()
    per = ev.compute().groupby(["step", "stage"])["duration_s"].sum().unstack()
    before, after = per.loc[5:9].median(), per.loc[10:19].median()  # same partition, unprofiled
    assert after[1] > after[0]  # stage 1 is the bottleneck once slowed
    assert after[1] / after[0] > 1.4 * before[1] / before[0]  # and it is the injection
    late = ev.frame.loc[ev.frame["step"] >= 10]
    from bubblecast.telemetry import from_frame

    summary = inspect_summary(from_frame(late.reset_index(drop=True), dict(ev.runs)))
    if "bottleneck_stage" in summary:
        assert summary["bottleneck_stage"] == 1
    _check_kineto(tmp_path / "prof")
    assert isinstance(per, pd.DataFrame)


def _check_kineto(prof: Path) -> None:
    """The optional torch.profiler capture is readable by the kineto importer."""
    from bubblecast.telemetry.importers import load_events

    assert sorted(p.name for p in prof.iterdir()) == ["rank0.json", "rank1.json"]
    ev = load_events(prof, "kineto")
    assert set(ev.frame["stage"]) == {0, 1} and {"F", "B"} <= set(ev.frame["op"].astype(str))


# -- telemetry kept on failure, failure messages ---------------------------------------------
CLI = [sys.executable, "-c", "from bubblecast.cli import main; main()"]
TINY = ["collect", "--layers", "4", "--hidden", "16", "--stages", "2", "--microbatches", "2",
        "--layer-cost-every", "0"]


def _rank_pid(job_dir: Path, rank: int) -> int | None:
    """The pid of the worker of ``rank`` running the job in ``job_dir`` (from /proc)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
            env = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(job_dir).encode() in cmd and b"bubblecast.runtime.train_worker" in cmd \
                and f"RANK={rank}".encode() in env:
            return int(proc.name)
    return None


def _wait_for(predicate, proc: subprocess.Popen, what: str, limit: float = 240.0):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        if proc.poll() is not None:
            pytest.fail(f"the command ended before {what}: {proc.stderr.read()}")
        time.sleep(0.02)
    pytest.fail(f"no {what} after {limit} s")


@pytest.mark.dist
def test_a_rank_killed_mid_run_keeps_the_telemetry_so_far(tmp_path: Path) -> None:
    """Before: the job folder (and every part in it) was deleted, and the error read
    'training failed (=====...)'. Now the parts stay, and the one line names rank, signal and
    folder."""
    from bubblecast.telemetry import read_events

    out = tmp_path / "run.parquet"
    proc = subprocess.Popen([*CLI, *TINY, "--steps", "100000", "--flush-every", "5",
                             "--out", str(out)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    parts = tmp_path / "run.parquet.partial" / "parts-0"
    try:
        _wait_for(lambda: len(list(parts.glob("rank0001-*.parquet"))) >= 3, proc, "3 parts")
        pid = _wait_for(lambda: _rank_pid(parts.parent, 1), proc, "rank 1")
        os.kill(pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = err.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, err
    assert lines[0].startswith("bubblecast: error: training failed: rank 1 was killed by "
                               "SIGKILL; telemetry so far (steps 0-"), lines[0]
    assert lines[0].endswith(f"kept in {parts}") and not out.exists()
    ev = read_events(parts)
    per_rank = ev.frame.groupby("rank")["step"].agg(["min", "max", "nunique"])
    assert per_rank.loc[1, "min"] == 0 and per_rank.loc[1, "max"] >= 14
    assert (per_rank["nunique"] == per_rank["max"] + 1).all()  # every step, none missing
    assert f"steps 0-{per_rank['max'].max()} in {len(list(parts.glob('*.parquet')))} part" \
        in lines[0]
    # The next run to the same output refuses to bury them: exit 2, one line, nothing launched.
    again = subprocess.run([*CLI, *TINY, "--steps", "2", "--out", str(out)], cwd=ROOT,
                           capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert again.returncode == 2 and again.stderr.count("\n") == 1
    assert f"{parts.parent} holds the telemetry of an unfinished run" in again.stderr
    assert len(read_events(parts)) == len(ev)


@pytest.mark.dist
def test_a_terminated_command_stops_its_ranks_and_says_where_the_telemetry_is(
        tmp_path: Path) -> None:
    """SIGTERM to collect (before: it died at once, leaving a hidden job folder and torchrun
    training on): it stops torchrun and its ranks, keeps the parts, names them, exits 143."""
    out = tmp_path / "run.parquet"
    proc = subprocess.Popen([*CLI, *TINY, "--steps", "100000", "--flush-every", "5",
                             "--out", str(out)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    parts = tmp_path / "run.parquet.partial" / "parts-0"
    try:
        _wait_for(lambda: any(parts.glob("rank0001-*.parquet")), proc, "a part")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143 and err.count("\n") == 1, err
    assert err.startswith("bubblecast: error: interrupted by SIGTERM; telemetry so far (steps 0-")
    assert err.strip().endswith(f"kept in {parts}")
    assert _rank_pid(parts.parent, 0) is None and _rank_pid(parts.parent, 1) is None


def _summary(rank: int, code: int, sig: str = "") -> str:
    return (f"[0]:\n  time      : 2026-12-02_19:51:35\n  host      : localhost\n"
            f"  rank      : {rank} (local_rank: {rank})\n"
            f"  exitcode  : {code} (pid: 2846){sig}\n  error_file: <N/A>\n")


def test_failure_message_names_rank_and_signal(tmp_path: Path) -> None:
    from bubblecast.runtime.launch import failure_message

    log = tmp_path / "torchrun.log"
    banner = "=" * 54 + "\nbubblecast.runtime.train_worker FAILED\n" + "-" * 54 + "\nFailures:\n"
    log.write_text(banner + _summary(0, -15, "  (SIGTERM)") + "-" * 54
                   + "\nRoot Cause (first observed failure):\n" + _summary(1, -9, "  (SIGKILL)")
                   + "=" * 54 + "\n")
    assert failure_message(tmp_path) == "rank 1 was killed by SIGKILL"
    assert failure_message(tmp_path, -9) == "torchrun was killed by SIGKILL"
    # A rank that raised: its own first line, the earliest error file (the others follow it).
    log.write_text(banner + "Root Cause (first observed failure):\n" + _summary(0, 1)
                   + "=" * 54 + "\n")
    (tmp_path / "error-rank1.txt").write_text("ValueError: bad batch\nTraceback ...\n")
    later = tmp_path / "error-rank0.txt"
    later.write_text("RuntimeError: Connection closed by peer\n")
    os.utime(later, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
    assert failure_message(tmp_path) == "rank 1: ValueError: bad batch"
    for f in tmp_path.glob("error-*"):
        f.unlink()
    assert failure_message(tmp_path) == "rank 0 exited with code 1"
