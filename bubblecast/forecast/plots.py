"""Forecast-vs-actual plots (matplotlib with the Agg backend, imported lazily)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd


def plot_forecasts(frame: pd.DataFrame, preds: dict[int, np.ndarray], path: str | os.PathLike[str],
                   title: str = "", n_series: int = 4) -> Path:
    """Actual signal and p50 with the p10-p90 band at each horizon, for the most variable
    series of ``frame``; ``preds`` is ``{h: (n, 3)}`` aligned with ``frame``'s rows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bubblecast.telemetry.io import atomic_write

    keys = ["run_id", "replica", "stage"]
    spread = frame.groupby(keys, observed=True)["y"].std().dropna().sort_values()
    chosen = list(spread.index[::-1][:n_series])
    horizons = sorted(preds)
    fig, axes = plt.subplots(len(chosen) or 1, len(horizons), squeeze=False,
                             figsize=(4.2 * len(horizons), 2.4 * max(1, len(chosen))))
    for i, key in enumerate(chosen):
        mask = np.ones(len(frame), dtype=bool)
        for col, value in zip(keys, key, strict=True):
            mask &= (frame[col] == value).to_numpy()
        rows = np.flatnonzero(mask)
        step = frame["step"].to_numpy()[rows]
        for j, h in enumerate(horizons):
            ax = axes[i, j]
            q = preds[h][rows]
            ax.plot(step, frame["y"].to_numpy()[rows], color="black", lw=0.8, label="actual")
            ax.plot(step + h, q[:, 1], color="tab:blue", lw=0.8, label="p50")
            ax.fill_between(step + h, q[:, 0], q[:, 2], color="tab:blue", alpha=0.25,
                            label="p10-p90")
            ax.set_title(f"{key[0]} r{key[1]} s{key[2]}  h={h}", fontsize=8)
            ax.tick_params(labelsize=7)
    axes[0, 0].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    target = Path(path)
    atomic_write(target, lambda tmp: fig.savefig(tmp, dpi=90, format="png"))
    plt.close(fig)
    return target
