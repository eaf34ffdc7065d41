"""The ``--cluster`` and ``--skip-bad-runs`` options of the fleet commands (one definition)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer


def cluster_option() -> typer.models.OptionInfo:
    """``--cluster local:N|tcp://HOST:PORT``: run the per-run work on Dask (fleet extra)."""
    return typer.Option(None, "--cluster",
                        help="Run per-run work on Dask: local:N starts N worker processes, "
                             "tcp://HOST:PORT joins a scheduler (needs bubblecast[fleet]). "
                             "Default: in this process.")


def skip_bad_runs_option() -> typer.models.OptionInfo:
    """``--skip-bad-runs``: leave out unreadable runs of a fleet, listing them."""
    return typer.Option(False, "--skip-bad-runs",
                        help="Skip unreadable runs (listed on stderr and in the JSON) instead "
                             "of failing.")


def _analysis_task(source: str, format: str, run: str | None, method: str,
                   kwargs: dict[str, Any], outputs: list[tuple[str, str, Any]]) -> dict:
    """On a worker: ``BubbleAnalysis(source).<method>(**kwargs)`` and its file outputs
    (``(method, path, steps)``: ``plot``, ``to_perfetto``), written where the worker runs."""
    from bubblecast.sim.analysis import BubbleAnalysis

    analysis = BubbleAnalysis(source, format, run_id=run)
    result = getattr(analysis, method)(**kwargs)
    for name, path, steps in outputs:
        getattr(analysis, name)(path, steps=steps)
    return result


def analyse(cluster: str, file: Path, format: str, run: str | None, method: str,
            kwargs: dict[str, Any] | None = None,
            outputs: list[tuple[str, str, Any]] | None = None) -> dict:
    """``inspect``/``whatif`` with ``--cluster``: the run's analysis as one task on a Dask
    worker (of a fleet, only that run's directory is read there)."""
    from bubblecast.telemetry.cluster import executor
    from bubblecast.telemetry.fleet import fleet_runs

    source = fleet_runs(file).get(run, file) if run is not None else file
    absolute = [(name, str(Path(path).absolute()), steps) for name, path, steps in outputs or []]
    with executor(cluster, progress=False) as ex:
        return ex.map(_analysis_task, [str(Path(source).absolute())], format, run, method,
                      kwargs or {}, absolute, label=method)[0]
