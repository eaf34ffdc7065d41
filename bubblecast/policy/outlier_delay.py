"""Opt-in outlier delay (WLB-LLM style): very long documents wait to be trained together.

A document of at least ``min_share`` of the token budget costs many times a mean micro-batch
(attention grows with its length squared), and its micro-batch holds up its whole replica: a
step with fewer such documents than replicas leaves the other replicas idle behind it.
:func:`delayed_batches` is the data loader's step cut with a queue for these documents: they
leave the stream as they arrive and enter the next step in whole rounds of one per replica (and
every one that has waited ``max_wait`` steps, at most one per micro-batch); each step then fills
with the stream's other documents until its micro-batches are full, exactly as the loader fills
them (sequential first-fit, :func:`bubblecast.sim.documents.next_fit`). Every document is
trained on exactly once; only the step changes.

This changes the batch of a step (its gradient is no longer the undelayed step's), which is why
planning never does it unless asked; the delays of the documents (in steps, against the cut
without the queue) are returned so that the mean token delay can be reported beside the
speed-up.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from bubblecast.errors import BubblecastError
from bubblecast.sim.documents import cut_steps


def _undelayed_steps(stream: np.ndarray, bins: int, budget: int) -> np.ndarray:
    """Each document's step in the loader's cut without a queue (-1 past the last full step)."""
    out = np.full(len(stream), -1, dtype=np.int64)
    bounds = cut_steps(stream, budget, bins)
    for k in range(len(bounds) - 1):
        out[bounds[k]:bounds[k + 1]] = k
    return out


def delayed_batches(stream: np.ndarray, bins: int, token_budget: int, replicas: int,
                    min_share: float = 0.5, max_wait: int = 4
                    ) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """Cut a document stream into steps with the outlier queue (see the module doc).

    Returns the steps' lengths, and for every document trained in them its tokens and its
    delay in steps (step trained minus step it had without the queue). Documents left in the
    queue or past the last full step are not returned.
    """
    if not 0.0 < min_share <= 1.0:
        raise BubblecastError(f"outlier delay min_share: must be in (0, 1], got {min_share}")
    if max_wait < 1 or replicas < 1 or bins < 1:
        raise BubblecastError("outlier delay: max_wait, replicas and bins must be >= 1")
    before = _undelayed_steps(np.asarray(stream, dtype=np.int64), bins, token_budget)
    stream = np.asarray(stream, dtype=np.int64)[before >= 0]  # the full steps' documents
    before = before[before >= 0]
    outlier = stream >= min_share * token_budget
    queue: deque[int] = deque()  # stream positions of waiting outliers, oldest first
    steps: list[np.ndarray] = []
    tokens, delays = [], []
    pos, step = 0, 0
    while pos < len(stream):
        # whole rounds of one outlier per replica, and every overdue one; at most `bins`
        k = len(queue) // replicas * replicas
        overdue = sum(1 for q in queue if step - before[q] >= max_wait)
        release = [queue.popleft() for _ in range(min(max(k, overdue), bins))]
        members, used = list(release), 0
        n_bins = 1 if release else 0  # next_fit of the released documents, then the stream's
        for n in stream[release].tolist():
            if used + n > token_budget and used > 0:
                n_bins, used = n_bins + 1, 0
            used += n
        budget_left = token_budget - used
        while pos < len(stream):
            if outlier[pos]:
                queue.append(pos)
                pos += 1
                continue
            n = int(stream[pos])
            if n > budget_left or n_bins == 0:
                if n_bins == bins:
                    break  # the document that does not fit the last micro-batch opens a step
                n_bins, budget_left = n_bins + 1, token_budget
            budget_left -= n
            members.append(pos)
            pos += 1
        if n_bins < bins or pos >= len(stream):
            break  # the stream ran out before the step's micro-batches were full
        idx = np.asarray(members, dtype=np.int64)
        steps.append(stream[idx])
        tokens.append(stream[idx])
        delays.append(step - before[idx])
        step += 1
    if not steps:
        return [], np.zeros(0, np.int64), np.zeros(0, np.int64)
    return steps, np.concatenate(tokens), np.concatenate(delays)


def mean_token_delay(tokens: np.ndarray, delays: np.ndarray) -> float:
    """Mean delay in steps over tokens (0 when there are none)."""
    tokens = np.asarray(tokens, dtype=np.float64)
    return float((tokens * np.asarray(delays)).sum() / tokens.sum()) if tokens.sum() else 0.0
