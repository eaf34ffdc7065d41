"""The ``--cluster`` and ``--skip-bad-runs`` options of the fleet commands (one definition)."""

from __future__ import annotations

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
