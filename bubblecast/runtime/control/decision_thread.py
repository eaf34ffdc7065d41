"""Rank 0's decisions off the training thread: one persistent worker, a deadline per decision.

The controller hands each boundary's decision (observe the gathered telemetry, then decide) to
a :class:`DecisionThread` before the next step starts and collects the answer after that step,
so the policy's work (robust speeds, forecasts, the guard, the solver, a service's round trip)
runs while the step trains instead of stalling it: the training thread only waits for what is
not finished by then, and at most until the decision's deadline.

Contract:

- jobs run one at a time, in submission order, on one daemon thread (``bubblecast-decide``),
  so the state they share (the decider's history) is only ever touched from that thread;
- :meth:`DecisionThread.result` waits until ``timeout_s`` after the job's submission; a job not
  done by then is *abandoned*: :class:`ForecastUnavailable` is raised and its answer, when it
  comes, is dropped;
- while an abandoned job still runs, the results of later jobs are refused at once (the same
  exception, saying so) rather than waited for: a hung forecaster costs the training thread
  one deadline, not one per boundary; those later jobs still run, in order, once it returns,
  and see their own ``abandoned`` flag set (so that they can keep their bookkeeping and skip
  the rest).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bubblecast.errors import BubblecastError
from bubblecast.policy.speeds import ForecastUnavailable

__all__ = ["DecisionThread", "Ticket", "still_running", "timed_out"]


def timed_out(timeout_s: float) -> ForecastUnavailable:
    """The refusal of a decision not done ``timeout_s`` after its submission."""
    return ForecastUnavailable(f"decision timed out after {timeout_s:g} s")


def still_running(timeout_s: float) -> ForecastUnavailable:
    """The refusal of a decision queued behind one abandoned after ``timeout_s``."""
    return ForecastUnavailable(f"the previous decision, abandoned after {timeout_s:g} s, is "
                               "still running")


@dataclass
class Ticket:
    """One submitted job: when it was submitted, whether the caller gave up on it, its
    outcome once ``done`` is set (``value``, or ``error`` if it raised)."""

    submitted: float
    done: threading.Event = field(default_factory=threading.Event)
    abandoned: bool = False
    value: Any = None
    error: BaseException | None = None


class DecisionThread:
    """``submit(job, *args)`` runs ``job(ticket, *args)`` on the worker thread; ``result(ticket)``
    collects it under the deadline (see the module docstring). The thread starts on the first
    submission; :meth:`close` lets it exit once its queue is drained."""

    def __init__(self, timeout_s: float, name: str = "bubblecast-decide") -> None:
        if not timeout_s > 0:
            raise BubblecastError(f"--forecast-timeout: must be > 0 seconds, got {timeout_s}")
        self.timeout_s = float(timeout_s)
        self.name = name
        self._jobs: queue.SimpleQueue[tuple[Ticket, Callable[..., Any], tuple[Any, ...]] | None]
        self._jobs = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._running: Ticket | None = None  # the job on the thread now

    def submit(self, job: Callable[..., Any], *args: Any) -> Ticket:
        """Queue ``job(ticket, *args)``; returns at once with its ticket."""
        ticket = Ticket(submitted=time.monotonic())
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
            self._thread.start()
        self._jobs.put((ticket, job, args))
        return ticket

    def result(self, ticket: Ticket) -> Any:
        """The job's value (its exception re-raised), waiting at most until ``timeout_s`` after
        its submission; :class:`ForecastUnavailable` if it is not done by then, or at once
        while an earlier abandoned job still holds the thread."""
        running = self._running
        if not ticket.done.is_set() and running is not None and running is not ticket \
                and running.abandoned:
            ticket.abandoned = True
            raise still_running(self.timeout_s)
        left = ticket.submitted + self.timeout_s - time.monotonic()
        if not ticket.done.wait(max(left, 0.0)):
            ticket.abandoned = True
            raise timed_out(self.timeout_s)
        if ticket.error is not None:
            raise ticket.error
        return ticket.value

    def close(self) -> None:
        """Let the thread exit after the jobs already queued (it is a daemon: a hung job does
        not keep the process alive)."""
        if self._thread is not None:
            self._jobs.put(None)

    def _serve(self) -> None:
        while (item := self._jobs.get()) is not None:
            ticket, job, args = item
            self._running = ticket
            try:
                ticket.value = job(ticket, *args)
            except BaseException as exc:  # noqa: BLE001 - re-raised in result()
                ticket.error = exc
            finally:
                self._running = None
                ticket.done.set()
