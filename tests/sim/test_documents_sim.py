"""Packed-document runs in the simulator (SPEC §3 "Work balancing"): the loader's packing, the
per-op work columns, op times that follow the micro-batch cost, the ``slow-replica`` scenario
and the ``simulate --documents`` command line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bubblecast.cli import main
from bubblecast.errors import BubblecastError
from bubblecast.sim.documents import DocumentSource, WorkCost, load_documents, next_fit
from bubblecast.sim.scenarios import SCENARIOS, Mixed, RunShape, make_scenario
from bubblecast.sim.simulator import SimConfig, simulate_events
from bubblecast.telemetry import read_events

SHAPE = {"schedule": "1f1b", "stages": 4, "microbatches": 8, "replicas": 4}
F, B, W = 2.0, 3.0, 1.0  # distinct per kind: a 1F1B backward op takes b + w


def doc_events(steps=12, documents="lognormal", scenario="none", seed=5, **kw):
    config = SimConfig(**{**SHAPE, **kw}, f=F, b=B, w=W, steps=steps, documents=documents,
                       scenario=scenario, seed=seed)
    return config, simulate_events(config)


def packed(meta) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each step's (lengths, owner) as the data loader packs them, from the run's metadata."""
    docs = meta.extra["documents"]
    return [(np.array(batch), next_fit(batch, docs["token_budget"])) for batch in docs["lengths"]]


def per_microbatch(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (step, replica, microbatch): the work columns, checked equal on every op."""
    g = frame.groupby(["step", "replica", "microbatch"])[["tokens", "tokens_sq", "documents"]]
    assert (g.nunique() == 1).all().all()  # every compute op of a micro-batch, every stage
    return g.first()


def test_packing_invariants_and_metadata():
    config, ev = doc_events(steps=15)
    bins = SHAPE["replicas"] * SHAPE["microbatches"]
    meta = ev.runs["sim-0"]
    docs = meta.extra["documents"]
    assert set(docs) == {"source", "attention_share", "mean_length", "token_budget", "cost",
                         "lengths"}
    assert docs["source"] == DocumentSource("lognormal", 4096).to_json()
    assert (docs["attention_share"], docs["token_budget"]) == (0.5, 4096)
    assert docs["mean_length"] == DocumentSource("lognormal", 4096).mean_length()
    assert WorkCost.from_json(docs["cost"]) == WorkCost.attention(0.5, docs["mean_length"], 4096)
    assert len(docs["lengths"]) == 15
    for lengths, owner in packed(meta):
        assert owner[-1] == bins - 1  # exactly replicas * M micro-batches
        assert np.bincount(owner, weights=lengths).max() <= 4096  # budget respected
        assert len(owner) == len(lengths)  # every document in exactly one micro-batch
    rows = per_microbatch(ev.frame)
    assert len(rows) == 15 * bins
    by_step = rows.groupby(level="step")
    assert by_step["documents"].sum().tolist() == [len(b) for b in docs["lengths"]]
    assert by_step["tokens"].sum().tolist() == [sum(b) for b in docs["lengths"]]


def test_work_columns_equal_the_loaders_micro_batches():
    _, ev = doc_events(steps=10, documents="long-tail", scenario="jitter")
    fr = ev.frame
    assert str(fr["tokens"].dtype) == "Int64" and str(fr["documents"].dtype) == "Int32"
    assert fr["tokens_sq"].dtype == np.float64
    rows = per_microbatch(fr)
    m = SHAPE["microbatches"]
    for step, (lengths, owner) in enumerate(packed(ev.runs["sim-0"])):
        j = owner  # micro-batch j of the step runs on replica j // M as its (j % M)-th
        want = pd.DataFrame({"replica": j // m, "microbatch": j % m, "x": lengths}).assign(
            sq=lambda d: d["x"].astype(float) ** 2).groupby(["replica", "microbatch"]).agg(
            tokens=("x", "sum"), tokens_sq=("sq", "sum"), documents=("x", "size"))
        got = rows.loc[step]
        np.testing.assert_array_equal(got["tokens"].to_numpy(int), want["tokens"].to_numpy())
        np.testing.assert_array_equal(got["tokens_sq"].to_numpy(), want["tokens_sq"].to_numpy())
        np.testing.assert_array_equal(got["documents"].to_numpy(int),
                                      want["documents"].to_numpy())


@pytest.mark.parametrize("share", [0.0, 0.5, 0.8])
def test_op_durations_follow_the_micro_batch_cost(share):
    _, ev = doc_events(steps=6, documents="long-tail", attention_share=share)
    fr = ev.frame
    mean = DocumentSource("long-tail", 4096).mean_length()
    x_cost = ((1 - share) * fr["tokens"].to_numpy(float)
              + share * fr["tokens_sq"].to_numpy() / mean) / 4096  # independent of WorkCost
    nominal = np.where(fr["op"].astype(str) == "F", F, B + W) / 1000.0
    np.testing.assert_allclose(fr["duration_s"].to_numpy() / nominal, x_cost, rtol=1e-12)
    assert x_cost.std() > 0.05  # the documents do vary the work


def test_a_full_micro_batch_of_mean_length_documents_takes_the_stage_time(tmp_path):
    lengths = tmp_path / "even.json"
    lengths.write_text(json.dumps([256] * 5))  # 16 documents fill each 4096-token micro-batch
    _, ev = doc_events(steps=3, documents=str(lengths))
    fr = ev.frame
    assert (fr["tokens"] == 4096).all() and (fr["documents"] == 16).all()
    f_ops = fr[fr["op"].astype(str) == "F"]
    np.testing.assert_allclose(f_ops["duration_s"], F / 1000.0, rtol=1e-12)


def test_same_seed_same_events_and_documents_independent_of_scenario():
    _, a = doc_events(scenario="slow-replica", seed=9)
    _, b = doc_events(scenario="slow-replica", seed=9)
    pd.testing.assert_frame_equal(a.frame, b.frame)
    assert a.runs["sim-0"].extra == b.runs["sim-0"].extra
    _, plain = doc_events(scenario="none", seed=9)
    _, other = doc_events(scenario="none", seed=10)
    lengths = a.runs["sim-0"].extra["documents"]["lengths"]
    assert plain.runs["sim-0"].extra["documents"]["lengths"] == lengths
    assert other.runs["sim-0"].extra["documents"]["lengths"] != lengths


def test_runs_draw_their_own_documents():
    config = SimConfig(**SHAPE, steps=4, documents="lognormal", runs=2, seed=3)
    ev = simulate_events(config)
    first, second = (ev.runs[r].extra["documents"]["lengths"] for r in ("sim-0", "sim-1"))
    assert first != second
    alone = simulate_events(SimConfig(**SHAPE, steps=4, documents="lognormal", runs=1, seed=3,
                                      first_run=1))
    assert alone.runs["sim-1"].extra["documents"]["lengths"] == second


def test_slow_replica_slows_exactly_one_replica_from_the_onset():
    kw = {"seed": 4, "noise_sigma": 0.0}
    slow = make_scenario("slow-replica", replica=2, onset_min=0.5, onset_max=0.5, **kw)
    _, base = doc_events(steps=21, scenario=make_scenario("none", seed=4))
    _, ev = doc_events(steps=21, scenario=slow)
    info = ev.runs["sim-0"].extra["scenario"]["realised"]
    assert info == {"replica": 2, "ranks": [8, 9, 10, 11], "onset": 10, "factor": 1.5}
    fr = ev.frame
    ratio = fr["duration_s"].to_numpy() / base.frame["duration_s"].to_numpy()
    hit = ((fr["replica"] == 2) & (fr["step"] >= 10)).to_numpy()
    np.testing.assert_allclose(ratio[hit], 1.5, rtol=1e-12)
    np.testing.assert_allclose(ratio[~hit], 1.0, rtol=1e-12)
    np.testing.assert_array_equal(fr["speed"].to_numpy(), np.where(hit, 1.5, 1.0))


@pytest.mark.parametrize("seed", range(8))
def test_slow_replica_draws(seed):
    shape = RunShape(steps=101, stages=3, replicas=4, microbatches=2)
    sc = make_scenario("slow-replica", seed=seed, factor_min=1.2, factor_max=2.0)
    d = sc.draw(shape)
    r, onset, factor = d.info["replica"], d.info["onset"], d.info["factor"]
    assert 25 <= onset <= 50 and 1.2 <= factor <= 2.0 and 0 <= r < 4
    want = np.ones((101, 12))
    want[onset:, 3 * r:3 * r + 3] = factor
    np.testing.assert_array_equal(d.speed, want)
    assert d.noise_sigma == 0.01 and d.work is None


@pytest.mark.parametrize(("params", "shape", "match"), [
    ({}, RunShape(10, 4, 1, 8), r"--scenario slow-replica: needs --replicas >= 2, got 1"),
    ({"replica": 3}, RunShape(10, 4, 2, 8), r"replica 3 out of range \(0..1\)"),
    ({"factor_min": 0.9}, None, r"slow-replica factor"),
    ({"onset_min": 0.6, "onset_max": 0.4}, None, r"onset_min <= onset_max"),
    ({"onset_max": 1.5}, None, r"onset_max <= 1"),
])
def test_slow_replica_bad_parameters(params, shape, match):
    with pytest.raises(BubblecastError, match=match):
        make_scenario("slow-replica", **params).draw(shape)


def test_slow_replica_is_registered_but_not_a_mixed_component():
    assert SCENARIOS["slow-replica"].name == "slow-replica"
    names = {c["name"] for s in range(40) for c in Mixed(seed=s).draw(
        RunShape(5, 2, 1, 2)).info["components"]}
    assert "slow-replica" not in names and "seqlen" in names


def test_mixed_without_exclusions_draws_as_before():
    components = ("jitter", "throttle", "failslow", "periodic", "seqlen", "imbalance")
    for seed in range(30):
        rng = np.random.default_rng(seed)  # the component choice as mixed always made it
        k = int(rng.integers(1, 4))
        want = [components[i] for i in sorted(rng.choice(6, size=k, replace=False).tolist())]
        assert [c.name for c in Mixed(seed=seed).components()] == want


def test_document_runs_refuse_seqlen_and_run_mixed_without_it():
    with pytest.raises(BubblecastError, match=r"--scenario seqlen: .*--documents"):
        SimConfig(**SHAPE, documents="lognormal", scenario="seqlen")
    config = SimConfig(**SHAPE, steps=3, documents="lognormal", scenario="mixed", runs=12)
    for k in range(12):
        sc = config.scenario_for(k)
        assert sc.exclude == ("seqlen",)
        assert "seqlen" not in [c.name for c in sc.components()]
    ev = simulate_events(config)
    for meta in ev.runs.values():
        assert meta.extra["scenario"]["exclude"] == ("seqlen",)
        assert "tokens_model" not in meta.extra
    assert SimConfig(**SHAPE, scenario="mixed").scenario_for(0).exclude == ()


def test_config_validation():
    with pytest.raises(BubblecastError, match=r"--attention-share: must be in \[0, 1\)"):
        SimConfig(**SHAPE, documents="lognormal", attention_share=1.0)
    with pytest.raises(BubblecastError, match=r"--token-budget: must be an integer >= 64"):
        SimConfig(**SHAPE, token_budget=32)
    with pytest.raises(BubblecastError, match=r"--token-budget: 8192 differs from .* 4096"):
        SimConfig(**SHAPE, documents=DocumentSource("lognormal", 4096), token_budget=8192)
    config = SimConfig(**SHAPE, documents="long-tail", token_budget=2048)
    assert config.documents == DocumentSource("long-tail", 2048)  # resolved once, here
    assert SimConfig(**SHAPE).documents is None


def test_run_without_documents_has_no_document_columns():
    ev = simulate_events(SimConfig(**SHAPE, steps=2))
    assert not {"tokens", "tokens_sq", "documents"} & set(ev.frame.columns)
    assert "documents" not in ev.runs["sim-0"].extra


# ---- command line -----------------------------------------------------------------------

BASE = ["simulate", "--schedule", "1f1b", "--stages", "4", "--microbatches", "8",
        "--replicas", "4", "--steps", "5"]


def test_cli_writes_a_document_run(tmp_path):
    out = tmp_path / "docs.parquet"
    code = main([*BASE, "--documents", "long-tail", "--token-budget", "2048",
                 "--attention-share", "0.3", "--scenario", "slow-replica", "--seed", "2",
                 "--out", str(out)])
    assert code == 0
    ev = read_events(out)
    docs = ev.runs["sim-0"].extra["documents"]
    assert (docs["token_budget"], docs["attention_share"]) == (2048, 0.3)
    assert docs["source"]["kind"] == "long-tail" and len(docs["lengths"]) == 5
    assert ev.frame["tokens"].max() <= 2048
    same = simulate_events(SimConfig(**SHAPE, steps=5, documents="long-tail", token_budget=2048,
                                     attention_share=0.3, scenario="slow-replica", seed=2))
    np.testing.assert_array_equal(ev.frame["tokens_sq"], same.frame["tokens_sq"])
    np.testing.assert_allclose(ev.frame["duration_s"], same.frame["duration_s"], rtol=1e-15)


def test_cli_json_lengths_file(tmp_path):
    lengths = tmp_path / "lengths.json"
    lengths.write_text(json.dumps({"lengths": [100, 700, 1500, 3000]}))
    out = tmp_path / "file.parquet"
    assert main([*BASE, "--documents", str(lengths), "--out", str(out)]) == 0
    ev = read_events(out)
    assert ev.runs["sim-0"].extra["documents"]["source"]["lengths"] == [100, 700, 1500, 3000]
    assert set(np.concatenate(ev.runs["sim-0"].extra["documents"]["lengths"])) <= \
        {100, 700, 1500, 3000}


@pytest.mark.parametrize(("extra", "content", "field"), [
    (["--documents", "uniform"], None, "--documents: 'uniform' is neither a preset"),
    (["--documents", "{missing}"], None, "is neither a preset (lognormal, long-tail) nor a file"),
    (["--documents", "{file}"], "[100, 5000]",
     "lengths[1]: document of 5000 tokens is longer than the token budget 4096; split it"),
    (["--documents", "{file}"], "[100, -5]", "lengths[1]: length -5 must be >= 1"),
    (["--documents", "{file}"], "[100, 2.5]", "lengths[1]"),
    (["--documents", "{file}"], "[]", "lengths: the batch is empty"),
    (["--token-budget", "2048"], None, "--token-budget: needs --documents"),
    (["--attention-share", "0.2"], None, "--attention-share: needs --documents"),
    (["--documents", "lognormal", "--attention-share", "1.5"], None, "--attention-share"),
    (["--documents", "lognormal", "--token-budget", "8"], None, "--token-budget"),
    (["--documents", "lognormal", "--scenario", "seqlen"], None, "--scenario seqlen"),
    (["--replicas", "1", "--scenario", "slow-replica"], None, "needs --replicas >= 2"),
])
def test_cli_bad_input_exits_2_naming_the_field(tmp_path, capsys, extra, content, field):
    path = tmp_path / "docs.json"
    if content is not None:
        path.write_text(content)
    args = [a.format(file=path, missing=tmp_path / "nope.json") for a in extra]
    out = tmp_path / "out.parquet"
    assert main([*BASE, *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bubblecast: error: ") and err.count("\n") == 1
    assert field in err
    assert not out.exists() and not list(tmp_path.glob("out*"))


# ---- committed sample data (data/documents, made by the commands in data/README.md) --------------

DATA = Path(__file__).resolve().parents[2] / "data"


@pytest.mark.parametrize(("name", "preset", "seed"), [
    ("lognormal", "lognormal", 21), ("longtail", "long-tail", 22),
])
def test_committed_document_runs_are_what_their_command_makes(tmp_path, name, preset, seed):
    readme = (DATA / "README.md").read_text()
    args = ["simulate", "--schedule", "1f1b", "--stages", "4", "--microbatches", "8",
            "--replicas", "4", "--model", "uniform:16", "--steps", "44", "--documents", preset,
            "--attention-share", "0.5", "--scenario", "slow-replica", "--seed", str(seed),
            "--runs", "2", "--run-id", f"documents-{name}", "--out"]
    assert f"`bubblecast {' '.join(args)} data/documents/{name}.parquet`" in readme
    out = tmp_path / f"{name}.parquet"
    assert main([*args, str(out)]) == 0
    committed, again = read_events(DATA / "documents" / f"{name}.parquet"), read_events(out)
    pd.testing.assert_frame_equal(committed.frame, again.frame)
    assert {r: m.extra for r, m in committed.runs.items()} == \
        {r: m.extra for r, m in again.runs.items()}
    for meta in committed.runs.values():
        assert meta.replicas == 4 and meta.extra["scenario"]["name"] == "slow-replica"
        for lengths, owner in packed(meta):
            assert owner[-1] == 31 and np.bincount(owner, weights=lengths).max() <= 4096


def test_committed_lengths_file_loads():
    source = load_documents(str(DATA / "documents" / "lengths.json"), 4096)
    assert len(source.lengths) == 500 and max(source.lengths) <= 4096
    assert min(source.lengths) >= 16 and max(source.lengths) >= 2048
