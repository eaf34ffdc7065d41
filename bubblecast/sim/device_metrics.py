"""The ``device_metrics`` of simulated runs: what each run's scenario draw carries in
``metrics`` (``temperature_c``, ``sm_clock_mhz``, ``power_w`` for ``thermal`` runs; the
known-future ``tokens`` for ``seqlen`` runs), written beside the events by ``simulate``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bubblecast.sim.scenarios import RunShape


def _frame(run_id: str, values: np.ndarray, metric: str) -> pd.DataFrame:
    """``(steps, ranks)`` values as device-metrics rows."""
    steps, ranks = values.shape
    return pd.DataFrame({"run_id": run_id, "step": np.repeat(np.arange(steps), ranks),
                         "rank": np.tile(np.arange(ranks), steps), "metric": metric,
                         "value": values.reshape(-1)})


def simulated_metrics(config: Any) -> pd.DataFrame:
    """The ``device_metrics`` rows of the runs ``config`` (a SimConfig) simulates: what each
    run's scenario draw carries in ``metrics`` (re-drawn: draws are deterministic)."""
    from bubblecast.telemetry.metrics import empty

    parts = []
    for k, run_id in zip(range(config.first_run, config.first_run + config.runs),
                         config.run_ids(), strict=True):
        draw = config.scenario_for(k).draw(RunShape(config.steps, config.stages,
                                                    config.replicas, config.microbatches))
        parts += [_frame(run_id, v, m) for m, v in sorted(draw.metrics.items())]
    return pd.concat(parts, ignore_index=True) if parts else empty()


def write_simulated_metrics(config: Any, out: str | os.PathLike[str]) -> Path | None:
    """Write the metrics of ``config``'s runs beside the events at ``out`` (a file, or a fleet
    directory: one ``run_id=<id>/part-00000.metrics`` per run in the fleet's sidecar folder
    ``_<fleet>.sidecars/``, outside the data every reader lists); None when there are none."""
    from bubblecast.telemetry.fleet import is_directory_target, run_dir_name, sidecar_dir
    from bubblecast.telemetry.metrics import metrics_path, write_metrics

    frame = simulated_metrics(config)
    if frame.empty:
        return None
    if not is_directory_target(out):
        return write_metrics(frame, metrics_path(out))
    root = sidecar_dir(out)
    for run_id, part in frame.groupby("run_id", sort=False):
        write_metrics(part, root / run_dir_name(str(run_id)) / "part-00000.metrics")
    return root
