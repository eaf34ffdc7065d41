"""LightGBM scoring of a few rows through the single-row C entry point.

``Booster.predict`` has a per-call overhead for a handful of rows, most of it the Python wrapper
(a fresh predictor object, a parameter string, size queries) rather than the trees. A served
forecast has one row per stage, so :class:`RowScorer` scores each row with
``LGBM_BoosterPredictForMatSingleRowFast`` (set up once per booster with ``num_threads=1``).
Each row takes the same float32 input and the same trees, so the result is bit-identical;
:meth:`RowScorer.build` checks that on probe rows against ``Booster.predict`` and declines
(None) otherwise. The C functions are reached through ``lightgbm.basic._LIB``, which is private:
a lightgbm release that moves it only turns this shortcut off."""

from __future__ import annotations

import ctypes
import logging
import threading
import weakref
from typing import Any

import numpy as np

log = logging.getLogger("bubblecast.forecast")

#: Above this many rows one ``Booster.predict`` per booster is as cheap.
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


class RowScorer:
    """Raw scores of up to :data:`MAX_ROWS` float32 rows for groups of boosters.

    ``groups`` maps a key (a horizon) to its boosters (one per quantile); :meth:`raw` returns
    ``(n, len(boosters))`` as ``np.column_stack`` of their ``Booster.predict`` would. A fast
    config holds one output buffer, so calls are serialised by a lock.
    """

    def __init__(self, groups: dict[Any, list[Any]], width: int) -> None:
        init, self._row, _, self._error = _c_api()
        self.width = width
        self._lock = threading.Lock()
        handles: list[int] = []
        boosters: list[Any] = []
        self._finalizer = weakref.finalize(self, _free_all, handles, boosters)
        self._fast: dict[Any, list[int]] = {}
        for key, members in groups.items():
            self._fast[key] = []
            for booster in members:
                out = ctypes.c_void_p()
                num_iteration = int(booster.best_iteration or 0) or -1
                if init(booster._handle, _C_API_PREDICT_NORMAL, 0, num_iteration,
                        _C_API_DTYPE_FLOAT32, width, b"num_threads=1",
                        ctypes.addressof(out)) != 0:
                    raise RuntimeError(self._error().decode(errors="replace"))
                handles.append(out.value)  # type: ignore[arg-type]
                boosters.append(booster)
                self._fast[key].append(out.value)

    @classmethod
    def build(cls, groups: dict[Any, list[Any]], width: int, seed: int = 0) -> RowScorer | None:
        """A scorer whose probe rows (NaNs included) equal ``Booster.predict`` bit for bit;
        None where it differs or the C entry point is unavailable."""
        try:
            scorer = cls(groups, width)
            rng = np.random.default_rng(seed)
            for n in (1, 7, MAX_ROWS):
                x = np.exp(rng.normal(0.0, 1.0, (n, width))).astype(np.float32)
                x[rng.random(x.shape) < 0.05] = np.nan
                for key, members in groups.items():
                    want = np.column_stack([b.predict(x, num_iteration=b.best_iteration or None,
                                                      num_threads=1) for b in members])
                    if not np.array_equal(scorer.raw(x, key), want, equal_nan=True):
                        log.info("single-row LightGBM path differs from Booster.predict")
                        return None
            return scorer
        except Exception as exc:  # noqa: BLE001 - any failure means: keep Booster.predict
            log.info("single-row LightGBM path unavailable: %s: %s", type(exc).__name__, exc)
            return None

    def raw(self, x: np.ndarray, key: Any) -> np.ndarray:
        """``(n, boosters)`` raw scores of the C-contiguous float32 ``(n, width)`` rows ``x``."""
        if x.dtype != np.float32 or not x.flags.c_contiguous or x.shape[1:] != (self.width,):
            raise ValueError(f"RowScorer: need C-contiguous float32 (n, {self.width}) rows")
        handles = self._fast[key]
        n = x.shape[0]
        out = np.empty((n, len(handles)))
        step_in, step_out = self.width * 4, len(handles) * 8
        base_in, base_out = x.ctypes.data, out.ctypes.data
        out_len = ctypes.c_int64(0)
        p_len = ctypes.addressof(out_len)
        fn = self._row
        with self._lock:
            for j, handle in enumerate(handles):
                for i in range(n):
                    if fn(handle, base_in + i * step_in, p_len, base_out + i * step_out + j * 8):
                        raise RuntimeError(self._error().decode(errors="replace"))
        return out
