"""Multi-node ``collect``: two "nodes" (separate torchrun agents, one process each) on this host
meeting at one c10d rendezvous endpoint; one node's clock is skewed by +5 s
(``BUBBLECAST_CLOCK_SKEW_S``) and the recorder's offset estimate puts it back on rank 0's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bubblecast.cli import main
from tests.helpers import free_port

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-c", "from bubblecast.cli import main; main()"]
TINY = ["collect", "--model", "mlp", "--layers", "2", "--stages", "2", "--microbatches", "2",
        "--steps", "4", "--hidden", "8", "--json"]
SKEW = 5.0


@pytest.mark.parametrize(("extra", "message"), [
    (["--nnodes", "2"], "--rdzv-endpoint: expected HOST:PORT"),
    (["--nnodes", "2", "--rdzv-endpoint", "localhost"], "expected HOST:PORT"),
    (["--nnodes", "0"], "--nnodes: must be >= 1"),
    (["--nnodes", "3", "--rdzv-endpoint", "localhost:1234"], "do not split over 3 nodes"),
    (["--nnodes", "2", "--rdzv-endpoint", "localhost:1234", "--checkpoint-dir", "/tmp/c",
      "--checkpoint-every", "2"], "not supported with --nnodes > 1"),
])
def test_bad_node_options_exit_2_before_launch(extra: list[str], message: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import bubblecast.runtime.launch as launch_mod

    def no_launch(*a, **k):
        raise AssertionError("launched despite a bad request")

    monkeypatch.setattr(launch_mod, "launch", no_launch)
    for command in ("collect", "run"):
        args = [command, *TINY[1:], *extra, "--out", str(tmp_path / "e.parquet")]
        if command == "run":
            args[args.index("--model")] = "--arch"
        assert main(args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
    assert list(tmp_path.iterdir()) == []


def test_torchrun_command_uses_the_rendezvous_on_several_nodes() -> None:
    from bubblecast.runtime.launch import Nodes, torchrun_command

    one = torchrun_command("J", 2)
    assert "--standalone" in one and one[one.index("--nproc-per-node") + 1] == "2"
    many = torchrun_command("J", 1, nodes=Nodes(2, "h:29400"), run_id="r")
    assert "--standalone" not in many
    for flag, value in (("--nnodes", "2"), ("--nproc-per-node", "1"), ("--rdzv-backend", "c10d"),
                        ("--rdzv-endpoint", "h:29400"), ("--rdzv-id", "r")):
        assert many[many.index(flag) + 1] == value


@pytest.mark.dist
def test_two_nodes_on_one_rendezvous_write_one_file_on_rank_0s_clock(tmp_path: Path) -> None:
    from bubblecast.telemetry import read_events

    out = tmp_path / "run.parquet"
    args = [*CLI, *TINY, "--out", str(out), "--nnodes", "2", "--rdzv-endpoint",
            f"127.0.0.1:{free_port()}", "--rdzv-id", "test-multinode"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    skewed = {**env, "BUBBLECAST_CLOCK_SKEW_S": str(SKEW)}
    procs = [subprocess.Popen(args, cwd=ROOT, env=e, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for e in (env, skewed)]
    try:
        outputs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, (_, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err[-2000:]
    summaries = [json.loads(o) for o, _ in outputs]
    assert summaries[0] == summaries[1]  # both nodes report rank 0's summary
    assert summaries[0]["rows"] == 4 * (2 * 2 * 2 + 2)  # steps x (ranks x mbs x F,B + opt)
    assert not out.with_name(out.name + ".partial").exists()  # merged and cleaned up

    events = read_events(out)
    frame, meta = events.frame, events.runs["run"]
    assert sorted(frame["rank"].unique()) == [0, 1] and len(frame) == summaries[0]["rows"]
    clock = meta.extra["clock"]
    offset, unc = clock["offset_s"]["1"], clock["uncertainty_s"]["1"]
    # whichever node got rank 0, rank 1's clock differs from it by the skew; the estimate
    # finds it to within its own uncertainty
    assert 0 < unc < 0.5
    assert abs(abs(offset) - SKEW) <= unc + 1e-6, clock
    # and the events are on one clock: the ranks' first ops are close (5 s apart without it),
    # and rank 1's first forward starts after rank 0's first forward (it needs its output)
    first = frame.groupby("rank")["start_s"].min()
    assert abs(first[1] - first[0]) < 1.0
    f0 = frame[(frame["step"] == 0) & (frame["op"] == "F") & (frame["microbatch"] == 0)]
    r0, r1 = (f0[f0["rank"] == r].iloc[0] for r in (0, 1))
    assert r1["start_s"] >= r0["start_s"] + r0["duration_s"] - unc
