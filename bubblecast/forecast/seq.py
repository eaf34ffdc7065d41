"""Torch sequence forecaster: a GRU over the last K steps of the stage and its peers.

Input per row: a ``(K, 2)`` sequence of log-ratios of the stage's own values and of the peer
median to the row's anchor (oldest first, from the ``f_u_lag*`` and ``f_u_peer_lag*``
columns), plus the other features as a standardised vector (missing values as 0 with an
indicator). A multi-horizon head outputs p10/p50/p90 of ``log(y_h / anchor)`` for every
horizon at once (p10 <= p50 <= p90 by construction), trained with the pinball loss on a
run-grouped split with early stopping; p10/p90 are then conformally calibrated, by volatility
regime (:func:`~bubblecast.forecast.conformal.regime_shifts`), on a third set of runs used
neither for fitting nor for early stopping. Deterministic for a seed on CPU; uses CUDA when
present. Saved as a ``state_dict`` of tensors (loaded with ``weights_only=True``) plus JSON.

:meth:`SeqForecaster.fit` takes a features frame; on a fleet that frame (every row, ~140
columns) is what does not fit one process, so :meth:`SeqForecaster.fit_partitioned` streams
a features dataset partitioned by run instead (the same fit, part by part).
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from bubblecast.errors import BubblecastError
from bubblecast.forecast.base import (
    ANCHORS,
    QUANTILES,
    Forecaster,
    dataset_config_of,
    fit_splits,
    frame_horizons,
    level_of,
    log_target,
    relative_inputs,
)
from bubblecast.forecast.conformal import (
    apply_grouped,
    frame_regimes,
    regime_shifts,
    regime_window,
    row_groups,
)

_LAG = re.compile(r"^f_u_(peer_)?lag(\d+)$")
WEIGHTS_FILE = "seq_weights.pt"


def _net(channels: int, n_static: int, hidden: int, horizons: int) -> Any:
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gru = nn.GRU(channels, hidden, batch_first=True)
            self.static = nn.Sequential(nn.Linear(n_static, hidden), nn.ReLU())
            self.head = nn.Sequential(nn.Linear(2 * hidden, 2 * hidden), nn.ReLU(),
                                      nn.Linear(2 * hidden, horizons * 3))

        def forward(self, seq: torch.Tensor, static: torch.Tensor) -> torch.Tensor:
            _, h = self.gru(seq)
            z = self.head(torch.cat([h[-1], self.static(static)], dim=1)).view(-1, horizons, 3)
            mid = z[..., 1]
            lo = mid - nn.functional.softplus(z[..., 0])
            hi = mid + nn.functional.softplus(z[..., 2])
            return torch.stack([lo, mid, hi], dim=-1)

    return Net()


def _read(part: Path, columns: list[str]) -> pd.DataFrame:
    """Some columns of one features part (page checksums verified; one line naming it if
    corrupt)."""
    from bubblecast.dataset.store import read_features_table

    return read_features_table(part, columns).to_pandas()


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


def _pinball(pred: Any, target: Any) -> Any:
    """Mean pinball loss over quantiles and the known targets (NaN targets are masked)."""
    import torch

    taus = torch.tensor(QUANTILES, dtype=pred.dtype, device=pred.device)
    mask = torch.isfinite(target)
    t = torch.where(mask, target, torch.zeros_like(target)).unsqueeze(-1)
    d = t - pred
    loss = torch.maximum(taus * d, (taus - 1.0) * d).mean(dim=-1)
    return (loss * mask).sum() / mask.sum().clamp(min=1)


class SeqForecaster(Forecaster):
    """GRU sequence model with a multi-horizon quantile head."""

    kind: ClassVar[str] = "seq"

    def __init__(self, hidden: int = 32, epochs: int = 30, batch_size: int = 512,
                 learning_rate: float = 3e-3, patience: int = 4, val_fraction: float = 0.2,
                 cal_fraction: float = 0.3, coverage: float = 0.8,
                 max_train_rows: int | None = 200_000, anchor: str = "level", seed: int = 0,
                 device: str = "auto", n_jobs: int = 1) -> None:
        self.hidden = hidden
        self.epochs = epochs
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.patience = patience
        self.val_fraction = val_fraction
        self.cal_fraction = cal_fraction
        self.coverage = coverage
        self.max_train_rows = max_train_rows
        self.anchor = anchor
        self.seed = seed
        self.device = device
        self.n_jobs = n_jobs

    # -- inputs ---------------------------------------------------------------------------
    def _columns(self, columns: pd.Index) -> None:
        lags = sorted((int(m.group(2)) for c in columns if (m := _LAG.match(c)) and not
                       m.group(1)), reverse=True)
        peers = {int(m.group(2)) for c in columns if (m := _LAG.match(c)) and m.group(1)}
        if not lags:
            raise BubblecastError("features frame: no 'f_u_lag<k>' columns for the sequence model")
        self.seq_lags_ = lags
        self.peer_lags_ = all(k in peers for k in lags)
        self.static_ = [c for c in columns if c.startswith("f_") and not _LAG.match(c)]
        self.static_ += [c for h in self.horizons_ for c in columns if c.startswith(f"x{h}_")]

    def _arrays(self, frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        return self._standardised(*self._raw_arrays(frame))

    def _raw_arrays(self, frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """The rows' sequences and their static inputs before standardisation (row-wise:
        rows may come part by part, :meth:`fit_partitioned`)."""
        seq_cols = [f"f_u_lag{k}" for k in self.seq_lags_]
        seq = [relative_inputs(frame, seq_cols, log=True, anchor=self.anchor)]
        if self.peer_lags_:
            peer_cols = [f"f_u_peer_lag{k}" for k in self.seq_lags_]
            seq.append(relative_inputs(frame, peer_cols, log=True, anchor=self.anchor))
        seq_arr = np.nan_to_num(np.stack(seq, axis=-1), nan=0.0)
        return seq_arr, relative_inputs(frame, self.static_, log=True, anchor=self.anchor)

    def _standardised(self, seq_arr: np.ndarray, static: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray]:
        """Standardised static inputs (the first call, on the training rows, fixes the
        scaling) with missing-value indicators; both as float32."""
        if not hasattr(self, "mean_"):
            with warnings.catch_warnings():  # all-NaN columns (e.g. no tokens) are fine
                warnings.simplefilter("ignore", RuntimeWarning)
                self.mean_ = np.nan_to_num(np.nanmean(static, axis=0)).astype(np.float32)
                std = np.nan_to_num(np.nanstd(static, axis=0))
            self.std_ = np.where(std > 1e-8, std, 1.0).astype(np.float32)
            self.missing_ = [j for j in range(static.shape[1]) if np.isnan(static[:, j]).any()]
        missing = np.isnan(static[:, self.missing_]).astype(np.float32)
        z = np.clip((static - self.mean_) / self.std_, -10.0, 10.0)
        static_arr = np.concatenate([np.nan_to_num(z, nan=0.0), missing], axis=1)
        return seq_arr.astype(np.float32), static_arr.astype(np.float32)

    def _targets(self, frame: pd.DataFrame) -> np.ndarray:
        return np.column_stack([log_target(frame, h, self.anchor)
                                for h in self.horizons_]).astype(np.float32)

    # -- training -------------------------------------------------------------------------
    def _device(self) -> str:
        import torch

        if self.device == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        return self.device

    def _prepare(self, frame: pd.DataFrame) -> None:
        """Forget an earlier fit's scaling; horizons, dataset config and input columns of
        ``frame`` (its rows may be none: only columns and attrs are read)."""
        for attr in ("mean_", "std_", "missing_"):
            if hasattr(self, attr):
                delattr(self, attr)
        self.horizons_ = frame_horizons(frame)
        self.dataset_config_ = dataset_config_of(frame)
        self._columns(frame.columns)

    def _split_rows(self, frame: pd.DataFrame) -> tuple[dict[str, np.ndarray],
                                                         np.random.Generator]:
        """Row positions of ``train`` (sampled to ``max_train_rows``), ``val`` and ``cal``
        with a known target; ``frame`` needs ``run_id``, ``scenario`` and the targets only."""
        masks = fit_splits(frame, self.val_fraction, self.cal_fraction, self.seed)
        rng = np.random.default_rng(self.seed)
        known = np.isfinite(np.column_stack([frame[f"y_h{h}"].to_numpy(dtype=float)
                                             for h in self.horizons_])).any(axis=1)
        rows = {k: np.flatnonzero(m & known) for k, m in masks.items()}
        if self.max_train_rows and len(rows["train"]) > self.max_train_rows:
            rows["train"] = np.sort(rng.choice(rows["train"], self.max_train_rows, replace=False))
        return rows, rng

    def fit(self, frame: pd.DataFrame) -> SeqForecaster:
        self._prepare(frame)
        rows, rng = self._split_rows(frame)
        data = {}
        for k in ("train", "val", "cal"):
            part = frame.iloc[rows[k]]
            seq, static = self._arrays(part)  # train first: it sets the standardisation
            data[k] = (seq, static, self._targets(part))
        window = regime_window(frame.columns)
        regimes = frame_regimes(frame.iloc[rows["cal"]], window)
        return self._fit_arrays(data, rng, regimes, window)

    def fit_partitioned(self, path: str | os.PathLike[str],
                        runs: list[str] | None = None) -> SeqForecaster:
        """:meth:`fit` on a features dataset partitioned by run (of ``runs`` only, when
        given), streamed part by part in the dataset's row order
        (:func:`~bubblecast.dataset.store.partition_files`, the order ``read_features``
        concatenates them in); the same fit as ``fit`` on those runs' rows. Two passes:

        1. the split keys only (``run_id``, ``scenario``, the targets): the run-grouped
           train / validation / calibration split and the training-row sample are drawn
           exactly as ``fit`` draws them on the whole frame (same functions, same row
           positions, same seed);
        2. each part's model columns: the chosen rows' sequences, raw static inputs, targets
           and volatility regimes, appended per split. The standardisation is then fitted on
           the training rows, as ``fit`` does.

        Memory holds the split keys of every row plus the model's inputs of the chosen rows
        (at most ``max_train_rows`` training rows), never the features frame. The model still
        trains in one process (``train --cluster`` refuses ``seq``)."""
        data, rng, regimes, window = self._streamed_arrays(path, runs)
        return self._fit_arrays(data, rng, regimes, window)

    def _streamed_arrays(self, path: str | os.PathLike[str], runs: list[str] | None
                         ) -> tuple[dict[str, tuple[np.ndarray, ...]], np.random.Generator,
                                    np.ndarray, int | None]:
        """``(data, rng, calibration regimes, their window)`` for :meth:`_fit_arrays`: the
        arrays ``fit`` would build on the frame of ``runs``' rows, read part by part."""
        from bubblecast.dataset.store import features_part_schema

        files, meta = _parts(path, runs)
        names = features_part_schema(files[0]).names  # run_id included, as parts are read
        header = pd.DataFrame(columns=names)
        header.attrs["bubblecast_features"] = meta.to_json()
        self._prepare(header)
        targets = [f"y_h{h}" for h in self.horizons_]
        keys = [c for c in ("run_id", "scenario") if c in names] + targets
        index = [_read(f, keys) for f in files]  # pass 1: the split keys of every row
        sizes = np.cumsum([0] + [len(k) for k in index])
        frame_keys = pd.concat(index, ignore_index=True)
        del index
        rows, rng = self._split_rows(frame_keys)
        del frame_keys
        window = regime_window(names)
        wanted = {*self.features_, ANCHORS[self.anchor], *targets, f"f_u_std_w{window}",
                  "level"}
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
                seq, static = self._raw_arrays(sub)
                piece.append((seq, static, self._targets(sub), frame_regimes(sub, window)))
        data = {}
        for k in ("train", "val", "cal"):  # train first: it fixes the standardisation
            seq, static, target, _ = (np.concatenate(a) for a in zip(*pieces[k], strict=True))
            data[k] = (*self._standardised(seq, static), target)
        regimes = np.concatenate([p[3] for p in pieces["cal"]])
        return data, rng, regimes, window

    def _fit_arrays(self, data: dict[str, tuple[np.ndarray, ...]], rng: np.random.Generator,
                    cal_regimes: np.ndarray, window: int | None) -> SeqForecaster:
        """Train on the ``train``/``val`` arrays; calibrate on ``cal``'s, by the volatility
        regimes ``cal_regimes`` of its rows (read with ``window``)."""
        import torch

        threads = torch.get_num_threads()
        deterministic = torch.are_deterministic_algorithms_enabled()
        torch.set_num_threads(max(1, self.n_jobs))
        try:
            self._train(data, rng)
        finally:
            torch.set_num_threads(threads)
            torch.use_deterministic_algorithms(deterministic)
        lo_hi = self._raw(data["cal"][0], data["cal"][1])
        cal = np.sort(lo_hi, axis=2)
        self.shifts_ = {h: regime_shifts(cal[:, j, 0], cal[:, j, 2], data["cal"][2][:, j],
                                         cal_regimes, self.coverage, window=window)
                        for j, h in enumerate(self.horizons_)}
        self.calibration_ = "interval"
        return self

    @property
    def calibration(self) -> str:
        """How ``shifts_`` apply: ``interval`` (fitted now) or ``shift`` (models saved before)."""
        return str(getattr(self, "calibration_", "shift"))

    def _train(self, data: dict[str, tuple[np.ndarray, ...]], rng: np.random.Generator) -> None:
        import torch

        torch.manual_seed(self.seed)
        device = self._device()
        if device == "cpu":
            torch.use_deterministic_algorithms(True)
        else:
            torch.backends.cudnn.deterministic = True
            torch.backends.cudnn.benchmark = False
        seq, static, target = (torch.from_numpy(a).to(device) for a in data["train"])
        vseq, vstatic, vtarget = (torch.from_numpy(a).to(device) for a in data["val"])
        self.n_channels_, self.n_static_ = int(seq.shape[2]), int(static.shape[1])
        net = _net(self.n_channels_, self.n_static_, self.hidden, len(self.horizons_)).to(device)
        opt = torch.optim.Adam(net.parameters(), lr=self.learning_rate)
        # Halve the step size as soon as the validation loss stalls; stop after `patience`.
        sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0)
        best, best_state, stale = np.inf, None, 0
        self.history_: list[float] = []
        n = len(seq)
        for _epoch in range(self.epochs):
            net.train()
            for idx in np.array_split(rng.permutation(n), max(1, n // self.batch_size)):
                i = torch.from_numpy(idx).to(device)
                opt.zero_grad()
                loss = _pinball(net(seq[i], static[i]), target[i])
                loss.backward()
                torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
                opt.step()
            net.eval()
            with torch.no_grad():
                val = float(_pinball(self._forward(net, vseq, vstatic), vtarget))
            self.history_.append(val)
            sched.step(val)
            if val < best - 1e-6:
                best, stale = val, 0
                best_state = {k: v.detach().cpu().clone() for k, v in net.state_dict().items()}
            else:
                stale += 1
                if stale >= self.patience:
                    break
        net.load_state_dict(best_state)
        self.net_ = net.cpu().eval()
        self.best_val_ = float(best)

    @staticmethod
    def _forward(net: Any, seq: Any, static: Any, batch: int = 8192) -> Any:
        import torch

        return torch.cat([net(seq[i:i + batch], static[i:i + batch])
                          for i in range(0, len(seq), batch)]) if len(seq) else \
            torch.zeros((0, 1, 3))

    def _raw(self, seq: np.ndarray, static: np.ndarray) -> np.ndarray:
        import torch

        with torch.no_grad():
            out = self._forward(self.net_, torch.from_numpy(seq), torch.from_numpy(static))
        return out.numpy().astype(np.float64).reshape(len(seq), len(self.horizons_), 3)

    def predict_signal(self, frame: pd.DataFrame, horizons: list[int]) -> dict[int, np.ndarray]:
        seq, static = self._arrays(frame)
        raw = self._raw(seq, static)
        level = level_of(frame, self.anchor)
        out = {}
        for h in horizons:
            j = self.horizons_.index(h)
            z = apply_grouped(np.sort(raw[:, j, :], axis=1), self.shifts_[h],
                              row_groups(self.shifts_[h], frame), self.calibration)
            out[h] = level[:, None] * np.exp(z)
        return out

    # -- persistence ----------------------------------------------------------------------
    def save_native(self, directory: str) -> list[str]:
        import torch

        torch.save({k: v.detach().cpu() for k, v in self.net_.state_dict().items()},
                   os.path.join(directory, WEIGHTS_FILE))
        return [WEIGHTS_FILE]

    def state(self) -> dict[str, Any]:
        return {"horizons_": list(self.horizons_), "seq_lags_": self.seq_lags_,
                "peer_lags_": self.peer_lags_, "static_": self.static_,
                "mean_": self.mean_.tolist(), "std_": self.std_.tolist(),
                "missing_": self.missing_, "n_channels_": self.n_channels_,
                "n_static_": self.n_static_, "best_val_": self.best_val_,
                "shifts_": {str(h): {g: list(v) for g, v in s.items()}
                            for h, s in self.shifts_.items()},
                "calibration_": self.calibration}

    @property
    def features_(self) -> list[str]:
        lags = [f"f_u_lag{k}" for k in self.seq_lags_]
        peers = [f"f_u_peer_lag{k}" for k in self.seq_lags_] if self.peer_lags_ else []
        return lags + peers + self.static_

    def load_state(self, state: dict[str, Any], directory: str) -> SeqForecaster:
        import torch

        super().load_state(state, directory)
        self.seq_lags_ = [int(k) for k in state["seq_lags_"]]
        self.peer_lags_ = bool(state["peer_lags_"])
        self.static_ = list(state["static_"])
        self.mean_ = np.asarray(state["mean_"], dtype=np.float32)
        self.std_ = np.asarray(state["std_"], dtype=np.float32)
        self.missing_ = [int(j) for j in state["missing_"]]
        self.n_channels_, self.n_static_ = int(state["n_channels_"]), int(state["n_static_"])
        self.best_val_ = float(state.get("best_val_", np.nan))
        self.shifts_ = {int(h): {g: tuple(float(x) for x in v) for g, v in s.items()}
                        for h, s in state["shifts_"].items()}
        self.calibration_ = str(state.get("calibration_", "shift"))  # older models: shifts
        net = _net(self.n_channels_, self.n_static_, self.hidden, len(self.horizons_))
        weights = torch.load(os.path.join(directory, WEIGHTS_FILE), map_location="cpu",
                             weights_only=True)
        net.load_state_dict(weights)
        self.net_ = net.eval()
        return self
