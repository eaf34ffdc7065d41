"""Workload model: layer costs from uniform, JSON and PipeDream profiles; partitions."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bubblecast.errors import BubblecastError
from bubblecast.sim.workload import (
    Workload,
    counterfactual_stage_times,
    even_partition,
    expand_partition,
    load_workload,
    partition_matrix,
    read_pipedream,
    stage_costs,
)
from bubblecast.telemetry.schema import RunMeta

PROFILES = Path(__file__).resolve().parents[2] / "data" / "pipedream-profiles"


def _profile(name: str) -> Path:
    return PROFILES / f"{name}.graph.txt"


def test_uniform_even_split_reproduces_stage_times():
    wl = load_workload("uniform:12", f=2.0, b=3.0, w=1.0, stages=4)
    costs = stage_costs(wl, np.array([even_partition(12, 4)]))
    np.testing.assert_allclose(costs[0], np.tile([2.0, 3.0, 1.0], (4, 1)))
    # interleaved: 4 ranks x 3 chunks, one layer each -> 1/3 of the stage times per chunk
    costs = stage_costs(wl, np.array([expand_partition([3, 3, 3, 3], 12, 4, 3)]))
    np.testing.assert_allclose(costs[0], np.tile([2 / 3, 1.0, 1 / 3], (12, 1)))


def test_stage_costs_sum_the_layers_they_hold():
    rng = np.random.default_rng(0)
    fwd, bwd = rng.uniform(0, 2, 10), rng.uniform(0, 4, 10)
    wl = Workload(fwd, bwd, bwd * 0.25)
    parts = np.array([[3, 3, 4], [1, 2, 7]])
    costs = stage_costs(wl, parts)
    for s, part in enumerate(parts):
        bounds = np.r_[0, np.cumsum(part)]
        for i in range(3):
            sl = slice(bounds[i], bounds[i + 1])
            np.testing.assert_allclose(costs[s, i], [fwd[sl].sum(), 0.75 * bwd[sl].sum(),
                                                     0.25 * bwd[sl].sum()])


def test_pipedream_profiles_parse_in_topological_order():
    for name in ("vgg16", "resnet50", "gnmt", "gnmt_large"):
        path = _profile(name)
        wl = read_pipedream(path)
        text = path.read_text()
        nodes = [ln for ln in text.splitlines() if "forward_compute_time=" in ln]
        edges = [ln.split(" -- ") for ln in text.splitlines()
                 if ln.strip() and "forward_compute_time=" not in ln]
        assert wl.n_layers == len(nodes)
        pos = {n.split(":")[0]: i for i, n in enumerate(wl.names)}
        assert all(pos[a.strip()] < pos[b.strip()] for a, b in edges)
        total_fwd = sum(float(ln.split("forward_compute_time=")[1].split(",")[0]) for ln in nodes)
        assert wl.forward.sum() == pytest.approx(total_fwd)
        # W only where a layer has parameters, and never more than its backward
        assert (wl.weight[wl.param_bytes == 0] == 0).all()
        assert (wl.weight <= wl.backward).all() and (wl.weight[wl.param_bytes > 0] > 0).any()


def test_pipedream_multi_output_activation_sizes_are_summed():
    wl = read_pipedream(_profile("gnmt"))
    i = next(i for i, n in enumerate(wl.names) if n.startswith("node7:"))
    assert wl.activation_bytes[i] == pytest.approx(6291456.0 + 2 * 131072.0)


def test_json_round_trip_and_weight_default(tmp_path):
    doc = {"name": "toy", "layers": [
        {"name": "emb", "forward_ms": 1.0, "backward_ms": 2.0, "param_bytes": 10},
        {"forward_ms": 2.0, "backward_ms": 3.0, "weight_ms": 1.5},
        {"forward_ms": 0.5, "backward_ms": 0.5}]}
    path = tmp_path / "toy.json"
    path.write_text(json.dumps(doc))
    wl = load_workload(str(path))
    assert wl.name == "toy" and wl.names[0] == "emb"
    np.testing.assert_allclose(wl.weight, [2.0 / 3, 1.5, 0.0])
    again = Workload.from_json(json.loads(json.dumps(wl.to_json())))
    np.testing.assert_array_equal(again.weight, wl.weight)
    np.testing.assert_array_equal(again.forward, wl.forward)


@pytest.mark.parametrize(("doc", "match"), [
    ({"layers": []}, "non-empty"),
    ({"layers": [{"forward_ms": 1}]}, "backward_ms"),
    ({"layers": [{"forward_ms": "x", "backward_ms": 1}]}, "numbers"),
    ({"layers": [{"forward_ms": -1, "backward_ms": 1}]}, ">= 0"),
    ({"layers": [{"forward_ms": 1, "backward_ms": 1, "weight_ms": 2}]}, "weight_ms"),
])
def test_bad_json_is_a_one_line_error(tmp_path, doc, match):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(BubblecastError, match=match):
        load_workload(str(path))


def test_bad_model_specs(tmp_path):
    with pytest.raises(BubblecastError, match="uniform:L"):
        load_workload("uniform:x")
    with pytest.raises(BubblecastError, match="no such file"):
        load_workload(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.graph.txt"
    bad.write_text("hello world\n")
    with pytest.raises(BubblecastError, match="line 1"):
        load_workload(str(bad))


@pytest.mark.parametrize(("part", "match"), [
    ([3, 5], "sums to 8"), ([4, 4, 4], "3 entries"), ([0, 12], "at least 1"),
])
def test_partition_validation(part, match):
    with pytest.raises(BubblecastError, match=match):
        expand_partition(part, 12, 2)


def test_partition_per_rank_with_chunks_splits_evenly():
    # 2 ranks x 2 chunks: rank 0 holds 5 (3 + 2), rank 1 holds 3 (2 + 1); virtual order
    # is (r0c0, r1c0, r0c1, r1c1)
    np.testing.assert_array_equal(expand_partition([5, 3], 8, 2, 2), [3, 2, 2, 1])
    with pytest.raises(BubblecastError, match="one per chunk"):
        expand_partition([7, 1], 8, 2, 2)


def test_partition_can_change_between_steps():
    mat = partition_matrix(lambda s: [2, 2] if s < 2 else [1, 3], 4, 4, 2)
    np.testing.assert_array_equal(mat, [[2, 2], [2, 2], [1, 3], [1, 3]])
    np.testing.assert_array_equal(partition_matrix(np.array([[1, 3], [3, 1]]), 2, 4, 2),
                                  [[1, 3], [3, 1]])
    with pytest.raises(BubblecastError, match="rows"):
        partition_matrix(np.array([[1, 3]]), 2, 4, 2)
    np.testing.assert_array_equal(partition_matrix(None, 3, 7, 3), [[3, 2, 2]] * 3)


def test_counterfactual_stage_times_from_ground_truth():
    wl = Workload(np.arange(1.0, 9.0), np.arange(2.0, 10.0), np.zeros(8))
    meta = RunMeta(schedule="1f1b", stages=2, microbatches=3, replicas=2,
                   extra={"workload": wl.to_json()})
    speed = np.array([[1.0, 1.0, 1.0, 2.0], [1.5, 1.0, 1.0, 1.0]])
    out = counterfactual_stage_times(meta, speed, None, [6, 2])
    f_b = wl.forward + wl.backward
    want_stage = np.array([f_b[:6].sum(), f_b[6:].sum()]) * 3
    np.testing.assert_allclose(out, np.tile(want_stage, (2, 2)) * speed)
    with pytest.raises(BubblecastError, match="ranks"):
        counterfactual_stage_times(meta, speed[:, :2], None, [6, 2])
