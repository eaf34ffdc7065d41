"""Intervals adapted to each run across requests: the service's adaptive conformal state.

In process, the policy layer serves a model's p10-p90 intervals through adaptive conformal
inference (:class:`~bubblecast.forecast.conformal.AdaptiveConformal` with
:data:`~bubblecast.policy.speeds.SERVED_ACI`): once an interval's target step is observed, a
miss widens that horizon's next intervals and a hit narrows them, so coverage tracks 80% on the
run at hand. A service request carries only a window of history, so the state that does this
has to outlive the request. :class:`RunIntervals` keeps one such state per run, for requests
that name their ``run_id`` and the ``step`` number of their window's newest entry; requests
without them get the model's own intervals.

Contract:

- a state is keyed by the route, the served model's version, the run id and the number of
  stages: a new model version, or a pipeline of another depth, starts afresh;
- a request whose ``step`` is older than the newest one seen for its run starts the run afresh
  (a restarted run reusing its id); the same ``step`` again reuses the state;
- at most ``capacity`` runs are kept, the least recently used dropped first;
- requests of one run are served one at a time (a lock per run); other runs are not held up;
- the state lives in the serving process: with ``serve --workers N`` each worker adapts on the
  requests it answers (a client's keep-alive connection stays with one worker).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from bubblecast.forecast.conformal import AdaptiveConformal
from bubblecast.policy.speeds import SERVED_ACI

#: Runs whose adaptive state a serving process keeps (the least recently used dropped first).
CAPACITY = 4096


def _fresh() -> AdaptiveConformal:
    """A run's adaptive conformal state before its first request."""
    return AdaptiveConformal(**SERVED_ACI)


@dataclass
class _RunState:
    """One run's adaptive conformal state and the newest step it has seen."""

    aci: AdaptiveConformal = field(default_factory=_fresh)
    step: int = -1
    lock: threading.Lock = field(default_factory=threading.Lock)


class RunIntervals:
    """Adaptive conformal state per run, across requests (see the module docstring)."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"RunIntervals: capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._runs: OrderedDict[tuple[str, str, str, int], _RunState] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._runs)

    def _state(self, key: tuple[str, str, str, int]) -> _RunState:
        """The run's state (a new one for a run not kept), marked most recently used."""
        with self._lock:
            state = self._runs.get(key)
            if state is None:
                state = self._runs[key] = _RunState()
            self._runs.move_to_end(key)
            while len(self._runs) > self.capacity:
                self._runs.popitem(last=False)
            return state

    @contextmanager
    def session(self, route: str, version: str, run_id: str, stages: int, step: int
                ) -> Iterator[AdaptiveConformal]:
        """The run's :class:`AdaptiveConformal`, held for this request alone; ``step`` (the
        window's newest step number) is recorded as the newest seen."""
        state = self._state((route, version, run_id, int(stages)))
        with state.lock:
            if step < state.step:  # an older step: the run restarted under the same id
                state.aci = _fresh()
            state.step = int(step)
            yield state.aci

    @contextmanager
    def for_request(self, route: str, version: str, run_id: str | None, step: int | None,
                    stages: int) -> Iterator[AdaptiveConformal | None]:
        """:meth:`session` for a request that names its ``run_id`` and ``step``; ``None``
        (the model's own intervals) for one that does not."""
        if run_id is None or step is None:
            yield None
            return
        with self.session(route, version, run_id, stages, step) as aci:
            yield aci
