"""The A/B statistics of benchmarks/_ab.py (what bench_record's overhead figure rests on)."""

from __future__ import annotations

import math

import pytest

from benchmarks._ab import block_order, median_ci, paired_summary


def test_block_order_balances_the_arms_positions():
    two = [block_order(r, ["a", "b"]) for r in range(4)]
    assert two == [["a", "b"], ["b", "a"], ["b", "a"], ["a", "b"]]
    three = [block_order(r, ["a", "b", "c"]) for r in range(6)]
    firsts = [o[0] for o in three]
    assert sorted(firsts) == ["a", "a", "b", "b", "c", "c"]  # each arm first equally often
    assert all(sorted(o) == ["a", "b", "c"] for o in three)


@pytest.mark.parametrize(("n", "ranks"), [(20, (6, 15)), (10, (2, 9)), (80, (31, 50))])
def test_median_interval_is_the_binomial_order_statistics(n, ranks):
    lo, hi = median_ci([float(i) for i in range(1, n + 1)])  # x(i) = i
    assert (lo, hi) == ranks
    k = ranks[0]
    assert sum(math.comb(n, j) for j in range(k)) / 2**n <= 0.025  # P(B < k)
    assert sum(math.comb(n, j) for j in range(k + 1)) / 2**n > 0.025


def test_too_few_rounds_give_the_whole_range():
    assert median_ci([3.0, 1.0, 2.0]) == (1.0, 3.0)


def test_paired_summary_ratios_median_and_totals():
    s = paired_summary([1.1, 1.0, 2.2], [1.0, 1.0, 2.0])
    assert s["rounds_pct"] == pytest.approx([10.0, 0.0, 10.0])
    assert s["median_pct"] == pytest.approx(10.0)
    assert s["total_pct"] == pytest.approx(100 * (4.3 / 4.0 - 1))
