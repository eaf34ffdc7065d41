"""From an events table to the rows of the micro-batch cost model, and its speed estimate.

One row per compute op (``F``, ``B``, ``W``) that has a token count (:func:`cost_rows`), with
the op ``kind`` (``BW`` for the backward of a run that logs no ``W`` op: it carries B and W,
SPEC §3), ``tokens``, ``tokens_sq`` and ``documents`` (NaN when the events lack them), the
layers the op runs (the ``layers`` column over the run's model chunks; 1 when absent) and its
``duration_s``. Rows are sorted by run, rank and step.

A rank's **speed** at a step is the ratio of its observed compute seconds to what the nominal
model predicts for the same ops at speed 1 (:func:`speed_table`). The speed a prediction may use
is the *recent* one, known before the step starts: the ratio of the rank's previous step in the
run (lag 1); where that is unknown, the median ratio of the rank's earlier steps, or 1 before
any. Nothing at a step or after it changes the recent speed at that step.

The learners' fits, bounds and error reports are in :mod:`bubblecast.forecast.cost_fitting`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from bubblecast.errors import BubblecastError
from bubblecast.telemetry.events import Events
from bubblecast.telemetry.schema import COMPUTE_OPS

#: Op kinds the model learns; ``BW`` is the fused backward of runs without ``W`` ops.
KINDS: tuple[str, ...] = ("F", "B", "W", "BW")
#: Per-layer cost terms, in :class:`~bubblecast.sim.documents.WorkCost` order.
TERMS: tuple[str, ...] = ("per_token", "per_token_sq", "per_document", "per_microbatch")
#: The micro-batch statistic behind each term (``None``: the constant).
TERM_COLUMNS: dict[str, str | None] = {"per_token": "tokens", "per_token_sq": "tokens_sq",
                                       "per_document": "documents", "per_microbatch": None}


def cost_rows(events: Events, where: str = "events") -> pd.DataFrame:
    """The cost-model rows of ``events`` (see the module doc); one-line errors naming
    ``where`` for events without a ``tokens`` column, without compute ops, or with no token
    count on any compute op."""
    frame = events.frame
    if "tokens" not in frame.columns:
        raise BubblecastError(f"{where}: column 'tokens' is missing; the cost model needs each "
                              "micro-batch's tokens (and tokens_sq, documents for packed "
                              "documents)")
    op = frame["op"].astype(str).to_numpy()
    compute = np.isin(op, COMPUTE_OPS)
    if not compute.any():
        raise BubblecastError(f"{where}: no compute ops (F, B, W) to learn micro-batch costs "
                              "from")
    tokens = _floats(frame, "tokens")
    keep = compute & np.isfinite(tokens) & (frame["microbatch"].to_numpy() >= 0)
    if not keep.any():
        raise BubblecastError(f"{where}: column 'tokens' has no value on any compute op")
    run = frame["run_id"].astype(str).to_numpy()[keep]
    kind = op[keep].astype(object)
    with_w = np.unique(run[kind == "W"])
    kind[(kind == "B") & ~np.isin(run, with_w)] = "BW"
    layers = _floats(frame, "layers")[keep] / _chunks(events, frame)[keep]
    out = pd.DataFrame({
        "run_id": run, "rank": frame["rank"].to_numpy(np.int64)[keep],
        "stage": frame["stage"].to_numpy(np.int64)[keep],
        "replica": frame["replica"].to_numpy(np.int64)[keep],
        "step": frame["step"].to_numpy(np.int64)[keep], "kind": kind,
        "tokens": tokens[keep], "tokens_sq": _floats(frame, "tokens_sq")[keep],
        "documents": _floats(frame, "documents")[keep],
        "layers": np.where(np.isfinite(layers) & (layers > 0), layers, 1.0),
        "duration_s": frame["duration_s"].to_numpy(np.float64)[keep],
        "row": np.flatnonzero(keep),
    })
    order = np.lexsort((out["row"].to_numpy(), out["step"].to_numpy(), out["rank"].to_numpy(),
                        out["run_id"].to_numpy()))
    return out.iloc[order].reset_index(drop=True)


def _floats(frame: pd.DataFrame, column: str) -> np.ndarray:
    """``column`` as float64 with NaN for nulls; all NaN when the column is absent."""
    if column not in frame.columns:
        return np.full(len(frame), np.nan)
    return pd.to_numeric(frame[column], errors="coerce").to_numpy(np.float64, na_value=np.nan)


def _chunks(events: Events, frame: pd.DataFrame) -> np.ndarray:
    """Model chunks per rank of each row's run: the run metadata's, else the largest chunk
    index seen + 1."""
    run = frame["run_id"].astype(str)
    seen = frame.groupby(run, observed=True)["chunk"].max() + 1
    per_run = {r: float(events.runs[r].chunks) if r in events.runs else float(seen[r])
               for r in seen.index}
    return run.map(per_run).to_numpy(np.float64)


def speed_table(rows: pd.DataFrame, nominal: np.ndarray, window: int = 1) -> pd.DataFrame:
    """Per (run, rank, step), in row order: ``observed_s`` and ``nominal_s`` summed over the
    rows whose ``nominal`` (seconds at speed 1) is finite, ``ratio`` (observed / nominal; NaN
    where nominal is not positive) and ``recent`` (the speed known before the step: the median
    of the ratios of the previous ``window`` steps that have one, else of all earlier steps,
    else 1), plus ``stage`` and ``replica``. ``group`` maps each row to its line of the
    table."""
    run = rows["run_id"].to_numpy()
    rank = rows["rank"].to_numpy()
    step = rows["step"].to_numpy()
    n = len(rows)
    change = np.ones(n, dtype=bool)
    if n > 1:
        change[1:] = (run[1:] != run[:-1]) | (rank[1:] != rank[:-1]) | (step[1:] != step[:-1])
    group = np.cumsum(change) - 1
    first = np.flatnonzero(change)
    ok = np.isfinite(nominal)
    observed = np.bincount(group, weights=np.where(ok, rows["duration_s"].to_numpy(), 0.0))
    predicted = np.bincount(group, weights=np.where(ok, nominal, 0.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(predicted > 0, observed / predicted, np.nan)
    starts = np.ones(len(first), dtype=bool)  # each (run, rank)'s first step
    starts[1:] = (run[first][1:] != run[first][:-1]) | (rank[first][1:] != rank[first][:-1])
    segment = np.cumsum(starts) - 1
    lagged = pd.Series(ratio).groupby(segment).shift(1)
    recent = lagged.groupby(segment).rolling(window, min_periods=1).median() \
        .reset_index(level=0, drop=True).sort_index().to_numpy(copy=True)
    seg_start = np.flatnonzero(starts)
    for i in np.flatnonzero(~np.isfinite(recent)):
        earlier = ratio[seg_start[segment[i]]:i]
        earlier = earlier[np.isfinite(earlier)]
        recent[i] = float(np.median(earlier)) if len(earlier) else 1.0
    table = pd.DataFrame({"run_id": run[first], "rank": rank[first], "step": step[first],
                          "stage": rows["stage"].to_numpy()[first],
                          "replica": rows["replica"].to_numpy()[first],
                          "observed_s": observed, "nominal_s": predicted, "ratio": ratio,
                          "recent": recent})
    table.attrs["group"] = group
    return table


def design(rows: pd.DataFrame, terms: tuple[str, ...]) -> np.ndarray:
    """``(n, len(terms))`` micro-batch statistics of ``rows`` for the cost ``terms``."""
    cols = []
    for term in terms:
        column = TERM_COLUMNS[term]
        cols.append(np.ones(len(rows)) if column is None else rows[column].to_numpy(np.float64))
    return np.column_stack(cols) if cols else np.zeros((len(rows), 0))
