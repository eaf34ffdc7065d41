"""Rank 0's decisions in a worker process: the :class:`~.decide.Decider` off the training process.

:class:`DecisionProcess` builds the controller's :class:`~.decide.Decider` in a child process
(the ``spawn`` start method: nothing of the training process's threads or process groups is
inherited) and exchanges each boundary's decision with it over a pipe, as the live planner's
worker does (:mod:`bubblecast.runtime.plan_worker`). The child keeps the run's history; each
request carries only the boundary's gathered rows, and each answer is the recorded decision.
It runs at the lowest CPU priority (``nice``): where cores are scarce it decides in the
pipeline's idle time rather than taking a core from a training rank.

Why a process and not a thread: a thread of the training process shares its interpreter lock.
A decision is many small numpy calls (robust speeds, the model's features, the forecast guard,
the solver), each taking the lock for a moment, and the training thread's Python between its
kernels waits for it, so a deciding thread slows the step it overlaps by more than its own CPU
time (measured on the results page, "Where rank 0 decides").

Contract, the same as :class:`~.decision_thread.DecisionThread`'s:

- requests are decided one at a time, in submission order;
- :meth:`DecisionProcess.result` waits until ``timeout_s`` after the request's submission; a
  request not answered by then is *abandoned* (:class:`ForecastUnavailable`) and its answer,
  when it comes, is dropped;
- while an abandoned request is still unanswered, later ones are refused at once (the same
  exception, saying so): a hung forecaster costs the training thread one deadline, not one
  per boundary. They are still sent, marked observe-only: the child adds their boundaries to
  its history once it returns, and decides nothing for them;
- a child that is gone (killed, crashed) is reported as the reason, at once, for every later
  decision: training goes on under the current plan;
- at most :data:`MAX_UNANSWERED` requests wait in the pipe: beyond that (a child hung for
  many boundaries) a boundary is not sent, and its result says so, so that sending never
  blocks the training thread on a full pipe (the thread's queue has no bound; a pipe does).

Construction waits (up to ``start_timeout_s``) until the child has built its decider, so a
forecaster's loading is paid once at start, as with the thread; the decider's own failures to
build (an external decider that raises, say) are raised there, as the thread's would be.
"""

from __future__ import annotations

import contextlib
import pickle
import time
from typing import Any

from bubblecast.errors import BubblecastError
from bubblecast.policy.speeds import ForecastUnavailable
from bubblecast.runtime.child_process import (
    WORKER_NICE,
    exit_reason,
    lower_priority,
    start_child,
    stop_child,
)
from bubblecast.runtime.control.decision_thread import Ticket, still_running, timed_out

__all__ = ["MAX_UNANSWERED", "DecisionProcess"]

#: Requests sent and not yet answered, at most (each is a few kB; a pipe holds 64 kB).
MAX_UNANSWERED = 8


def _portable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling, else a RuntimeError carrying its type and message."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001 - any pickling failure: send what it said
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc


def _always() -> bool:
    """An observe-only request's ``skip``: the decision is not wanted."""
    return True


def _serve(conn: Any, build: tuple[Any, ...], nice: int) -> None:
    """The child: build the decider, say so (``("ready", note)`` or ``("failed", exc)``), then
    answer ``(seq, observe_only, rows, pending, plan, step, last_move, measured)`` requests
    with ``(seq, (decision, record) or None, error or None)`` until None or the pipe closes
    (None, not a decision, for an observe-only request)."""
    from bubblecast.runtime.control.decide import Decider

    lower_priority(nice)
    try:
        decider = Decider(*build)
    except BaseException as exc:  # noqa: BLE001 - raised in the training process instead
        conn.send(("failed", _portable(exc)))
        return
    conn.send(("ready", decider.note))
    try:
        while (item := conn.recv()) is not None:
            seq, observe_only, *args = item
            try:
                skip = _always if observe_only else None
                conn.send((seq, decider.advance(*args, skip=skip), None))
            except Exception as exc:  # noqa: BLE001 - re-raised by result()
                conn.send((seq, None, _portable(exc)))
    except (EOFError, OSError, KeyboardInterrupt):
        pass
    finally:
        decider.close()


class DecisionProcess:
    """A :class:`~.decide.Decider` built from ``(config, plan, param_bytes, external)`` in a
    child process (module docstring): :meth:`submit` a boundary, then :meth:`result` it."""

    def __init__(self, config: Any, plan: Any, param_bytes: Any, external: Any = None,
                 nice: int = WORKER_NICE, start_timeout_s: float = 120.0) -> None:
        self.timeout_s = float(config.timeout_s)
        self._conn, self._proc = start_child(
            _serve, ((config, plan, param_bytes, external), int(nice)), "bubblecast-decide")
        self._seq = 0
        self._open: dict[int, Ticket] = {}  # submitted, not yet answered
        self.note: str | None = self._ready(start_timeout_s)

    def _ready(self, timeout_s: float) -> str | None:
        """Wait for the child's decider; its note, or raise what building it raised."""
        if not self._conn.poll(timeout_s):
            self.close()
            raise BubblecastError(f"the decision process did not start within {timeout_s:g} s")
        try:
            kind, value = self._conn.recv()
        except (EOFError, OSError):
            self._proc.join(timeout=5.0)
            raise BubblecastError(f"the decision process exited while starting (exit code "
                                  f"{self._proc.exitcode})") from None
        if kind == "failed":
            self.close()
            raise value
        return value

    def gone(self) -> str | None:
        """Why the child can decide no more (None while it runs)."""
        return exit_reason(self._proc, "decision")

    def submit(self, *args: Any) -> Ticket:
        """Queue the decision on ``(rows, pending, plan, step, last_move, measured)``
        (:meth:`~.decide.Decider.advance`); returns at once with its ticket. A child that is
        gone is reported by :meth:`result`."""
        ticket = Ticket(submitted=time.monotonic())
        self._seq += 1
        self._drain(0.0)
        if len(self._open) >= MAX_UNANSWERED:
            ticket.error = ForecastUnavailable(
                f"the decision process has {len(self._open)} decisions unanswered; this "
                "boundary's telemetry was not sent to it")
            ticket.done.set()
            return ticket
        busy = self._behind_abandoned(ticket)
        if busy:  # refused at once (module docstring), sent to be observed only
            ticket.abandoned = True
            ticket.error = still_running(self.timeout_s)
            ticket.done.set()
        if self.gone() is None:
            with contextlib.suppress(OSError):
                self._conn.send((self._seq, busy, *args))
                self._open[self._seq] = ticket
        return ticket

    def result(self, ticket: Ticket) -> Any:
        """The decision and its record (an error in the child re-raised), waiting at most
        until ``timeout_s`` after its submission; :class:`ForecastUnavailable` if it is not
        answered by then, at once while an earlier abandoned request is unanswered, or when
        the child is gone."""
        self._drain(0.0)
        if not ticket.done.is_set():
            if not any(t is ticket for t in self._open.values()):
                raise ForecastUnavailable(self.gone() or "the decision process closed its pipe")
            if self._behind_abandoned(ticket):
                ticket.abandoned = True
                raise still_running(self.timeout_s)
            while not ticket.done.is_set():
                left = ticket.submitted + self.timeout_s - time.monotonic()
                if left <= 0:
                    ticket.abandoned = True
                    raise timed_out(self.timeout_s)
                if not self._drain(left):
                    raise ForecastUnavailable(self.gone() or
                                              "the decision process closed its pipe")
        if ticket.error is not None:
            raise ticket.error
        return ticket.value

    def _behind_abandoned(self, ticket: Ticket) -> bool:
        """Whether another request still unanswered was abandoned."""
        return any(t.abandoned for t in self._open.values() if t is not ticket)

    def _drain(self, wait_s: float) -> bool:
        """Read the answers that came (waiting up to ``wait_s`` for the first); False when the
        child is gone."""
        try:
            while self._conn.poll(wait_s):
                seq, value, error = self._conn.recv()
                ticket = self._open.pop(seq, None)
                if ticket is not None and not ticket.done.is_set():
                    ticket.value, ticket.error = value, error
                    ticket.done.set()
                wait_s = 0.0
        except (EOFError, OSError):
            self._proc.join(timeout=1.0)
            self._open.clear()
            return False
        return True

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the child (ask, then terminate)."""
        stop_child(self._conn, self._proc, timeout_s)
