"""Progress of the demo: rich bars on a terminal, one line per stage otherwise, or nothing.

A stage calls ``note(text)`` when it starts a phase and ``advance(done, total)`` for a phase
with a known length (runs simulated, steps trained live); the bars go to stderr so stdout
stays for the final summary.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO


class Progress:
    """No output; the base of the two displays."""

    def stage(self, index: int, total: int, title: str) -> None:
        """Stage ``index`` (1-based) of ``total``, called ``title``, starts."""

    def note(self, text: str) -> None:
        """A new phase inside the current stage."""

    def advance(self, done: int, total: int) -> None:
        """The current phase has done ``done`` of ``total`` units."""

    def finish(self, title: str, seconds: float, reused: bool, note: str = "") -> None:
        """The current stage ended (or was reused from an earlier run)."""


class LineProgress(Progress):
    """One line per stage on a stream (for logs and non-terminals)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self._prefix = ""

    def stage(self, index: int, total: int, title: str) -> None:
        self._prefix = f"[{index}/{total}]"

    def finish(self, title: str, seconds: float, reused: bool, note: str = "") -> None:
        how = "reused" if reused else f"{seconds:6.1f} s"
        extra = f"  ({note})" if note else ""
        print(f"{self._prefix} {title:<44} {how}{extra}", file=self.stream, flush=True)


class RichProgress(Progress):
    """An overall bar over the stages and a bar (or spinner) for the current phase."""

    def __init__(self, bar: Any, console: Any) -> None:
        self.bar, self.console = bar, console
        self.overall = bar.add_task("bubblecast demo", total=1)
        self.current: Any = None

    def stage(self, index: int, total: int, title: str) -> None:
        self.bar.update(self.overall, total=total, completed=index - 1,
                        description=f"[bold]demo {index}/{total}[/bold] {title}")
        self._phase("starting", None)

    def _phase(self, text: str, total: int | None) -> None:
        if self.current is not None:
            self.bar.remove_task(self.current)
        self.current = self.bar.add_task(f"  {text}", total=total)

    def note(self, text: str) -> None:
        self._phase(text, None)

    def advance(self, done: int, total: int) -> None:
        if self.current is not None:
            self.bar.update(self.current, total=total, completed=done)

    def finish(self, title: str, seconds: float, reused: bool, note: str = "") -> None:
        if self.current is not None:
            self.bar.remove_task(self.current)
            self.current = None
        self.bar.advance(self.overall)
        how = "[dim]reused[/dim]" if reused else f"{seconds:.1f} s"
        extra = f"  [dim]{note}[/dim]" if note else ""
        self.console.print(f"[green]✓[/green] {title}  {how}{extra}")


@contextmanager
def progress_display(mode: str = "auto", stream: TextIO | None = None) -> Iterator[Progress]:
    """``auto``: rich bars on a terminal, lines otherwise; ``lines``; ``none``."""
    if mode == "none":
        yield Progress()
        return
    from rich.console import Console

    console = Console(file=stream or sys.stderr)
    if mode == "lines" or not console.is_terminal:
        yield LineProgress(stream)
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )
    from rich.progress import Progress as Bars

    with Bars(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
              MofNCompleteColumn(), TimeElapsedColumn(), console=console,
              transient=True) as bar:
        yield RichProgress(bar, console)
