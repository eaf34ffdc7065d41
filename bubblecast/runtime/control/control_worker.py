"""A controlled run's worker: ``torchrun ... -m bubblecast.runtime.control.control_worker JOB_DIR``.

:mod:`bubblecast.runtime.train_worker` (scripted actions, telemetry merged into ``out`` by rank 0,
``summary.json``, ``error-rank{r}.txt`` on failure) with a :class:`Controller` around every
step (its decision runs while the step trains), as its step hook. ``job.json`` carries
``control`` (a :class:`ControllerConfig`), optionally ``ab_block`` (control on for blocks of
that many steps, off for the next: overhead measurement in one run) and ``decider`` (the
``module:factory`` import path of the external decider ``--service`` is asked through,
imported here). Rank 0's summary adds the decisions, each step's end time and every rank's
control seconds.
"""

from __future__ import annotations

import time
from typing import Any

from bubblecast.runtime.shutdown import exit_process


class ControlHook:
    """The worker's step hook: the controller after each step, A/B blocks, step end times."""

    def __init__(self, trainer: Any, job: dict[str, Any]) -> None:
        from bubblecast.runtime.control.control_config import ControllerConfig
        from bubblecast.runtime.control.forecasters import import_object
        from bubblecast.runtime.control.loop import Controller

        decider = import_object(job["decider"], "decider") if job.get("decider") else None
        self.controller = Controller(trainer, ControllerConfig.from_json(job["control"]),
                                     decider=decider)
        self.block = int(job.get("ab_block") or 0)
        self.start = trainer.step
        self.ends: list[float] = []

    def before_step(self, step: int) -> None:
        if self.block:
            self.controller.enabled = (step - self.start) // self.block % 2 == 0
        self.controller.before_step()  # the decision runs while this step trains

    def after_step(self, t0: float) -> None:
        self.controller.after_step()
        self.ends.append(time.perf_counter() - t0)

    def finish(self) -> dict[str, Any]:
        controller = self.controller
        controller.finish()
        stats = controller.gather_stats()
        controller.close()
        return {"first_step": self.start, "decisions": controller.decisions,
                "step_end_s": self.ends, "control": stats, "forecaster": controller.note,
                "ab_block": self.block}


def main(argv: list[str] | None = None) -> int:
    from bubblecast.runtime.train_worker import main as worker_main

    return worker_main(argv, make_hook=ControlHook,
                       usage="python -m bubblecast.runtime.control.control_worker JOB_DIR")


if __name__ == "__main__":
    exit_process(main())  # no finalization: see runtime.shutdown
