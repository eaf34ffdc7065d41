"""The SPEC §1 row rules, as one table that every events writer applies.

Both :mod:`bubblecast.telemetry.validate` (any frame: files read, frames built, the
DataFrame write path) and :mod:`bubblecast.telemetry.fastwrite` (the recorder's arrays)
check rows here, in the same order and with the same messages, so a bad row is refused the
same way whichever path it takes:

1. :data:`ROW_RULES`, in table order: one :class:`RowRule` per (column, condition), each a
   vectorised predicate over the column's values and the problem it reports;
2. :data:`RANGE_RULES`: a column below its run's metadata count (:func:`out_of_range`);
3. unique compute ops on :data:`~bubblecast.telemetry.schema.UNIQUE_KEY`
   (:func:`first_duplicate`, :func:`duplicate_problem`).

A rule sees a column as numpy values plus an optional null mask (nullable optional columns;
values under the mask are ignored). A float optional column's NaN is a null, as pandas
holds it. Each rule first makes a cheap whole-column test (a sum, a min) and only looks
for the offending row when that fails, so a valid column costs one pass. The callers turn
a :class:`Violation` into their error (:class:`~bubblecast.telemetry.validate.SchemaError`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from bubblecast.telemetry.schema import MINIMUM, UNIQUE_KEY

#: A column as a rule sees it: its values and the rows that are null (None: none is).
Column = tuple[np.ndarray, "np.ndarray | None"]


@dataclass(frozen=True)
class Violation:
    """The first row that breaks a rule: its column, its row index and the problem."""

    column: str
    row: int
    problem: str


def first(mask: np.ndarray) -> int | None:
    """The index of the first True in ``mask``, None when there is none."""
    idx = np.flatnonzero(mask)
    return int(idx[0]) if idx.size else None


@dataclass(frozen=True)
class RowRule:
    """One SPEC row rule: ``bad(values)`` is True where a row breaks it; ``suspect(values)``
    is a cheap test that is False only when no row can (None: always look); ``problem`` is
    the message, ``{value}`` standing for the offending value."""

    column: str
    problem: str
    bad: Callable[[np.ndarray], np.ndarray]
    suspect: Callable[[np.ndarray], bool] | None = None

    def check(self, values: np.ndarray, null: np.ndarray | None = None) -> Violation | None:
        """The first row of ``values`` (not under ``null``) that breaks the rule."""
        if not values.size or (self.suspect is not None and not self.suspect(values)):
            return None
        bad = self.bad(values)
        if null is not None:
            bad = bad & ~null
        row = first(bad)
        if row is None:
            return None
        return Violation(self.column, row, self.problem.format(value=values[row]))


def _finite(column: str) -> RowRule:
    """A required float column: every value finite (NaN or inf anywhere makes the sum so)."""
    return RowRule(column, "value {value} is not finite", lambda v: ~np.isfinite(v),
                   lambda v: not np.isfinite(v.sum()))


def _no_inf(column: str) -> RowRule:
    """A nullable float column (NaN is a null): no infinite value."""
    return RowRule(column, "value {value} is not finite", np.isinf,
                   lambda v: bool(np.isinf(v).any()))


def _at_least(column: str, low: int) -> RowRule:
    """Every value >= ``low`` (a NaN, a null, passes)."""
    return RowRule(column, f"value {{value}} is below {low}", lambda v: v < low,
                   lambda v: bool(np.fmin.reduce(v) < low))


#: The row rules, in the order both writers check them.
ROW_RULES: tuple[RowRule, ...] = (
    _finite("start_s"),
    _finite("duration_s"),
    RowRule("duration_s", "negative duration {value}", lambda v: v < 0,
            lambda v: bool(v.min() < 0)),
    *(_at_least(col, low) for col, low in MINIMUM.items()),
    _at_least("layers", 0),
    _at_least("tokens", 0),
    _no_inf("tokens_sq"),
    _at_least("tokens_sq", 0),
    _at_least("documents", 0),
)

#: Columns bounded by their run's metadata: (column, RunMeta attribute), in check order.
RANGE_RULES: tuple[tuple[str, str], ...] = (
    ("stage", "stages"), ("microbatch", "microbatches"), ("chunk", "chunks"),
    ("replica", "replicas"),
)


def check_row_rules(column: Callable[[str], Column | None]) -> Violation | None:
    """The first violation of :data:`ROW_RULES`; ``column(name)`` gives a column's values and
    null mask, or None when the table has no such column."""
    for rule in ROW_RULES:
        got = column(rule.column)
        if got is not None:
            found = rule.check(*got)
            if found is not None:
                return found
    return None


def out_of_range(column: str, attr: str, values: np.ndarray, limit: int | np.ndarray,
                 run: Callable[[int], str]) -> Violation | None:
    """The first row whose value is not below ``limit`` (its run's ``attr``: one number, or
    one per row); ``run(row)`` names that row's run."""
    if not values.size or values.max() < np.min(limit):
        return None  # below every run's limit: no per-row limits needed
    row = first(values >= limit)
    if row is None:
        return None
    at = limit if np.ndim(limit) == 0 else limit[row]  # type: ignore[index]
    return Violation(column, row, f"value {values[row]} out of range for run '{run(row)}' "
                                  f"({attr}={at})")


def duplicate_problem(key: Mapping[str, object]) -> str:
    """The message for a duplicate compute op with these :data:`UNIQUE_KEY` values."""
    return "duplicate compute op (" + ", ".join(f"{c}={key[c]}" for c in UNIQUE_KEY) + ")"


def pack_keys(keys: Sequence[np.ndarray]) -> np.ndarray | None:
    """Integer key columns packed into one int64 from 0 up (a mixed-radix number over each
    key's value range; constant keys add nothing), or None when that needs over 63 bits."""
    kept, lows, spans = [], [], []
    for values in keys:
        low, high = (int(values.min()), int(values.max())) if values.size else (0, 0)
        if high > low:
            kept.append(values)
            lows.append(low)
            spans.append(high - low + 1)
    if sum(int(s - 1).bit_length() for s in spans) > 63:
        return None
    packed = np.zeros(len(keys[0]) if keys else 0, dtype=np.int64)
    offset = 0
    for k, low, span in zip(kept, lows, spans, strict=True):
        packed *= span  # in place: no temporary per key
        packed += k
        offset = offset * span + low
    packed -= offset
    return packed


def first_duplicate(keys: Sequence[np.ndarray]) -> int | None:
    """The first position whose key (one value per array of ``keys``) an earlier position
    already has: the later of two equal rows is the duplicate; None when keys are unique."""
    n = len(keys[0]) if keys else 0
    if n < 2:
        return None
    packed = pack_keys(keys)
    if packed is not None and int(packed.max(initial=0)) < 4 * n + 4096:
        # a dense key space (always, for simulated and recorded runs): count, O(n), no sort
        counts = np.bincount(packed)
        if counts.max() < 2:
            return None
        cand = np.flatnonzero(counts[packed] > 1)
        _, firsts = np.unique(packed[cand], return_index=True)
        dup = np.setdiff1d(cand, cand[firsts])
        return int(dup.min()) if dup.size else None
    if packed is not None:
        order = np.argsort(packed, kind="stable")
        same = packed[order][1:] == packed[order][:-1]
    else:
        order = np.lexsort(list(keys)[::-1])  # stable: equal rows keep their order
        ordered = np.stack([k[order] for k in keys])
        same = np.all(ordered[:, 1:] == ordered[:, :-1], axis=0)
    return int(order[1:][same].min()) if same.any() else None


__all__ = ["RANGE_RULES", "ROW_RULES", "Column", "RowRule", "Violation", "check_row_rules",
           "duplicate_problem", "first", "first_duplicate", "out_of_range", "pack_keys"]
