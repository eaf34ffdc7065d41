"""The in-memory ``events`` table: a pandas frame plus per-run metadata.

``frame`` holds the SPEC §1 columns with compact dtypes (``run_id`` and ``op`` categorical,
integer columns at their SPEC widths); ``runs`` maps each run id to its :class:`RunMeta`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pandas as pd
from pandas.api.types import union_categoricals

from bubblecast.telemetry.schema import COMPUTE_OPS, RunMeta


@dataclass
class Events:
    """A validated events table and the metadata of the runs it holds."""

    frame: pd.DataFrame
    runs: dict[str, RunMeta] = field(default_factory=dict)

    @property
    def run_ids(self) -> list[str]:
        run_id = self.frame["run_id"]
        if isinstance(run_id.dtype, pd.CategoricalDtype):  # cheap: no per-row conversion
            present = run_id.cat.remove_unused_categories()
            codes = pd.unique(present.cat.codes.to_numpy())
            return [str(present.cat.categories[c]) for c in codes]
        return [str(r) for r in pd.unique(run_id.astype(str))]

    def __len__(self) -> int:
        return len(self.frame)

    def run(self, run_id: str) -> Events:
        """The events of one run."""
        mask = self.frame["run_id"] == run_id
        return Events(self.frame.loc[mask].reset_index(drop=True), {run_id: self.runs[run_id]})

    def by_run(self) -> Iterator[tuple[str, Events]]:
        """Yield ``(run_id, events)`` per run, in order of first appearance."""
        for run_id, part in self.frame.groupby("run_id", sort=False, observed=True):
            rid = str(run_id)
            yield rid, Events(part.reset_index(drop=True), {rid: self.runs[rid]})

    def compute(self) -> pd.DataFrame:
        """Rows of compute ops (F, B, W) only."""
        return self.frame.loc[self.frame["op"].isin(COMPUTE_OPS)]

    @staticmethod
    def concat(parts: list[Events]) -> Events:
        from bubblecast.telemetry.validate import normalize_frame

        runs: dict[str, RunMeta] = {}
        for part in parts:
            runs.update(part.runs)
        if not parts:
            return Events(normalize_frame(pd.DataFrame()), runs)
        if all(isinstance(p.frame["run_id"].dtype, pd.CategoricalDtype) for p in parts):
            # Join the categoricals' codes and categories; no Python string per row.
            run_id = union_categoricals([p.frame["run_id"].cat.remove_unused_categories()
                                         for p in parts], ignore_order=True,
                                         sort_categories=True)  # sorted, as astype gives
            frames = [p.frame.drop(columns="run_id") for p in parts]
            frame = pd.concat(frames, ignore_index=True)
            frame.insert(parts[0].frame.columns.get_loc("run_id"), "run_id", run_id)
        else:
            frames = [p.frame.assign(run_id=p.frame["run_id"].astype(str)) for p in parts]
            frame = pd.concat(frames, ignore_index=True)
        return Events(normalize_frame(frame), runs)
