"""Evaluate forecasters against the baselines on the same rows, per horizon and per scenario.

Baselines are always evaluated alongside; their interval quantiles are cross-fitted by run
(fit on half the runs, predict the other half) so their coverage is out of sample too. Skill at
a horizon is ``1 - MAE / MAE(best baseline at that horizon)`` on exactly the rows every model
forecasts; ``baseline`` names the baseline with the lowest MAE averaged over horizons.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from bubblecast.dataset.features import horizons_of
from bubblecast.errors import BubblecastError
from bubblecast.forecast.base import Forecaster
from bubblecast.forecast.baselines import BASELINES, make_baseline
from bubblecast.forecast.error_metrics import point_metrics, skill


def unique_names(kinds: list[str], taken: list[str] | None = None) -> list[str]:
    """Model names from kinds: ``lgbm``, then ``lgbm-2``, ``lgbm-3`` for repeats."""
    used = list(taken or [])
    out = []
    for kind in kinds:
        name, k = kind, 1
        while name in used:
            k += 1
            name = f"{kind}-{k}"
        used.append(name)
        out.append(name)
    return out


def baseline_predictions(frame: pd.DataFrame, horizons: list[int], seed: int = 0
                         ) -> dict[str, dict[int, np.ndarray]]:
    """Quantile forecasts of every baseline, intervals cross-fitted over two halves of runs."""
    runs = np.array(sorted(frame["run_id"].astype(str).unique()))
    rng = np.random.default_rng(seed)
    run_ids = frame["run_id"].astype(str).to_numpy()
    halves = [frame.index.to_numpy() == frame.index.to_numpy()]  # all rows
    if len(runs) >= 2:
        perm = rng.permutation(runs)
        first = np.isin(run_ids, perm[: len(runs) // 2])
        halves = [first, ~first]
    out: dict[str, dict[int, np.ndarray]] = {}
    for name in BASELINES:
        preds = {h: np.full((len(frame), 3), np.nan) for h in horizons}
        for k, rows in enumerate(halves):
            fit_rows = halves[1 - k] if len(halves) == 2 else rows
            model = make_baseline(name).fit(frame.loc[fit_rows])
            part = model.predict_signal(frame.loc[rows], horizons)
            for h in horizons:
                preds[h][rows] = part[h]
        out[name] = preds
    return out


@dataclass
class Evaluation:
    """Metrics per (model, horizon, scenario); ``scenario == "all"`` rows are the totals."""

    table: pd.DataFrame
    baseline: str
    best_baseline: dict[int, str] = field(default_factory=dict)
    horizons: list[int] = field(default_factory=list)
    models: list[str] = field(default_factory=list)
    baselines: list[str] = field(default_factory=lambda: list(BASELINES))
    notes: list[str] = field(default_factory=list)
    #: Per (model, horizon): MAE of the predicted bubble fraction and mean predicted/actual.
    bubbles: pd.DataFrame | None = None

    def summary(self) -> dict[str, Any]:
        """The ``evaluate --json`` object: models -> h{h} -> mae, coverage_80, skill."""
        all_rows = self.table[self.table["scenario"] == "all"]
        models: dict[str, Any] = {}
        for name in self.models:
            sub = all_rows[all_rows["model"] == name].set_index("horizon")
            models[name] = {f"h{h}": {"mae": float(sub.loc[h, "mae"]),
                                      "coverage_80": float(sub.loc[h, "coverage_80"]),
                                      "skill": float(sub.loc[h, "skill"])}
                            for h in self.horizons}
        return {"models": models, "baseline": self.baseline}


def evaluate(frame: pd.DataFrame, models: dict[str, Forecaster],
             horizons: list[int] | None = None, seed: int = 0,
             predictions: dict[str, dict[int, np.ndarray]] | None = None) -> Evaluation:
    """Evaluate ``models`` (name -> fitted forecaster) and the baselines on ``frame``.

    ``predictions`` may pass precomputed ``{name: {h: (n, 3)}}`` forecasts (e.g. to reuse them
    for plots); missing ones are computed here.
    """
    available = horizons_of(frame.columns)
    hz = list(horizons) if horizons is not None else available
    for model in models.values():
        hz = [h for h in hz if h in getattr(model, "horizons_", hz)]
    missing = [h for h in (horizons or []) if h not in available]
    if missing or not hz:
        raise BubblecastError(f"no common horizons to evaluate (features file has {available}"
                              + (f", models forecast {sorted(set(hz))}" if models else "") + ")")
    preds = dict(baseline_predictions(frame, hz, seed))
    for name, model in models.items():
        preds[name] = (predictions or {}).get(name) or model.predict_signal(frame, hz)
    names = list(BASELINES) + list(models)
    scen = frame["scenario"].astype(str).to_numpy() if "scenario" in frame.columns else \
        np.full(len(frame), "unknown")
    records = []
    best: dict[int, str] = {}
    for h in hz:
        y = frame[f"y_h{h}"].to_numpy(dtype=np.float64)
        work = frame[f"work_h{h}"].to_numpy(dtype=np.float64)
        same = np.isfinite(y)
        for name in names:
            same &= np.isfinite(preds[name][h]).all(axis=1)
        if not same.any():
            raise BubblecastError(f"no rows with a known target at horizon {h} to evaluate")
        base_mae = {}
        for name in names:
            q = preds[name][h]
            for group in ["all", *sorted(set(scen[same]))]:
                rows = same if group == "all" else same & (scen == group)
                m = point_metrics(y[rows], q[rows])
                m["mae_s"] = float(np.mean(np.abs(q[rows, 1] - y[rows]) * work[rows]))
                records.append({"model": name, "horizon": h, "scenario": group, **m})
                if name in BASELINES:
                    base_mae[(name, group)] = m["mae"]
        best[h] = min(BASELINES, key=lambda b: base_mae[(b, "all")])
    table = pd.DataFrame.from_records(records)
    ref = {}
    for (h, group), sub in table[table["model"].isin(BASELINES)].groupby(["horizon",
                                                                          "scenario"]):
        ref[(h, group)] = sub["mae"].min()
        ref[(h, group, "name")] = sub.loc[sub["mae"].idxmin(), "model"]
    table["skill"] = [skill(r.mae, ref[(r.horizon, r.scenario)]) for r in table.itertuples()]
    table["best_baseline"] = [ref[(r.horizon, r.scenario, "name")] for r in table.itertuples()]
    overall = table[(table["scenario"] == "all") & table["model"].isin(BASELINES)]
    baseline = str(overall.groupby("model")["mae"].mean().idxmin())
    return Evaluation(table=table, baseline=baseline, best_baseline=best, horizons=hz,
                      models=names)
