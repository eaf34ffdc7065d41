"""Data-parallel replicas in the runtime (issue 25 item 2): 2 replicas x 2 stages under
torchrun, float64. The packed model with a plan giving the replicas different micro-batch
counts (each count its own schedule), and the MLP with equal shares of a fixed batch: after
every step the parameters equal the single-process reference on the same global batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bubblecast.runtime.balanced_sampler import global_token_loss, loss_tokens
from bubblecast.runtime.document_loader import DocumentLoader
from bubblecast.runtime.networks import LayerModel, make_optimizer
from tests.runtime.dist_replicas import STEPS, mlp_config, packed_config
from tests.runtime.dist_results import launch_scenarios

HERE = Path(__file__).resolve().parent
TOL = 1e-6


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    return launch_scenarios(tmp_path_factory.mktemp("replicas"), 4, HERE / "dist_replicas.py")


def _replica_state(per_rank: list[dict[str, Any]], replica: int) -> dict[int, dict]:
    out: dict[int, dict] = {}
    for r in per_rank:
        if r["replica"] == replica:
            out.update(r["state"])
    return out


def _max_diff(a: dict[int, dict], b: dict[int, dict]) -> float:
    assert sorted(a) == sorted(b)
    return max(float((a[i][k] - b[i][k]).abs().max()) for i in a for k in a[i])


def packed_reference() -> tuple[list[float], dict[int, dict]]:
    """The whole packed model in one process: each step every document of the global batch
    (the loader's packing), summed token losses over the batch's tokens, one SGD step."""
    c = packed_config()
    model = LayerModel.example(c.model, c.seed)
    layers = [model.build(i) for i in range(c.model.layers)]
    stack = model.stack(layers)
    opt = make_optimizer(c.optimizer, list(stack.parameters()), c.lr, c.momentum)
    loader = DocumentLoader(budget=c.model.seq_len, vocab=c.model.vocab, seed=c.seed,
                            replicas=c.replicas, microbatches=c.microbatches, stages=c.stages,
                            schedule="1f1b")
    losses = []
    for step in range(STEPS):
        total = loss_tokens(loader.lengths(step))
        mbs = [mb for rep in loader.static_plan(step).microbatches for mb in rep]
        batch = loader.tensors(step, mbs)
        loss = 0.0
        for j in range(len(mbs)):
            out = stack(batch.tokens[j:j + 1], documents=batch.documents[j:j + 1])
            part = global_token_loss(out, batch.labels[j:j + 1], total)
            part.backward()
            loss += float(part.detach())
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss)
    state = {i: {k: v.detach().clone() for k, v in layer.state_dict().items()}
             for i, layer in enumerate(layers)}
    return losses, state


@pytest.mark.dist
def test_packed_replicas_with_uneven_counts_match_the_reference(results: dict) -> None:
    per_rank = results["packed"]
    counts = per_rank[0]["counts"]
    assert counts[0][0] < counts[0][1] and sum(counts[0]) == 8  # the slow replica runs fewer
    assert counts[1] == [4, 4]
    ref_losses, ref_state = packed_reference()
    for replica in (0, 1):
        assert _max_diff(_replica_state(per_rank, replica), ref_state) < TOL
    losses = per_rank[0]["losses"]
    assert [abs(losses[s] - ref_losses[s]) < TOL for s in range(STEPS)] == [True] * STEPS


@pytest.mark.dist
def test_mlp_replicas_match_the_reference(results: dict) -> None:
    from dataclasses import replace

    from benchmarks.oracles.runtime_reference import Reference

    c = mlp_config()
    ref = Reference(replace(c, replicas=1, stages=1, microbatches=8))
    ref_losses = ref.run(STEPS)
    per_rank = results["mlp"]
    for replica in (0, 1):
        assert _max_diff(_replica_state(per_rank, replica), ref.layer_state()) < TOL
    losses = per_rank[0]["losses"]
    assert max(abs(losses[s] - ref_losses[s]) for s in range(STEPS)) < TOL


@pytest.mark.parametrize(("extra", "message"), [
    (["--replicas", "8", "--stages", "4"],
     "--replicas 8 x --stages 4 = 32 ranks: this machine has 2 CPU cores, it starts at most 8"),
    (["--replicas", "0"], "--replicas: must be a positive integer"),
    (["--replicas", "2", "--action", "3:microbatches=8"], "--action: --replicas 2 runs keep"),
    (["--replicas", "2", "--checkpoint-dir", "/nonexistent", "--checkpoint-every", "2"],
     "checkpoints are not supported with --replicas 2"),
    (["--replicas", "3", "--nnodes", "4", "--rdzv-endpoint", "h:1"],
     "6 ranks do not split over 4 nodes"),
    (["--documents", "long-tail"], "--documents: needs the packed model"),
])
def test_replica_requests_the_machine_cannot_start_exit_2_before_launch(
        extra: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import bubblecast.runtime.launch as launch_mod
    from bubblecast.cli import main

    def no_launch(*a: Any, **k: Any) -> None:
        raise AssertionError("launched despite a bad request")

    monkeypatch.setattr(launch_mod, "launch", no_launch)
    monkeypatch.setattr(launch_mod.os, "cpu_count", lambda: 2)
    out = tmp_path / "e.parquet"
    code = main(["collect", "--model", "mlp", "--layers", "8", "--stages", "2", "--steps", "3",
                 *extra, "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("bubblecast: error:") and message in err[0], err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.dist
def test_collect_packed_replicas_records_documents_per_microbatch(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``collect --model packed --replicas 2 --stages 2``: 4 ranks; every micro-batch's ops
    carry its tokens, tokens_sq and documents; both replicas in the events; the run metadata
    holds each step's document lengths."""
    import json

    import numpy as np

    from bubblecast.cli import main
    from bubblecast.telemetry import read_events

    out = tmp_path / "packed.parquet"
    code = main(["collect", "--model", "packed", "--layers", "4", "--hidden", "16", "--heads",
                 "2", "--seq-len", "128", "--vocab", "32", "--stages", "2", "--replicas", "2",
                 "--microbatches", "2", "--steps", "4", "--layer-cost-every", "0",
                 "--out", str(out), "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert result["replicas"] == 2 and result["planner"] == "static"
    assert result["counts"] == {str(s): [2, 2] for s in range(4)}
    ev = read_events(out)
    frame, meta = ev.frame, ev.runs[result["run_id"]]
    assert meta.replicas == 2 and meta.microbatches == 2
    assert sorted(frame["replica"].unique()) == [0, 1] and sorted(frame["rank"].unique()) == \
        [0, 1, 2, 3]
    docs = meta.extra["documents"]
    assert len(docs["lengths"]) == 4 and docs["token_budget"] == 128
    assert result["documents_trained"] == sum(len(x) for x in docs["lengths"])
    f = frame[frame["op"] == "F"]
    assert (f["tokens"] <= 128).all() and (f["documents"] >= 1).all()
    # per step, the micro-batches' statistics add up to the step's documents
    for step, x in enumerate(docs["lengths"]):
        rows = f[(f["step"] == step) & (f["stage"] == 0)]
        assert int(rows["tokens"].sum()) == sum(x)
        assert float(rows["tokens_sq"].sum()) == float(np.sum(np.square(x)))
        assert int(rows["documents"].sum()) == len(x)
