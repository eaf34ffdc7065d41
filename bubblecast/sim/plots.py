"""Pictures for ``inspect --plot``: a schedule timeline and a stage x step idle heatmap.

One PNG, two panels. Top: the timeline of the chosen steps (the first logged step by default),
one row per rank, F/B/W as coloured bars labelled with their microbatch, communication and
other ops as thin lighter bars, and each rank's pipeline window shaded pink, so the pink left
uncovered is the bubble (as in the zero-bubble paper's figures). Steps sit side by side.
Bottom: idle seconds per stage (summed over replicas) and step, over the whole run.
matplotlib (Agg) is imported inside the function.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bubblecast.errors import BubblecastError
from bubblecast.telemetry.events import Events

COLORS = {"F": "#4c72b0", "B": "#55a868", "W": "#dd8452"}
COMM_COLOR, OTHER_COLOR, WINDOW_COLOR = "#b0b0b0", "#c9b3d9", "#fbe3e3"
MAX_ROWS = 64
LABEL_LIMIT = 800


def _choose_steps(frame: pd.DataFrame, steps: list[int] | None) -> list[int]:
    logged = np.sort(pd.unique(frame["step"]))
    if not steps:
        return [int(logged[0])]
    missing = sorted(set(steps) - set(logged.tolist()))
    if missing:
        raise BubblecastError(f"--steps: step {missing[0]} is not in the run "
                              f"(logged steps {int(logged[0])}..{int(logged[-1])})")
    return sorted(set(steps))


def _timeline(ax: Any, frame: pd.DataFrame, steps: list[int]) -> None:
    from bubblecast.sim.accounting import rank_step_table

    part = frame.loc[frame["step"].isin(steps)]
    ranks = part.drop_duplicates("rank").sort_values(["replica", "stage", "rank"])
    shown = ranks.head(MAX_ROWS)
    row_of = {int(r): i for i, r in enumerate(shown["rank"])}
    part = part.loc[part["rank"].isin(row_of)]
    start = part["start_s"].to_numpy(float)
    end = start + part["duration_s"].to_numpy(float)
    step = part["step"].to_numpy()
    origin, offset, t = {}, {}, 0.0
    for s in steps:
        m = step == s
        origin[s], offset[s] = float(start[m].min()), t
        t += float(end[m].max() - start[m].min()) * 1.03
    scale, unit = (1e3, "ms") if t < 10 else (1.0, "s")
    shift = np.array([offset[s] - origin[s] for s in step])
    x0, x1 = (start + shift) * scale, (end + shift) * scale
    row = np.array([row_of[int(r)] for r in part["rank"]])
    table = rank_step_table(part)
    table = table.loc[table["rank"].isin(row_of)]
    for rec in table.itertuples():
        left = (rec.window_start - origin[rec.step] + offset[rec.step]) * scale
        ax.barh(row_of[int(rec.rank)], rec.window_s * scale, left=left, height=0.9,
                color=WINDOW_COLOR, linewidth=0)
    op = part["op"].astype(str).to_numpy()
    for kind, color in COLORS.items():
        m = op == kind
        ax.barh(row[m], x1[m] - x0[m], left=x0[m], height=0.8, color=color,
                edgecolor="white", linewidth=0.3, label=kind if m.any() else None)
    comm = np.isin(op, ["SEND_F", "RECV_F", "SEND_B", "RECV_B", "ALLREDUCE"])
    other = ~comm & ~np.isin(op, list(COLORS))
    for m, color, label in ((comm, COMM_COLOR, "comm"), (other, OTHER_COLOR, "other")):
        ax.barh(row[m] + 0.3, x1[m] - x0[m], left=x0[m], height=0.2, color=color,
                linewidth=0, label=label if m.any() else None)
    compute = np.isin(op, list(COLORS))
    if compute.sum() <= LABEL_LIMIT:
        mb = part["microbatch"].to_numpy()
        width = max(t * scale, 1e-12)
        for i in np.flatnonzero(compute & (x1 - x0 > 0.012 * width)):
            ax.text((x0[i] + x1[i]) / 2, row[i], str(mb[i]), ha="center", va="center",
                    fontsize=6, color="white")
    ax.set_yticks(range(len(shown)))
    ax.set_yticklabels([f"r{r} s{s}/d{d}" for r, s, d in
                        shown[["rank", "stage", "replica"]].itertuples(index=False)], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, t * scale)
    what = f"step {steps[0]}" if len(steps) == 1 else \
        f"steps {', '.join(map(str, steps))} side by side"
    ax.set_xlabel(f"time ({unit}); {what}")
    for s in steps[1:]:
        ax.axvline(offset[s] * scale, color="black", linewidth=0.6, linestyle=":")
    more = f" (first {MAX_ROWS} of {len(ranks)} ranks)" if len(ranks) > MAX_ROWS else ""
    ax.set_title(f"schedule timeline{more}: pink = bubble inside the pipeline window",
                 fontsize=9)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)


def _heatmap(fig: Any, ax: Any, frame: pd.DataFrame) -> None:
    from bubblecast.sim.accounting import rank_step_table, stage_step_idle

    idle = stage_step_idle(rank_step_table(frame))
    image = ax.imshow(idle.to_numpy(float), aspect="auto", interpolation="nearest",
                      cmap="magma_r")
    ax.set_yticks(range(len(idle.index)))
    ax.set_yticklabels([str(s) for s in idle.index], fontsize=7)
    cols = idle.columns.to_numpy()
    ticks = np.arange(0, len(cols), max(1, -(-len(cols) // 12)))
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(cols[i]) for i in ticks], fontsize=7)
    ax.set_xlabel("step")
    ax.set_ylabel("stage")
    ax.set_title("idle time per stage and step (s, summed over replicas)", fontsize=9)
    fig.colorbar(image, ax=ax, fraction=0.03, pad=0.01).set_label("idle s", fontsize=7)


def plot_inspect(events: Events, summary: dict[str, Any], path: str | Path,
                 steps: list[int] | None = None) -> Path:
    """Write the timeline and idle heatmap of ``summary['run_id']`` to a PNG at ``path``."""
    from bubblecast.telemetry.importers import require_per_op

    require_per_op(events, "inspect --plot", f"run {summary.get('run_id')}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bubblecast.sim.replay import select_run
    from bubblecast.telemetry.io import atomic_write

    _, ev = select_run(events, summary.get("run_id"))
    frame = ev.frame
    chosen = _choose_steps(frame, steps)
    n_rows = min(frame["rank"].nunique(), MAX_ROWS)
    top = max(2.5, 0.28 * n_rows + 1.2)
    fig, (ax_t, ax_h) = plt.subplots(2, 1, figsize=(13, top + 3.2),
                                     gridspec_kw={"height_ratios": [top, 3.0]})
    try:
        _timeline(ax_t, frame, chosen)
        _heatmap(fig, ax_h, frame)
        bf = summary.get("bubble_fraction")
        fig.suptitle(f"run {summary.get('run_id')}: bubble fraction "
                     f"{bf:.1%}" if isinstance(bf, float) else f"run {summary.get('run_id')}",
                     fontsize=10)
        fig.tight_layout()
        return atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=130))
    finally:
        plt.close(fig)
