"""The sequence model's training data streamed from a features dataset partitioned by run.

:meth:`SeqForecaster.fit` takes a features frame; on a fleet that frame (every row, ~140
columns) is what does not fit one process. :meth:`SeqForecaster.fit_partitioned` reads the
parts instead, in the dataset's row order (:func:`~bubblecast.dataset.store.partition_files`,
the order ``read_features`` concatenates them in), in two passes:

1. the split keys only (``run_id``, ``scenario``, the targets): the run-grouped
   train / validation / calibration split and the training-row sample are drawn exactly as
   ``fit`` draws them on the whole frame (same functions, same row positions, same seed);
2. each part's model columns: the chosen rows' sequences, raw static inputs, targets and
   calibration groups, appended per split. The standardisation is then fitted on the
   training rows, as ``fit`` does.

Memory holds the split keys of every row plus the model's inputs of the chosen rows (at most
``max_train_rows`` training rows), never the features frame. The model still trains in one
process (``train --cluster`` refuses ``seq``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bubblecast.errors import BubblecastError


def _read(part: Path, columns: list[str]) -> pd.DataFrame:
    """Some columns of one part (page checksums verified; one line naming it if corrupt)."""
    from bubblecast.dataset.store import _read_table

    return _read_table(part, columns).to_pandas()


def _parts(path: str | os.PathLike[str], runs: list[str] | None) -> tuple[list[Path], Any]:
    """The parts of ``runs`` (all when None) in the dataset's row order, and its metadata."""
    from bubblecast.dataset.store import partition_files, read_features_meta
    from bubblecast.telemetry.fleet import run_id_of

    if not Path(path).is_dir():
        raise BubblecastError(f"{path}: streaming needs a features dataset partitioned by run "
                              "(`bubblecast dataset ... --out DIR/`)")
    meta = read_features_meta(path)
    files = partition_files(path, meta)
    if runs is not None:
        wanted = set(runs)
        files = [f for f in files if run_id_of(f.parent) in wanted]
    if not files:
        raise BubblecastError(f"{path}: no parts to train on")
    return files, meta


def stream_fit_data(model: Any, path: str | os.PathLike[str],
                    runs: list[str] | None = None
                    ) -> tuple[dict[str, tuple[np.ndarray, ...]], np.random.Generator,
                               np.ndarray]:
    """``(data, rng, calibration groups)`` for ``SeqForecaster._fit_arrays`` (``model``, a
    :class:`~bubblecast.forecast.seq.SeqForecaster`, not imported here: seq imports this):
    the arrays ``fit`` would build on the frame of ``runs``' rows, read part by part."""
    import pyarrow.parquet as pq

    from bubblecast.forecast.base import ANCHORS
    from bubblecast.forecast.conformal import calibration_groups

    files, meta = _parts(path, runs)
    names = pq.read_schema(files[0]).names
    header = pd.DataFrame(columns=names)
    header.attrs["bubblecast_features"] = meta.to_json()
    model._prepare(header)
    targets = [f"y_h{h}" for h in model.horizons_]
    keys = [c for c in ("run_id", "scenario") if c in names] + targets
    index = [_read(f, keys) for f in files]  # pass 1: the split keys of every row
    sizes = np.cumsum([0] + [len(k) for k in index])
    frame_keys = pd.concat(index, ignore_index=True)
    del index
    rows, rng = model._split_rows(frame_keys)
    del frame_keys
    wanted = {*model.features_, ANCHORS[model.anchor], *targets, "f_tokens_ratio"}
    columns = [c for c in names if c in wanted]
    pieces: dict[str, list[tuple[np.ndarray, ...]]] = {k: [] for k in ("train", "val", "cal")}
    for i, part in enumerate(files):  # pass 2: the chosen rows' inputs
        lo, hi = sizes[i], sizes[i + 1]
        chosen = {k: r[(r >= lo) & (r < hi)] - lo for k, r in rows.items()}
        if not any(len(c) for c in chosen.values()):
            continue
        frame = _read(part, columns)
        for k, piece in pieces.items():
            sub = frame.iloc[chosen[k]]
            seq, static = model._raw_arrays(sub)
            piece.append((seq, static, model._targets(sub), calibration_groups(sub)))
    data = {}
    for k in ("train", "val", "cal"):  # train first: it fixes the standardisation
        seq, static, target, _ = (np.concatenate(a) for a in zip(*pieces[k], strict=True))
        data[k] = (*model._standardised(seq, static), target)
    groups = np.concatenate([p[3] for p in pieces["cal"]])
    return data, rng, groups


__all__ = ["stream_fit_data"]
