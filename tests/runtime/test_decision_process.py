"""Rank 0's decider in a worker process: the same decisions as in process, the thread's
deadline contract, and a child that is gone or cannot start reported, not hung on."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from bubblecast.runtime.control.control_config import ControllerConfig
from bubblecast.runtime.control.decide import Decider
from bubblecast.runtime.control.decision_process import MAX_UNANSWERED, DecisionProcess
from bubblecast.runtime.control.forecasters import ForecastUnavailable
from bubblecast.runtime.control.observe import pack
from bubblecast.runtime.plan import check_plan

EVERY, LAYERS = 5, 8
HOLD = "BUBBLECAST_TEST_HOLD"  # a file path: the held forecaster waits while it exists


class HeldForecaster:
    """Waits (at most 60 s) while the file named by ``$BUBBLECAST_TEST_HOLD`` exists."""

    name = "held"

    def forecast(self, state: object, horizons: np.ndarray) -> np.ndarray:
        hold, t0 = os.environ.get(HOLD), time.monotonic()
        while hold and os.path.exists(hold) and time.monotonic() - t0 < 60:
            time.sleep(0.01)
        return np.ones((len(horizons), 2, 3))


def held_forecaster() -> HeldForecaster:
    return HeldForecaster()


def refusing_decider(url: str, timeout_s: float, params: dict) -> object:
    raise ValueError(f"no decider for {url}")


def boundary(b: int, plan: object) -> tuple[np.ndarray, list]:
    """Boundary ``b``'s gathered rows (rank 1 three times slower) and its pending steps."""
    samples = [{"layer": i, "forward_s": 0.1, "total_s": 0.3} for i in range(LAYERS)]
    rows = np.stack([pack([1.0] * EVERY, EVERY, samples, LAYERS),
                     pack([3.0] * EVERY, EVERY, samples, LAYERS)])
    return rows, [(b * EVERY + i, plan.partition, 4) for i in range(EVERY)]  # type: ignore


def test_the_process_decides_as_the_decider_in_process() -> None:
    config = ControllerConfig(policy="predictive", every=EVERY, timeout_s=60.0,
                              forecaster="tests.runtime.test_controller:served_fake",
                              policy_params={"min_history": 4})
    plan = check_plan("1f1b", 2, 4, LAYERS)
    local = Decider(config, plan, np.full(LAYERS, 1e3))
    remote = DecisionProcess(config, plan, np.full(LAYERS, 1e3))
    try:
        assert remote.note == local.note
        got = []
        for b in range(4):
            rows, pending = boundary(b, plan)
            args = (rows, pending, plan, (b + 1) * EVERY - 1, None, None)
            mine = local.advance(*args)
            theirs = remote.result(remote.submit(*args))
            got.append(theirs[0].acts)
            drop = {"latency_s"}
            assert mine is not None and theirs[0] == mine[0]
            assert {k: v for k, v in theirs[1].items() if k not in drop} == \
                {k: v for k, v in mine[1].items() if k not in drop}
        assert any(got)  # the decisions compared include a move
    finally:
        remote.close()


def held_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, timeout_s: float
                 ) -> tuple[DecisionProcess, object, Path]:
    """A decision process whose forecasts wait while the returned hold file exists (it
    does), its plan, and the file."""
    hold = tmp_path / "hold"
    hold.touch()
    monkeypatch.setenv(HOLD, str(hold))  # the child inherits it
    config = ControllerConfig(policy="predictive", every=EVERY, timeout_s=timeout_s,
                              forecaster=f"{__name__}:held_forecaster",
                              policy_params={"min_history": 4})
    plan = check_plan("1f1b", 2, 4, LAYERS)
    return DecisionProcess(config, plan, np.full(LAYERS, 1e3)), plan, hold


def test_deadline_refusal_while_busy_and_a_gone_child(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    remote, plan, hold = held_process(tmp_path, monkeypatch, 1.0)
    try:
        args = [(*boundary(b, plan), plan, (b + 1) * EVERY - 1, None, None) for b in range(40)]
        hung = remote.submit(*args[0])
        queued = remote.submit(*args[1])
        with pytest.raises(ForecastUnavailable, match="timed out after 1 s"):
            remote.result(hung)
        t0 = time.monotonic()
        with pytest.raises(ForecastUnavailable, match="abandoned after 1 s, is still running"):
            remote.result(queued)
        assert time.monotonic() - t0 < 0.5  # refused at once, not after the 1 s timeout
        observed = remote.submit(*args[2])  # sent to be observed only, refused at submission
        assert observed.done.is_set() and observed.abandoned
        with pytest.raises(ForecastUnavailable, match="is still running"):
            remote.result(observed)
        hold.unlink()
        remote.timeout_s = 60.0
        for b in range(3, len(args)):  # refused until the released decisions are answered
            try:
                decision, record = remote.result(remote.submit(*args[b]))
                break
            except ForecastUnavailable as exc:
                assert "still running" in str(exc)
                time.sleep(0.2)
        # every boundary reached the child's history, the abandoned ones included
        assert record["observed_through"] == (b + 1) * EVERY - 1
        os.kill(remote._proc.pid, signal.SIGKILL)
        remote._proc.join(timeout=30)
        with pytest.raises(ForecastUnavailable, match="exited"):
            remote.result(remote.submit(*args[-1]))
    finally:
        remote.close()


def test_a_hung_child_never_blocks_submission(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    remote, plan, hold = held_process(tmp_path, monkeypatch, 60.0)
    try:
        tickets = [remote.submit(*boundary(b, plan), plan, (b + 1) * EVERY - 1, None, None)
                   for b in range(MAX_UNANSWERED + 3)]
        late = tickets[MAX_UNANSWERED:]
        assert all(t.done.is_set() for t in late)  # answered at once, not sent
        with pytest.raises(ForecastUnavailable, match=f"{MAX_UNANSWERED} decisions unanswered"):
            remote.result(late[0])
        hold.unlink()
        assert remote.result(tickets[0])[1]["observed_through"] == EVERY - 1
    finally:
        remote.close()


def test_a_decider_that_cannot_be_built_raises_at_start() -> None:
    config = ControllerConfig(policy="predictive", service="http://127.0.0.1:9")
    plan = check_plan("1f1b", 2, 4, LAYERS)
    with pytest.raises(ValueError, match="no decider for http://127.0.0.1:9"):
        DecisionProcess(config, plan, np.full(LAYERS, 1e3),
                        external=refusing_decider)


def test_decide_in_is_validated() -> None:
    from bubblecast.errors import BubblecastError

    with pytest.raises(BubblecastError, match="--decide-in: choose from process, thread"):
        ControllerConfig(decide_in="gpu")
