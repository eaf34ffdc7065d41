"""Partition solver: exact against brute force on every small case, clear errors otherwise."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bubblecast.errors import BubblecastError
from bubblecast.policy.solver import (
    PartitionProblem,
    bottleneck_of,
    candidates,
    min_bottleneck,
    solve,
    stage_work,
)
from bubblecast.sim.shape import even_partition


def compositions(layers: int, stages: int):
    """Every contiguous partition of ``layers`` into ``stages`` non-empty parts."""
    for cuts in itertools.combinations(range(1, layers), stages - 1):
        edges = (0, *cuts, layers)
        yield tuple(b - a for a, b in itertools.pairwise(edges))


def brute(costs, speeds, memory=None, cap=None, current=None, objective="sum"):
    """(bottleneck, best partition) by enumeration, with the solver's documented tie-break."""
    costs, speeds = np.asarray(costs, float), np.asarray(speeds, float)
    rows = []
    for part in compositions(len(costs), len(speeds)):
        if memory is not None:
            mem = stage_work(part, memory)
            if np.any(mem > np.broadcast_to(cap, mem.shape)):
                continue
        times = speeds * stage_work(part, costs)
        if objective == "sum":
            second = float(times.sum())
        else:
            own_a = np.repeat(np.arange(len(current)), current)
            own_b = np.repeat(np.arange(len(part)), part)
            second = float((own_a != own_b).sum())
        rows.append((float(times.max()), second, part))
    if not rows:
        return None, None
    best = min(r[0] for r in rows)
    tied = [r for r in rows if r[0] == best]
    low = min(r[1] for r in tied)
    # Tie-break documented by the solver: the later stage takes more layers.
    winners = [r[2] for r in tied if r[1] == low]
    return best, max(winners, key=lambda p: tuple(reversed(p)))


small = st.integers(1, 7).flatmap(lambda layers: st.tuples(
    st.lists(st.integers(0, 9), min_size=layers, max_size=layers),
    st.lists(st.integers(1, 4), min_size=1, max_size=layers),
))


@settings(max_examples=300, deadline=None)
@given(small)
def test_min_bottleneck_and_tie_break_match_brute_force(case):
    costs, speeds = case
    prob = PartitionProblem(costs, speeds)
    best, winner = brute(costs, speeds)
    assert min_bottleneck(prob) == best
    part = solve(prob)
    assert part == winner
    assert sum(part) == len(costs) and len(part) == len(speeds) and min(part) >= 1


@settings(max_examples=300, deadline=None)
@given(small, st.data())
def test_memory_cap_matches_brute_force_or_refuses(case, data):
    costs, speeds = case
    memory = data.draw(st.lists(st.integers(0, 9), min_size=len(costs), max_size=len(costs)))
    cap = data.draw(st.lists(st.integers(0, 20), min_size=len(speeds), max_size=len(speeds)))
    best, winner = brute(costs, speeds, memory, np.array(cap, float))
    prob = PartitionProblem(costs, speeds, memory=memory, memory_cap=cap)
    if best is None:
        with pytest.raises(BubblecastError, match="memory_cap"):
            solve(prob)
        return
    assert min_bottleneck(prob) == best
    part = solve(prob)
    assert part == winner
    assert np.all(stage_work(part, memory) <= np.array(cap))


@settings(max_examples=200, deadline=None)
@given(small, st.data())
def test_fewest_moves_among_optimal_partitions(case, data):
    costs, speeds = case
    current = data.draw(st.sampled_from(list(compositions(len(costs), len(speeds)))))
    best, winner = brute(costs, speeds, current=current, objective="moves")
    part = solve(PartitionProblem(costs, speeds), objective="moves", current=current)
    assert part == winner
    assert bottleneck_of(part, costs, speeds) == best


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 8).flatmap(lambda n: st.tuples(
    st.lists(st.floats(0.01, 10.0), min_size=n, max_size=n),
    st.lists(st.floats(0.5, 3.0), min_size=1, max_size=n))))
def test_float_costs_reach_the_brute_force_optimum(case):
    costs, speeds = case
    best, _ = brute(costs, speeds)
    part = solve(PartitionProblem(costs, speeds))
    assert bottleneck_of(part, costs, speeds) == pytest.approx(best, rel=1e-9)


@settings(max_examples=100, deadline=None)
@given(small, st.sampled_from([0.0, 0.05, 0.3]))
def test_slack_and_candidates_respect_the_threshold(case, slack):
    costs, speeds = case
    prob = PartitionProblem(costs, speeds)
    opt = min_bottleneck(prob)
    part = solve(prob, slack=slack)
    assert bottleneck_of(part, costs, speeds) <= opt * (1 + slack) + 1e-9
    cands = candidates(prob, current=even_partition(len(costs), len(speeds)))
    assert cands[0] == solve(prob)
    assert len(set(cands)) == len(cands)
    for c in cands:
        assert bottleneck_of(c, costs, speeds) <= opt * 1.08 + 1e-9


def test_slow_stage_gets_fewer_layers():
    part = solve(PartitionProblem(np.ones(12), [1.0, 2.0, 1.0]))
    assert part[1] < part[0] and part[1] < part[2]
    assert sum(part) == 12


def test_fewer_layers_than_stages_is_refused():
    with pytest.raises(BubblecastError, match="3 layers cannot fill 4 stages"):
        PartitionProblem([1, 1, 1], [1, 1, 1, 1])
    with pytest.raises(BubblecastError, match="cannot fill"):
        even_partition(3, 4)


def test_bad_inputs_are_refused():
    with pytest.raises(BubblecastError, match="costs"):
        PartitionProblem([1, -1], [1])
    with pytest.raises(BubblecastError, match="speeds"):
        PartitionProblem([1, 1], [0.0])
    with pytest.raises(BubblecastError, match="memory"):
        PartitionProblem([1, 1], [1], memory=[1, 1])
    with pytest.raises(BubblecastError, match="current partition"):
        solve(PartitionProblem([1, 1, 1], [1, 1]), objective="moves", current=(1, 1))


def test_an_unreachable_bottleneck_limit_is_refused():
    prob = PartitionProblem([1, 1, 1, 1], [1, 1])
    with pytest.raises(BubblecastError, match="within the limit"):
        solve(prob, bottleneck=1.0)  # the best is 2


def test_even_partition():
    # One convention everywhere (sim.shape): the first stages take the extra layers.
    assert even_partition(10, 4) == (3, 3, 2, 2)
    assert even_partition(8, 4) == (2, 2, 2, 2)


@settings(max_examples=100, deadline=None)
@given(small, st.lists(st.floats(0.0, 3.0), min_size=1, max_size=4))
def test_fixed_stage_costs_match_brute_force(case, fixed):
    costs, speeds = case
    fixed = np.resize(np.asarray(fixed), len(speeds))
    prob = PartitionProblem(costs, speeds, fixed=fixed)
    best = min(bottleneck_of(p, costs, speeds, fixed)
               for p in compositions(len(costs), len(speeds)))
    assert min_bottleneck(prob) == pytest.approx(best, rel=1e-9, abs=1e-12)
    part = solve(prob)
    assert bottleneck_of(part, costs, speeds, fixed) == pytest.approx(best, rel=1e-9, abs=1e-12)


def test_zero_fixed_cost_changes_nothing_and_a_fixed_cost_moves_more_off_a_slow_stage():
    costs, speeds = np.ones(12), [1.0, 2.0]
    plain = PartitionProblem(costs, speeds)
    assert solve(PartitionProblem(costs, speeds, fixed=np.zeros(2))) == solve(plain) == (8, 4)
    # stage time speed x (fixed + layers): a per-op cost the slow stage keeps whatever it holds
    assert solve(PartitionProblem(costs, speeds, fixed=[2.0, 2.0])) == (9, 3)
    with pytest.raises(BubblecastError, match="fixed"):
        PartitionProblem(costs, speeds, fixed=[-1.0, 0.0])


def test_neighbours_add_the_one_layer_shifts_of_the_best_split():
    prob = PartitionProblem(np.ones(12), [1.0, 2.0])
    plain = candidates(prob, current=(6, 6))
    more = candidates(prob, current=(6, 6), neighbours=True)
    assert more[:len(plain)] == plain and (9, 3) in more and (7, 5) in more
    assert (9, 3) not in plain
    capped = PartitionProblem(np.ones(12), [1.0, 2.0], memory=np.ones(12), memory_cap=8.0)
    assert all(p[0] <= 8 for p in candidates(capped, neighbours=True))
    assert candidates(PartitionProblem(np.ones(2), [1.0, 1.0]), neighbours=True) == [(1, 1)]


def one_layer_shifts(part: tuple[int, ...]) -> set[tuple[int, ...]]:
    """Every split one layer away from ``part`` across one boundary (each stage keeps one)."""
    out = set()
    for b in range(len(part) - 1):
        for d in (1, -1):
            p = list(part)
            p[b], p[b + 1] = p[b] + d, p[b + 1] - d
            if min(p) >= 1:
                out.add(tuple(p))
    return out


@settings(max_examples=100, deadline=None)
@given(small)
def test_neighbours_are_the_shifts_of_every_candidate(case):
    costs, speeds = case
    prob = PartitionProblem(costs, speeds)
    current = even_partition(len(costs), len(speeds))
    plain = candidates(prob, current=current)
    more = candidates(prob, current=current, neighbours=True)
    assert more[:len(plain)] == plain and len(set(more)) == len(more)
    want = set(plain).union(*(one_layer_shifts(p) for p in plain))
    assert set(more) == want  # no memory cap: every shift of every candidate, nothing else
