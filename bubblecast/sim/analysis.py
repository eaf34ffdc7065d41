"""``BubbleAnalysis``: one run's bubble accounting, what-ifs, replay and plots in one object.

In the spirit of HolisticTraceAnalysis's ``TraceAnalysis``: build it from a telemetry file in
any supported format (or an in-memory :class:`~bubblecast.telemetry.events.Events`), then ask
questions. Every method delegates to the function the CLI uses (``inspect`` and ``whatif`` call
this class), so ``summary()`` is the ``inspect --json`` object and ``whatif()`` the ``whatif
--json`` object. Events are read once, on first use; the summary is computed once.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bubblecast.telemetry.events import Events

if TYPE_CHECKING:
    import pandas as pd

    from bubblecast.sim.replay import ReplayResult


class BubbleAnalysis:
    """Analyse one run of ``source`` (a path in ``format``, or an ``Events`` object).

    ``run_id`` picks the run when the source holds several (as ``--run``).
    """

    def __init__(self, source: str | os.PathLike[str] | Events, format: str = "auto",
                 run_id: str | None = None) -> None:
        self.source = source
        self.format = format
        self.run_id = run_id
        self._events: Events | None = source if isinstance(source, Events) else None
        self._summary: dict[str, Any] | None = None

    def __repr__(self) -> str:
        src = "Events" if isinstance(self.source, Events) else repr(str(self.source))
        return f"BubbleAnalysis({src}, format={self.format!r}, run_id={self.run_id!r})"

    @property
    def events(self) -> Events:
        """The events of the source (read and validated on first access)."""
        if self._events is None:
            from bubblecast.telemetry.importers import load_events

            self._events = load_events(Path(self.source), self.format)  # type: ignore[arg-type]
        return self._events

    def summary(self) -> dict[str, Any]:
        """The ``inspect --json`` object: bubble fractions, step time, bottleneck, slow ranks,
        per stage and per rank (:func:`bubblecast.sim.accounting.inspect_summary`)."""
        if self._summary is None:
            from bubblecast.sim.accounting import inspect_summary

            self._summary = inspect_summary(self.events, run_id=self.run_id)
        return self._summary

    def per_stage(self) -> pd.DataFrame:
        """Busy, idle seconds and bubble fraction per stage over the run (one row a stage)."""
        import pandas as pd

        return pd.DataFrame(self.summary()["per_stage"])

    def per_rank(self) -> pd.DataFrame:
        """Stage, replica, busy, idle seconds and bubble fraction per rank over the run."""
        import pandas as pd

        return pd.DataFrame(self.summary()["per_rank"])

    def per_step(self) -> pd.DataFrame:
        """Step time, window, busy, idle and bubble fraction per step."""
        from bubblecast.sim.accounting import per_step

        return per_step(self.events, self.run_id)

    def whatif(self, launch_delays: bool = False) -> dict[str, Any]:
        """The ``whatif --json`` object: replay error and step time under each counterfactual
        (ideal, fix_bottleneck, no_slow_ranks, balanced); see :mod:`bubblecast.sim.whatif`."""
        from bubblecast.sim.replay import ReplayConfig
        from bubblecast.sim.whatif import whatif

        return whatif(self.events, self.run_id, config=ReplayConfig(launch_delays=launch_delays))

    def replay(self, launch_delays: bool = False) -> ReplayResult:
        """Replay the run with its estimated pure durations: every op's replayed start and end
        (run-frame row order) and observed vs replayed step times."""
        from bubblecast.sim.replay import ReplayConfig, replay

        return replay(self.events, run_id=self.run_id,
                      config=ReplayConfig(launch_delays=launch_delays))

    def plot(self, path: str | os.PathLike[str], steps: list[int] | None = None) -> Path:
        """Write the ``inspect --plot`` PNG (timeline of ``steps``, default the first, and the
        stage x step idle heatmap); returns its path."""
        from bubblecast.sim.plots import plot_inspect

        return plot_inspect(self.events, self.summary(), path, steps=steps)

    def to_perfetto(self, path: str | os.PathLike[str], steps: list[int] | None = None) -> Path:
        """Write the ``inspect --perfetto`` Chrome/Perfetto trace JSON (one process per rank;
        ``steps`` default all); returns its path."""
        from bubblecast.sim.perfetto import write_perfetto

        return write_perfetto(self.events, path, run_id=self.run_id, steps=steps)
