"""LightGBM ``predict_matrix`` for a request's few rows, without the Python wrapper's overhead.

``LGBMForecaster.predict_matrix`` makes one ``Booster.predict`` per (horizon, quantile): about
25 µs each for a handful of rows, most of it the wrapper (a fresh predictor object, parameter
string, size queries) rather than the trees. A forecast request has one row per stage, so
:class:`RowPredictor` scores each row with LightGBM's single-row C entry point
(``LGBM_BoosterPredictForMatSingleRowFast``, set up once per booster with ``num_threads=1``:
about 2 µs a row) and does the per-horizon arithmetic of ``predict_matrix`` (input scaling,
sort, conformal shifts, ``exp``) for all horizons at once. Every step is the same elementwise
operation on the same float32 inputs, so the results are bit-identical; :meth:`RowPredictor.wrap`
checks that on probe matrices against the forecaster's own ``predict_matrix`` and declines
(None) otherwise, and larger batches go to ``predict_matrix`` itself.
"""

from __future__ import annotations

import ctypes
import logging
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from bubblecast.errors import BubblecastError

log = logging.getLogger("bubblecast.serve")

#: Above this many rows one ``Booster.predict`` per booster is as cheap: use ``predict_matrix``.
MAX_ROWS = 64
_C_API_DTYPE_FLOAT32 = 0
_C_API_PREDICT_NORMAL = 0

_lib_fns: tuple[Any, Any, Any, Any] | None = None


def _c_api() -> tuple[Any, Any, Any, Any]:
    """Private ctypes prototypes of the four LightGBM C functions used here (lightgbm's own
    function objects are left untouched)."""
    global _lib_fns
    if _lib_fns is None:
        from lightgbm.basic import _LIB

        vp, ci = ctypes.c_void_p, ctypes.c_int
        init = ctypes.CFUNCTYPE(ci, vp, ci, ci, ci, ci, ctypes.c_int32, ctypes.c_char_p, vp)(
            ("LGBM_BoosterPredictForMatSingleRowFastInit", _LIB))
        row = ctypes.CFUNCTYPE(ci, vp, vp, vp, vp)(
            ("LGBM_BoosterPredictForMatSingleRowFast", _LIB))
        free = ctypes.CFUNCTYPE(ci, vp)(("LGBM_FastConfigFree", _LIB))
        error = ctypes.CFUNCTYPE(ctypes.c_char_p)(("LGBM_GetLastError", _LIB))
        _lib_fns = (init, row, free, error)
    return _lib_fns


def _free_all(handles: list[int], boosters: list[Any]) -> None:
    """Release the fast configs; ``boosters`` is only held so they outlive their configs."""
    free = _c_api()[2]
    for h in handles:
        free(h)
    handles.clear()
    boosters.clear()


class RowPredictor:
    """``forecaster.predict_matrix`` for up to :data:`MAX_ROWS` rows via the single-row API.

    Built by :meth:`wrap`, which returns None for anything that is not a fitted
    ``LGBMForecaster`` or does not reproduce its ``predict_matrix`` exactly.
    """

    def __init__(self, forecaster: Any) -> None:
        from bubblecast.dataset.features import is_scaled
        from bubblecast.forecast.base import QUANTILES

        self.forecaster = forecaster
        self.quantiles = tuple(QUANTILES)
        feats, hfeats = list(forecaster.features_), list(forecaster.horizon_features_)
        self.nf, self.nh = len(feats), len(hfeats)
        self.width = self.nf + self.nh
        self._scaled = {h: np.array([is_scaled(c) for c in
                                     feats + [f"x{h}_{g[2:]}" for g in hfeats]])
                        for h in forecaster.shifts_}
        self._shifts = {h: s for h, s in forecaster.shifts_.items()}
        self._plans: dict[tuple[int, ...], tuple[np.ndarray, ...]] = {}
        init, self._row, _, self._error = _c_api()
        handles: list[int] = []
        boosters: list[Any] = []
        self._finalizer = weakref.finalize(self, _free_all, handles, boosters)
        self._fast: dict[tuple[int, float], int] = {}
        params = b"num_threads=1"
        for (h, q), booster in forecaster.boosters_.items():
            num_iteration = int(booster.best_iteration or 0) or -1
            out = ctypes.c_void_p()
            rc = init(booster._handle, _C_API_PREDICT_NORMAL, 0, num_iteration,
                      _C_API_DTYPE_FLOAT32, self.width, params, ctypes.addressof(out))
            if rc != 0:
                raise BubblecastError(f"lightgbm: {self._error().decode(errors='replace')}")
            handles.append(out.value)  # type: ignore[arg-type]
            boosters.append(booster)
            self._fast[(int(h), float(q))] = out.value  # type: ignore[assignment]

    @classmethod
    def wrap(cls, forecaster: Any) -> RowPredictor | None:
        """A RowPredictor for a fitted ``LGBMForecaster`` whose probe forecasts it reproduces
        bit for bit; None otherwise (the caller keeps ``predict_matrix``)."""
        try:
            from bubblecast.forecast.lgbm import LGBMForecaster

            if not isinstance(forecaster, LGBMForecaster) or not getattr(
                    forecaster, "boosters_", None):
                return None
            rp = cls(forecaster)
            if rp.agrees():
                return rp
            log.info("single-row LightGBM path differs from predict_matrix; not used")
        except Exception as exc:  # noqa: BLE001 - any failure means: keep predict_matrix
            log.info("single-row LightGBM path unavailable: %s: %s", type(exc).__name__, exc)
        return None

    def agrees(self, seed: int = 0) -> bool:
        """Bit-equal to ``predict_matrix`` on random probe matrices (NaNs, both conformal
        groups, every horizon order tried here)?"""
        rng = np.random.default_rng(seed)
        hz = [int(h) for h in self.forecaster.horizons_]
        for n, order in ((1, hz), (3, hz[::-1]), (7, hz[:1]), (MAX_ROWS, hz)):
            X = np.exp(rng.normal(0.0, 1.0, (n, self.nf + self.nh * len(order) + 2)))
            X[rng.random(X.shape) < 0.05] = np.nan
            X[:, -2] = np.abs(X[:, -2]) + 0.1
            X[rng.random(n) < 0.5, -1] = np.nan
            want = self.forecaster.predict_matrix(X, order)
            if not np.array_equal(self.predict_matrix(X, order), want, equal_nan=True):
                return False
        return True

    def _plan(self, hz: tuple[int, ...]) -> tuple[np.ndarray, ...]:
        """Per requested horizons: input columns ``(H * width,)``, which are scaled, the
        conformal shifts ``(H, 2)`` low and high per group; cached."""
        plan = self._plans.get(hz)
        if plan is None:
            nf, nh = self.nf, self.nh
            cols = np.concatenate([np.r_[np.arange(nf), nf + i * nh + np.arange(nh)]
                                   for i in range(len(hz))]).astype(np.intp)
            scaled = np.concatenate([self._scaled[h] for h in hz])
            # groups are 0/1 (known-ahead tokens or not); a group without its own shifts
            # takes the pooled ones, as apply_grouped does
            pick = [[self._shifts[h].get(str(g), self._shifts[h]["all"]) for g in (0, 1)]
                    for h in hz]
            lo = np.array([[s[0] for s in row] for row in pick])
            hi = np.array([[s[1] for s in row] for row in pick])
            plan = self._plans[hz] = (cols, scaled, lo, hi)
        return plan

    def predict_matrix(self, X: np.ndarray, horizons: Sequence[int]) -> np.ndarray:
        """``(n, H, 3)``: what ``forecaster.predict_matrix(X, horizons)`` returns."""
        hz = tuple(int(h) for h in horizons)
        X = np.asarray(X, dtype=np.float64)
        n = X.shape[0] if X.ndim == 2 else 0
        if (n == 0 or n > MAX_ROWS or any(h not in self._scaled for h in hz)
                or X.shape[1] != self.nf + self.nh * len(hz) + 2):
            return self.forecaster.predict_matrix(X, list(hz))  # its checks and errors
        cols, scaled, lo, hi = self._plan(hz)
        nh_ = len(hz)
        anchor = X[:, -2]
        level = np.where(np.isfinite(anchor), np.maximum(anchor, 1e-12), np.nan)
        groups = np.isfinite(X[:, -1]).astype(np.int64)
        values = X[:, cols]
        values = np.where(scaled, values / level[:, None], values)
        # (H, n, width) float32, C order: one contiguous input row per (horizon, row)
        rows = np.ascontiguousarray(values.reshape(n, nh_, self.width).transpose(1, 0, 2),
                                    dtype=np.float32)
        raw = np.empty((nh_, n, 3))  # as predict_matrix's column_stack: (row, quantile)
        fn, fast = self._row, self._fast
        step_in, step_out = self.width * 4, 3 * 8
        base_in, base_out = rows.ctypes.data, raw.ctypes.data
        out_len = ctypes.c_int64(0)
        p_len = ctypes.addressof(out_len)
        for i, h in enumerate(hz):
            for j, q in enumerate(self.quantiles):
                handle = fast[(h, q)]
                src = base_in + i * n * step_in
                dst = base_out + i * n * step_out + j * 8
                for _ in range(n):
                    if fn(handle, src, p_len, dst) != 0:
                        raise BubblecastError(
                            f"lightgbm: {self._error().decode(errors='replace')}")
                    src += step_in
                    dst += step_out
        z = np.sort(raw, axis=2)
        z[:, :, 0] -= lo[:, groups]
        z[:, :, 2] += hi[:, groups]
        z[:, :, 0] = np.minimum(z[:, :, 0], z[:, :, 1])
        z[:, :, 2] = np.maximum(z[:, :, 2], z[:, :, 1])
        z = np.ascontiguousarray(z.transpose(1, 0, 2))  # (n, H, 3)
        return level[:, None, None] * np.exp(z)
