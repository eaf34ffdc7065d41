"""Threads for the batch features: ``n_jobs`` as scikit-learn reads it, blocks of whole series,
and a pool that runs independent tasks (numpy releases the GIL in the large array operations
they are made of)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import numpy as np

#: Rows of a block of series (a series longer than this is a block alone). Blocks depend on
#: the data only, never on the thread count; every value depends on its own series only.
BLOCK_ROWS = 1 << 14


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity where the platform tells it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def resolve_jobs(n_jobs: int | None) -> int:
    """Threads for ``n_jobs``, scikit-learn's convention: None or -1 every core, -2 all but
    one (``cores + 1 + n_jobs``, at least 1), a positive number that many."""
    if n_jobs is None:
        return usable_cpus()
    if isinstance(n_jobs, bool) or not isinstance(n_jobs, (int, np.integer)):
        raise ValueError(f"n_jobs: expected an integer or None, got {n_jobs!r}")
    n = int(n_jobs)
    if n == 0:
        raise ValueError("n_jobs: 0 threads; give a positive number, or None or -1 for "
                         "every core")
    return n if n > 0 else max(1, usable_cpus() + 1 + n)


def series_blocks(first: np.ndarray, target: int | None = None) -> list[tuple[int, int]]:
    """Row ranges ``[lo, hi)`` of whole series (``first`` marks each series' first row), each
    closed at the first series start at least ``target`` (:data:`BLOCK_ROWS`) rows after its
    own start."""
    target = max(1, BLOCK_ROWS if target is None else int(target))
    starts = np.flatnonzero(first)
    n = len(first)
    blocks, lo = [], 0
    while lo < n:
        nxt = int(np.searchsorted(starts, lo + target))
        hi = int(starts[nxt]) if nxt < len(starts) else n
        blocks.append((lo, hi))
        lo = hi
    return blocks


def run_tasks(tasks: Sequence[Callable[[], None]], jobs: int) -> None:
    """Run ``tasks`` (independent, writing disjoint outputs) on ``jobs`` threads, in order on
    this thread when ``jobs`` is 1; the first error is raised once all have ended."""
    if jobs <= 1 or len(tasks) <= 1:
        for task in tasks:
            task()
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(jobs, len(tasks)),
                            thread_name_prefix="bubblecast-features") as pool:
        futures = [pool.submit(task) for task in tasks]
    for future in futures:
        future.result()
