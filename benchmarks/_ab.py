"""Direct A/B measurement under torchrun: interleaved blocks, paired ratios, median and CI.

One place for what an overhead benchmark needs: launching its own file as a 2-rank torchrun
job and reading the result back (:func:`run_job`, :func:`is_worker`), the block order of
each round (:func:`block_order`: A B, B A, B A, A B, ... so that a linear drift of the
machine hits every arm alike), the timed rounds on each rank (:func:`timed_rounds`: barriers
around every block, wall and process CPU time per step), and the statistics
(:func:`paired_summary`: per-round ratios against the bare arm, their median with a
distribution-free order-statistic 95% interval, and the ratio of the totals with a
bootstrap interval).
"""

from __future__ import annotations

import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: An arm: called before and after its block, both inside the timed span.
Arm = tuple[Callable[[], None], Callable[[], None]]


def is_worker() -> bool:
    """Whether this process is a torchrun rank (else it is the launching ``main``)."""
    return "RANK" in os.environ and "LOCAL_RANK" in os.environ


def run_job(script: str, job: dict[str, Any], ranks: int = 2, timeout: int = 900) -> Any:
    """Run ``script`` as a ``ranks``-process torchrun job reading ``job`` from
    ``<job_dir>/bench.json`` (its ``worker(job_dir)``); return the ``result.json`` it writes."""
    from bubblecast.runtime.launch import failure_message, launch

    with tempfile.TemporaryDirectory() as tmp:
        job_dir = Path(tmp)
        (job_dir / "bench.json").write_text(json.dumps(job))
        code = launch(job_dir, ranks, script=script, timeout=timeout)
        if code != 0:
            log = job_dir / "torchrun.log"
            if log.exists():  # the ranks' tracebacks
                print(log.read_text(errors="replace")[-12000:], file=sys.stderr)
            sys.exit(f"benchmark failed: {failure_message(job_dir)}")
        return json.loads((job_dir / "result.json").read_text())


def block_order(round_: int, arms: list[str]) -> list[str]:
    """The arms' order in round ``round_``: rotated every two rounds, reversed every other
    round (two arms: AB, BA, BA, AB, AB, BA, ...)."""
    k = len(arms)
    turned = [arms[(i + round_ // 2) % k] for i in range(k)]
    return turned[::-1] if round_ % 2 else turned


def timed_rounds(arms: dict[str, Arm], step: Callable[[], None], rounds: int, block: int,
                 barrier: Callable[[], None]) -> dict[str, dict[str, list[float]]]:
    """Run ``rounds`` rounds of one ``block``-step block per arm (:func:`block_order`), with
    ``barrier()`` before and after each; per arm, ``wall`` and ``cpu`` seconds per step of
    each round (``cpu``: this process's CPU time, its other threads included) and ``faults``
    (minor page faults per step: memory-layout effects show there)."""
    import resource

    def faults() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    names = list(arms)
    out: dict[str, dict[str, list[float]]] = {n: {"wall": [], "cpu": [], "faults": []}
                                              for n in names}
    for r in range(rounds):
        for name in block_order(r, names):
            enter, leave = arms[name]
            barrier()
            f0, t0, c0 = faults(), time.perf_counter(), time.process_time()
            enter()
            for _ in range(block):
                step()
            leave()
            c1, f1 = time.process_time(), faults()
            barrier()
            out[name]["wall"].append((time.perf_counter() - t0) / block)
            out[name]["cpu"].append((c1 - c0) / block)
            out[name]["faults"].append((f1 - f0) / block)
    return out


def median_ci(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """Distribution-free interval of the median: the order statistics ``x(k)``, ``x(n+1-k)``
    with the largest ``k`` such that P(Binomial(n, 1/2) < k) <= (1 - level) / 2."""
    xs, n = sorted(values), len(values)
    tail, k, cdf = (1.0 - level) / 2.0, 0, 0.0
    while k < n:
        cdf_next = cdf + math.comb(n, k) / 2.0**n  # P(B <= k)
        if cdf_next > tail:
            break
        cdf, k = cdf_next, k + 1
    if k == 0:
        return xs[0], xs[-1]  # too few rounds for the level: the whole range
    return xs[k - 1], xs[n - k]


def total_ci(arm: list[float], bare: list[float], n: int = 2000,
             seed: int = 0) -> tuple[float, float]:
    """95% percentile-bootstrap interval of ``sum(arm) / sum(bare) - 1``, rounds resampled
    as pairs."""
    rng = random.Random(seed)
    idx = range(len(arm))
    stats = []
    for _ in range(n):
        pick = rng.choices(idx, k=len(arm))
        stats.append(sum(arm[i] for i in pick) / sum(bare[i] for i in pick) - 1.0)
    stats.sort()
    return stats[int(0.025 * n)], stats[int(0.975 * n) - 1]


def paired_summary(arm: list[float], bare: list[float]) -> dict[str, Any]:
    """Per-round overhead ``arm/bare - 1`` (%): median and its 95% interval; the ratio of the
    totals and its bootstrap interval (charges rare costly rounds, such as the ones that
    write a part, in full); every round."""
    ratios = [a / b - 1.0 for a, b in zip(arm, bare, strict=True)]
    lo, hi = median_ci(ratios)
    tlo, thi = total_ci(arm, bare)
    return {"median_pct": 100 * statistics.median(ratios), "ci95_pct": [100 * lo, 100 * hi],
            "total_pct": 100 * (sum(arm) / sum(bare) - 1.0),
            "total_ci95_pct": [100 * tlo, 100 * thi],
            "rounds_pct": [100 * r for r in ratios]}
