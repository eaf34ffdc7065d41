"""Human-readable output of command results with rich."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def print_summary(summary: dict[str, Any]) -> None:
    console = Console()
    scalars = {k: v for k, v in summary.items() if not isinstance(v, (list, dict))}
    for key, value in scalars.items():
        console.print(f"[bold]{key}[/bold]: {value:.4f}" if isinstance(value, float)
                      else f"[bold]{key}[/bold]: {value}")
    for key, value in summary.items():
        if isinstance(value, dict):
            console.print(f"[bold]{key}[/bold]: " + ", ".join(
                f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in value.items()))
    rows = summary.get("per_stage") or []
    if rows:
        table = Table(title="per stage")
        for col in rows[0]:
            table.add_column(col, justify="right")
        for row in rows:
            table.add_row(*[f"{v:.4f}" if isinstance(v, float) else str(v) for v in row.values()])
        console.print(table)
