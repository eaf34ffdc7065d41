"""Real ``bubblecast.forecast`` models behind the service: the served forecast equals the
offline prediction at the same origin, and a model directory loads and serves end to end."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from bubblecast.dataset.window import Window
from bubblecast.forecast.served import FeatureModel, window_series

STAGES, STEPS, MB = 3, 140, 4


def run_window(seed: int, steps: int = STEPS, tokens: bool = False) -> Window:
    """A synthetic run: per-stage drift, a periodic spike on one stage, noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(steps)[:, None]
    base = 1.0 + 0.2 * np.arange(STAGES)[None, :]
    drift = 1.0 + 0.3 * (t / steps) * (np.arange(STAGES)[None, :] == seed % STAGES)
    spikes = 1.0 + 0.6 * ((t % 17) == 0) * (np.arange(STAGES)[None, :] == 1)
    compute = base * drift * spikes * (1.0 + 0.03 * rng.standard_normal((steps, STAGES)))
    tok = 1000.0 + 200.0 * rng.random((steps, 1)) if tokens else None
    if tok is not None:
        compute = compute * tok / 1000.0
        tok = np.repeat(tok, STAGES, axis=1)
    return Window(compute=compute, cost=np.full((steps, STAGES), 4.0), microbatches=MB,
                  tokens=tok)


def features_of(windows: list[Window]) -> pd.DataFrame:
    from bubblecast.dataset.features import build_features

    parts = []
    for i, w in enumerate(windows):
        s = window_series(w, 0)
        s["run_id"] = pd.Categorical([f"run{i}"] * len(s))
        parts.append(s)
    series = pd.concat(parts, ignore_index=True)
    series["run_id"] = series["run_id"].astype("category")
    series["scenario"] = series["scenario"].astype("category")
    return build_features(series)


@pytest.fixture(scope="module")
def trained():
    from bubblecast.forecast.baselines import EWMA
    from bubblecast.forecast.lgbm import LGBMForecaster

    frame = features_of([run_window(seed) for seed in range(6)])
    lgbm = LGBMForecaster(n_estimators=15, min_child_samples=20, seed=0).fit(frame)
    ewma = EWMA().fit(frame)
    return {"lgbm": lgbm, "ewma": ewma}


@pytest.mark.parametrize("kind", ["lgbm", "ewma"])
def test_served_forecast_equals_the_offline_prediction_at_the_same_origin(trained, kind):
    model = trained[kind]
    full = run_window(seed=99, steps=100)
    origin = 79  # the service sees steps 0..79; offline features come from the whole run
    offline_frame = features_of([full])
    rows = offline_frame.loc[offline_frame["step"] == origin].sort_values("stage")
    hz = list(model.horizons_)
    offline = model.predict_signal(rows.reset_index(drop=True), hz)
    offline = np.stack([offline[h] for h in hz], axis=1)
    seen = Window(compute=full.compute[: origin + 1], cost=full.cost[: origin + 1],
                  microbatches=MB)
    served = FeatureModel(model).predict_window(seen, hz)
    assert served.shape == (STAGES, len(hz), 3)
    np.testing.assert_allclose(served, offline, rtol=1e-6)


def test_model_directory_loads_and_serves(trained, tmp_path):
    from bubblecast.forecast.modeldir import save_model
    from bubblecast.serve.predictor import Predictor

    d = save_model(trained["lgbm"], tmp_path / "lgbm", metrics={"h1": {"mae": 0.01}})
    pred = Predictor.from_source(str(d))
    assert pred.info.name == "lgbm" and pred.info.metrics == {"h1": {"mae": 0.01}}
    model = pred.loaded.model
    assert model.horizons == (1, 5, 10) and model.min_window == 60
    assert model.feature_path == "numpy"  # the fast path passed its load-time check
    w = run_window(seed=7, steps=70)
    req = {"pipeline": {"stages": STAGES, "microbatches": MB}, "horizons": [1, 10],
           "ranks": [{"rank": s, "stage": s, "compute_s": w.compute[:, s].tolist(),
                      "work": [4.0] * 70} for s in range(STAGES)]}
    out = pred.forecast(req)
    assert all(np.all(np.isfinite(r.p50)) and r.p10[0] <= r.p50[0] <= r.p90[0]
               for r in out.ranks)
    # seconds ~ the recent compute of each stage (a sane forecast, not a unit mix-up)
    recent = w.compute[-10:].mean(axis=0)
    p50 = np.array([r.p50[0] for r in out.ranks])
    assert np.all(np.abs(p50 / recent - 1) < 0.5), (p50, recent)
    short = dict(req, ranks=[dict(r, compute_s=r["compute_s"][:30], work=r["work"][:30])
                             for r in req["ranks"]])
    from bubblecast.serve.schemas import RequestError

    with pytest.raises(RequestError, match="at least 60"):
        pred.forecast(short)
