"""The ``--cluster`` and ``--skip-bad-runs`` options of the fleet commands (one definition),
and ``inspect``/``whatif``'s reading of a fleet run by run, in process or on a worker."""

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


#: What ``train`` and ``evaluate`` add to ``--skip-bad-runs``'s help.
FEATURES_ONLY = " Of a features dataset partitioned by run; not with --cluster (exit 2)."


def skip_bad_runs_option(note: str = "") -> typer.models.OptionInfo:
    """``--skip-bad-runs``: leave out unreadable runs of a fleet, listing them (``note``
    appended to the help)."""
    return typer.Option(False, "--skip-bad-runs",
                        help="Skip unreadable runs (listed on stderr and in the JSON) instead "
                             "of failing." + note)


def local_analysis(file: Path | str, format: str, run: str | None, skip_bad: bool = False,
                   quiet: bool = False) -> tuple[Any, list[dict[str, Any]] | None]:
    """``inspect``/``whatif``'s analysis of ``file`` and the runs skipped (None without
    ``skip_bad``). A fleet is read run by run (of ``--run``'s run only, when given), so an
    unreadable run fails naming the run and its file, or is skipped with ``skip_bad``; other
    inputs are read as they always were (``skip_bad`` then skips the input if unreadable)."""
    from bubblecast.policy.work_whatif import BubbleAnalysis  # adds balanced_work
    from bubblecast.telemetry.fleet import is_fleet

    if not skip_bad and not is_fleet(file):
        return BubbleAnalysis(file, format, run_id=run), None
    from bubblecast.execution import load_runs

    events, skipped = load_runs([file], format, skip_bad=skip_bad, run=run, quiet=quiet)
    return BubbleAnalysis(events, format, run_id=run), (skipped if skip_bad else None)


def skipped_into(result: dict[str, Any], skipped: list[dict[str, Any]] | None
                 ) -> dict[str, Any]:
    """``result`` with ``skipped_runs`` added when runs could be skipped (``--skip-bad-runs``):
    the JSON lists them, empty when none was."""
    if skipped is not None:
        result["skipped_runs"] = skipped
    return result


def _analysis_task(source: str, format: str, run: str | None, method: str,
                   kwargs: dict[str, Any], outputs: list[tuple[str, str, Any]],
                   skip_bad: bool = False) -> tuple[dict, list[dict[str, Any]] | None]:
    """On a worker: ``BubbleAnalysis(source).<method>(**kwargs)`` and its file outputs
    (``(method, path, steps)``: ``plot``, ``to_perfetto``), written where the worker runs;
    and the runs skipped."""
    analysis, skipped = local_analysis(source, format, run, skip_bad, quiet=True)
    result = getattr(analysis, method)(**kwargs)
    for name, path, steps in outputs:
        getattr(analysis, name)(path, steps=steps)
    return result, skipped


def analyse(cluster: str, file: Path, format: str, run: str | None, method: str,
            kwargs: dict[str, Any] | None = None,
            outputs: list[tuple[str, str, Any]] | None = None, skip_bad: bool = False) -> dict:
    """``inspect``/``whatif`` with ``--cluster``: the run's analysis as one task on a Dask
    worker (of a fleet, only that run's directory is read there); runs skipped there are
    listed here (stderr) and in the result (``skipped_runs``, with ``skip_bad``)."""
    from bubblecast.execution import executor, note_skipped

    absolute = [(name, str(Path(path).absolute()), steps) for name, path, steps in outputs or []]
    with executor(cluster, progress=False) as ex:
        result, skipped = ex.map(_analysis_task, [str(Path(file).absolute())], format, run,
                                 method, kwargs or {}, absolute, skip_bad, label=method)[0]
    note_skipped(skipped or [])
    return skipped_into(result, skipped)
