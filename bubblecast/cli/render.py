"""Human-readable output of command results with rich."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def print_summary(summary: dict[str, Any]) -> None:
    """``inspect`` without ``--json``: a short report, then per-stage and slow-rank tables."""
    if "bubble_fraction" not in summary or "per_stage" not in summary:
        return _print_generic(summary)
    console = Console()
    s = summary
    st = s.get("step_time_s") or {}
    console.print(f"[bold]run[/bold] {s['run_id']}  schedule {s.get('schedule', '?')}  "
                  f"{s['stages']} stages x {s['replicas']} replicas  "
                  f"{s.get('microbatches', '?')} microbatches  {s['steps']} steps")
    console.print(f"[bold]step time[/bold] median {_fmt(st.get('median'))} s, "
                  f"p90 {_fmt(st.get('p90'))} s")
    console.print(f"[bold]bubbles[/bold] {_pct(s['bubble_fraction'])} of rank time "
                  f"(structural {_pct(s.get('structural_bubble_fraction'))}, "
                  f"dynamic {_pct(s.get('dynamic_bubble_fraction'))})")
    if s.get("structural_error"):
        console.print(f"[yellow]structural replay failed:[/yellow] {s['structural_error']}")
    console.print(f"[bold]bottleneck stage[/bold] {_fmt(s.get('bottleneck_stage'))}")
    table = Table(title="per stage (summed over the run)")
    for col in ("stage", "busy s", "idle s", "bubble"):
        table.add_column(col, justify="right")
    bottleneck = s.get("bottleneck_stage")
    for row in s["per_stage"] or []:
        style = "bold red" if row["stage"] == bottleneck else None
        table.add_row(str(row["stage"]), _fmt(row["busy_s"], 3), _fmt(row["idle_s"], 3),
                      _pct(row["bubble_fraction"]), style=style)
    console.print(table)
    details = s.get("slow_rank_details") or []
    if not details:
        console.print("[bold]slow ranks[/bold] none")
        return
    slow = Table(title="slow ranks")
    for col in ("rank", "stage", "replica", "slowdown", "steps", "from", "to", "against"):
        slow.add_column(col, justify="right")
    for r in details:
        slow.add_row(str(r["rank"]), str(r["stage"]), str(r["replica"]),
                     f"{r['slowdown']:.2f}x", str(r["steps"]), str(r["first_step"]),
                     str(r["last_step"]), r["against"])
    console.print(slow)


def print_whatif(result: dict[str, Any]) -> None:
    """``whatif`` without ``--json``: replay fidelity and one row per scenario."""
    console = Console()
    r = result
    console.print(f"[bold]run[/bold] {r.get('run_id', '?')}  {r.get('steps', '?')} steps  "
                  f"bottleneck stage {_fmt(r.get('bottleneck_stage'))}  "
                  f"slow ranks {r.get('slow_ranks') or 'none'}")
    console.print(f"[bold]mean step[/bold] observed {_fmt(r['observed_step_s'])} s, "
                  f"replayed {_fmt(r['replayed_step_s'])} s "
                  f"(median error {_pct(r['replay_error'])})")
    table = Table(title="what if")
    for col in ("scenario", "step s", "speed-up"):
        table.add_column(col, justify="right")
    for name, sc in r["scenarios"].items():
        speed = (sc or {}).get("speedup")
        table.add_row(name, _fmt((sc or {}).get("step_s")),
                      "-" if speed is None else f"{speed:.3f}x")
    console.print(table)
    if r.get("balanced_work_note"):
        console.print(f"[bold]balanced_work[/bold]: {r['balanced_work_note']}")


def policy_rows(result: dict[str, Any], names: list[str]) -> list[str]:
    """``policy-eval`` without ``--json``: a header and one line per policy; work-planning
    columns (imbalance degree, the mean-cost bound, planning ms) when a run packs documents,
    then the notes (cost model, runs without documents)."""
    def fmt(value: object, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    work = any("imbalance_degree" in result["policies"][n] for n in names)
    extra = f" {'imbalance':>9} {'bound_s':>10} {'plan_ms':>8}" if work else ""
    lines = [f"{'policy':12} {'step_s':>10} {'bubble':>8} {'speedup':>8} {'oracle%':>8} "
             f"{'actions':>8} {'migration_s':>12}{extra}"]
    notes = []
    for name in names:
        p = result["policies"][name]
        share = None if p["oracle_share"] is None else 100 * p["oracle_share"]
        more = (f" {fmt(p.get('imbalance_degree'), '9.4f')} {fmt(p.get('bound_step_s'), '10.5f')}"
                f" {fmt(p.get('decision_ms'), '8.3f')}") if work else ""
        lines.append(f"{name:12} {p['step_s']:10.5f} {p['bubble_fraction']:8.4f} "
                     f"{fmt(p['speedup_vs_static'], '8.4f')} {fmt(share, '8.1f')} "
                     f"{p['actions']:8d} {p['migration_s']:12.3f}{more}")
        notes += [f"{name}: {key.replace('_', ' ')}: {p[key]}" for key in ("cost_model", "note")
                  if p.get(key)]
    first = result["policies"][names[0]] if names else {}
    if first.get("optimum_step_s") is not None:
        notes.append(f"optimum (MILP): no plan is faster than {first['optimum_step_s']:.5f} s "
                     f"a step; the best plan found {fmt(first.get('optimum_best_s'), '.5f')} s")
    return lines + notes


def _print_generic(summary: dict[str, Any]) -> None:
    console = Console()
    for key, value in summary.items():
        if not isinstance(value, (list, dict)):
            console.print(f"[bold]{key}[/bold]: {_fmt(value)}")
        elif isinstance(value, dict):
            console.print(f"[bold]{key}[/bold]: " + ", ".join(
                f"{k}={_fmt(v)}" for k, v in value.items()))
