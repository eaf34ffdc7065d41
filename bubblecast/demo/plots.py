"""The demo's own figures (matplotlib, Agg backend, imported lazily; PNGs written atomically):
the scenario suite, forecast skill and coverage per horizon, live step times per policy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def _save(fig: Any, path: str | Path) -> Path:
    import matplotlib.pyplot as plt

    from bubblecast.telemetry.io import atomic_write

    try:
        return atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100))
    finally:
        plt.close(fig)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_scenarios(examples: dict[str, Any], path: str | Path) -> Path:
    """One panel per scenario: each stage's delay signal (compute seconds per unit of work,
    the forecasting target) over the steps of one example run."""
    from bubblecast.dataset import step_series

    plt = _pyplot()
    names = list(examples)
    cols = min(3, max(1, len(names)))
    rows = (len(names) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 2.6 * rows), squeeze=False)
    for ax, name in zip(axes.ravel(), names, strict=False):
        series = step_series(examples[name])
        run_id = str(series["run_id"].iloc[0])
        base = float(np.median(series["y"]))
        for stage, part in series[series["replica"] == 0].groupby("stage"):
            ax.plot(part["step"], part["y"] / base, lw=0.8, label=f"stage {stage}")
        ax.set_title(f"{name}  ({run_id})", fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.set_ylabel("delay / median", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in axes.ravel()[len(names):]:
        ax.axis("off")
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, path)


def plot_skill(table: Any, models: list[str], baselines: list[str], path: str | Path) -> Path:
    """Held-out MAE skill against the best baseline, and p10-p90 coverage, per horizon."""
    plt = _pyplot()
    overall = table[table["scenario"] == "all"]
    learnt = [m for m in models if m not in baselines]
    fig, (ax_s, ax_c) = plt.subplots(1, 2, figsize=(10, 3.4))
    width = 0.8 / max(1, len(learnt))
    horizons = sorted(overall["horizon"].unique())
    x = np.arange(len(horizons))
    for k, model in enumerate(learnt):
        sub = overall[overall["model"] == model].set_index("horizon").reindex(horizons)
        ax_s.bar(x + k * width, sub["skill"], width, label=model)
        ax_c.plot(horizons, sub["coverage_80"], marker="o", label=model)
    ax_s.axhline(0, color="0.3", lw=0.8)
    ax_s.set_xticks(x + width * (len(learnt) - 1) / 2, [f"h={h}" for h in horizons])
    ax_s.set_ylabel("skill = 1 - MAE / MAE(best baseline)")
    ax_s.set_title("held-out skill per horizon", fontsize=10)
    ax_s.legend(fontsize=8)
    ax_c.axhline(0.8, color="0.3", lw=0.8, ls="--", label="nominal 0.8")
    ax_c.set_ylim(0, 1.05)
    ax_c.set_xlabel("horizon (steps)")
    ax_c.set_ylabel("p10-p90 coverage")
    ax_c.set_title("interval coverage on held-out runs", fontsize=10)
    ax_c.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, path)


def _rolling(values: np.ndarray, width: int) -> np.ndarray:
    """Centred rolling mean (edges averaged over the values present)."""
    if len(values) < width:
        return values
    kernel = np.ones(width)
    return np.convolve(values, kernel, "same") / np.convolve(np.ones(len(values)), kernel,
                                                             "same")


def plot_live(series: dict[str, np.ndarray], slowed: tuple[int, int], path: str | Path,
              inject: str, smooth: int = 5) -> Path:
    """Step time per step for each policy of the live run; the full-strength slowdown shaded."""
    plt = _pyplot()
    colors: dict[str, str] = {"static": "0.45", "reactive": "tab:orange",
                              "predictive": "tab:blue"}
    fig, ax = plt.subplots(figsize=(10, 3.4))
    for name, times in series.items():
        x, color = np.arange(len(times)), colors.get(name)
        ax.plot(x, 1e3 * times, lw=0.4, alpha=0.35, color=color)
        ax.plot(x, 1e3 * _rolling(times, smooth), lw=1.3, color=color,
                label=f"{name} (mean {1e3 * times.mean():.1f} ms)")
    lo, hi = slowed
    if hi > lo:
        ax.axvspan(lo, hi, color="tab:red", alpha=0.07, label="slowdown at full strength")
    ax.set_xlabel("step")
    ax.set_ylabel("step time (ms)")
    ax.set_title(f"live 2-process CPU pipeline, injected slowdown {inject}", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, path)
