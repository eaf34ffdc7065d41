"""The vectorised :class:`~bubblecast.forecast.conformal.AdaptiveConformal` gives the numbers its
first, per-interval implementation gave, bit for bit: committed results (``policy-eval``, the
decisions benchmark, the service's answers) were produced by it. ``ReferenceACI`` is that
implementation, kept here as the oracle (one dict entry per issued interval, scored one by one
in ``(origin, horizon)`` order)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bubblecast.forecast.conformal import AdaptiveConformal


class ReferenceACI(AdaptiveConformal):
    """The per-interval implementation: the settings, scales and counts are the class's own;
    the issued intervals, their scoring and the step are the first implementation's."""

    def __init__(self, **kw: float | int | None) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.issued: dict[tuple[int, int], np.ndarray] = {}  # (origin, h) -> (P, 2) lo, hi

    def adjust(self, q: np.ndarray, horizons: np.ndarray | list[int], origin: int
               ) -> np.ndarray:
        """``q`` ``(H, P, 3)`` (positive values) with each horizon's interval rescaled; the
        result is recorded for :meth:`observe` when ``origin`` is a new, later one."""
        q = np.asarray(q, dtype=np.float64)
        logs = np.log(np.maximum(q, 1e-300))
        out = logs.copy()
        for j, h in enumerate(int(x) for x in horizons):
            k = float(np.exp(self.log_scale.get(h, 0.0)))
            out[j, :, 0] = logs[j, :, 1] - k * (logs[j, :, 1] - logs[j, :, 0])
            out[j, :, 2] = logs[j, :, 1] + k * (logs[j, :, 2] - logs[j, :, 1])
        result = np.exp(out)
        if self.last_origin is None or origin > self.last_origin:
            self.last_origin = int(origin)
            for j, h in enumerate(int(x) for x in horizons):
                self.issued[(int(origin), h)] = result[j, :, ::2].copy()
            oldest = origin - self.keep  # targets this far back were never observed
            for key in [k for k in self.issued if k[0] + k[1] < oldest]:
                del self.issued[key]
        return result

    def observe(self, history: np.ndarray, now: int) -> None:
        """Score every issued interval whose target step (``origin + h`` <= ``now``, the
        index of ``history``'s last row) is now observed, and update the scales."""
        hist = np.asarray(history, dtype=np.float64)
        offset = now - (len(hist) - 1)
        target = 1.0 - self.coverage
        for (o, h) in sorted(k for k in self.issued if k[0] + k[1] <= now):
            bounds = self.issued.pop((o, h))
            row = o + h - offset
            if row < 0:
                continue
            y = hist[row]
            miss = float(np.mean((y < bounds[:, 0]) | (y > bounds[:, 1])))
            scored = self.scored.get(h, 0)
            theta = self.log_scale.get(h, 0.0) + self.step(scored) * (miss - target)
            self.scored[h] = scored + 1
            self.miss_sum[h] = self.miss_sum.get(h, 0.0) + miss
            self.log_scale[h] = float(min(max(theta, -3.0), 3.0))

    def step(self, scored: int) -> float:
        """The step of a horizon's update after ``scored`` earlier ones: ``gamma_start``
        decaying exponentially (scale ``decay`` updates) to ``gamma``."""
        return self.gamma + (self.gamma_start - self.gamma) * float(np.exp(-scored / self.decay))


def _run(aci, ref, rng: np.random.Generator, horizons: list[int], ranks: int, steps: int,
         every: int, window: int, backtests: bool) -> int:
    """Drive both through one run: decisions every ``every`` steps on a trailing ``window``
    of the history (so its first row is not step 0), the odd backtest at an earlier origin,
    stretches without observations (so that unscored intervals expire), NaNs in the history;
    assert every answer and the state equal, bit for bit. Returns how many intervals were
    scored."""
    hist = rng.lognormal(0.0, 0.2, (steps, ranks))
    hist[rng.random(hist.shape) < 0.01] = np.nan
    blind = 0  # decisions left without an observation
    for t in range(0, steps, every):
        blind = max(blind - 1, 0) if blind or rng.random() > 0.03 else int(rng.integers(1, 60))
        if not blind:
            seen = hist[max(0, t - window + 1): t + 1]
            aci.observe(seen, t)
            ref.observe(seen, t)
        q = np.sort(rng.lognormal(0.0, 0.15, (len(horizons), ranks, 3)), axis=2)
        origin = t - 3 if backtests and t > 3 and rng.random() < 0.1 else t
        got, want = aci.adjust(q, horizons, origin), ref.adjust(q, horizons, origin)
        assert got.tobytes() == want.tobytes(), t
        assert aci.log_scale == ref.log_scale, t
    assert aci.scored == ref.scored and aci.miss_sum == ref.miss_sum
    assert aci.coverage_by_horizon() == ref.coverage_by_horizon()
    assert aci.pending() == len(ref.issued)
    return sum(ref.scored.values())


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), horizons=st.lists(st.integers(1, 40), min_size=1,
                                                      max_size=6),
       ranks=st.integers(1, 6), every=st.integers(1, 5), window=st.integers(4, 80),
       keep=st.integers(1, 80), gamma_start=st.sampled_from([None, 0.3]),
       backtests=st.booleans())
def test_matches_the_reference_bit_for_bit(seed, horizons, ranks, every, window, keep,
                                           gamma_start, backtests) -> None:
    kw = {"coverage": 0.8, "gamma": 0.02, "gamma_start": gamma_start, "decay": 60.0,
          "keep": keep}
    _run(AdaptiveConformal(**kw), ReferenceACI(**kw), np.random.default_rng(seed), horizons,
         ranks, 200, every, window, backtests)


@pytest.mark.parametrize("horizons", [[1, 5, 10], list(range(1, 101))])
def test_matches_the_reference_as_served(horizons) -> None:
    from bubblecast.policy.speeds import SERVED_ACI

    scored = _run(AdaptiveConformal(**SERVED_ACI), ReferenceACI(**SERVED_ACI),
                  np.random.default_rng(7), horizons, 4, 400, 1, 128, False)
    assert scored > 300 * len(horizons) // 2  # most intervals were scored, not dropped
