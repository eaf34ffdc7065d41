"""A covariate model's load-time check: ``FeatureModel.check()`` probes it with synthetic
device metrics instead of refusing it for the covariate columns it reads."""

from __future__ import annotations

from bubblecast.dataset import DatasetConfig, build_dataset
from bubblecast.forecast.served import FeatureModel
from bubblecast.sim.device_metrics import simulated_metrics
from bubblecast.sim.simulator import SimConfig, simulate_events

CONFIG = DatasetConfig(windows=(5, 20), lags=8, max_period=10, covariates="auto")


def test_a_covariate_model_passes_the_load_check_and_a_plain_one_still_does() -> None:
    from bubblecast.forecast.modeldir import make_model

    sim = SimConfig(schedule="1f1b", stages=3, microbatches=4, model="uniform:12", steps=90,
                    scenario="thermal", seed=5, runs=3)
    frame, _ = build_dataset(simulate_events(sim), CONFIG, metrics=simulated_metrics(sim))
    assert any(c.startswith("f_cov_") for c in frame.columns)
    for covariates in (True, False):
        data = frame if covariates else frame[[c for c in frame.columns
                                               if not c.startswith("f_cov_")]]
        fitted = make_model("lgbm", n_estimators=20, num_leaves=7, seed=0).fit(data)
        fitted.dataset_config_ = CONFIG
        model = FeatureModel(fitted, CONFIG)
        assert model.check() is model
