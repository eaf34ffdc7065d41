"""Launching a controlled run here (``bubblecast run``, the live benchmark) and summarising it.

:func:`launch_controlled` writes the job (train config, controller config, scripted actions,
the external decider's import path) into ``OUT.partial`` beside ``out`` (kept with the
telemetry so far when training fails: :mod:`bubblecast.runtime.jobdir`), runs
``python -m bubblecast.runtime.control.control_worker`` under torchrun, and
returns rank 0's summary plus derived figures; :func:`write_actions` writes the decisions and
applied actions as one JSON document, atomically. No torch import here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bubblecast.errors import BubblecastError
from bubblecast.runtime.control.control_config import ControllerConfig
from bubblecast.runtime.train_config import TrainConfig

if TYPE_CHECKING:
    from bubblecast.runtime.checkpoint import CheckpointOptions

WORKER = "bubblecast.runtime.control.control_worker"
Progress = Callable[[int, int, float | None], None]


def launch_controlled(config: TrainConfig, control: ControllerConfig, out: str | Path, *,
                      scripted: list[dict[str, Any]] | None = None,
                      on_progress: Progress | None = None, timeout: float | None = None,
                      ab_block: int = 0, decider: str | None = None,
                      checkpoints: CheckpointOptions | None = None) -> dict[str, Any]:
    """Run the job; rank 0's summary with :func:`derived` figures.
    :class:`~bubblecast.runtime.jobdir.TrainingFailed` (one line naming the rank, the signal
    and where the telemetry so far is kept) when training fails.

    ``decider``: import path (``module:factory``) of the external decider that
    ``control.service`` is asked through (see :class:`.decide.ExternalDecider`); the worker
    imports it, so that runtime itself never imports the package that provides it.
    ``checkpoints``: save every N steps, or resume (see :func:`.launch.run_out_job`).
    """
    from bubblecast.runtime.launch import run_out_job

    if control.service is not None and decider is None:
        raise BubblecastError("--service: needs an external decider (module:factory)")
    summary = run_out_job(out, config, actions=scripted, checkpoints=checkpoints, module=WORKER,
                          extra={"control": control.to_json(), "ab_block": int(ab_block),
                                 "decider": decider},
                          on_progress=on_progress, timeout=timeout)
    summary.update(derived(summary, config))
    return summary


def derived(summary: dict[str, Any], config: TrainConfig) -> dict[str, Any]:
    """Throughput, actions taken, first action, control overhead and decision latency."""
    wall, steps = float(summary["wall_s"]), int(summary["steps"])
    moves = [a for a in summary["actions"] if a.get("ok") and a.get("from") != a.get("to")]
    acted = [d for d in summary["decisions"] if d["action"]["action"] != "noop"]
    lat = [float(d["latency_s"]) for d in summary["decisions"]]
    control = max((float(c["control_s"]) for c in summary["control"]), default=0.0)
    return {
        "mean_step_s": wall / steps,
        "throughput_steps_s": steps / wall if wall > 0 else None,
        "throughput_samples_s": steps * config.batch_size / wall if wall > 0 else None,
        "actions_taken": len(moves),
        "first_action_step": acted[0]["step"] if acted else None,
        "decisions_made": len(summary["decisions"]),
        "decision_latency_s": {"mean": sum(lat) / len(lat) if lat else None,
                               "max": max(lat) if lat else None},
        "control_s": control,
        "control_pct_of_wall": 100.0 * control / wall if wall > 0 else None,
    }


def write_actions(path: str | Path, summary: dict[str, Any], control: ControllerConfig,
                  run_id: str) -> Path:
    """The decisions (every one, NoOps included) and the actions applied, atomically."""
    from bubblecast.telemetry.io import atomic_write_text

    doc = {"run_id": run_id, "policy": control.policy, "every": control.every,
           "forecaster": summary.get("forecaster"), "control": control.to_json(),
           "decisions": summary["decisions"], "applied": summary["actions"],
           "final_partition": summary["partition"]}
    return atomic_write_text(path, json.dumps(doc, indent=1, default=float))
