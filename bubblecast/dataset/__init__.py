"""Dataset builder: events -> per-(run, replica, stage, step) features and targets per horizon.

``build_dataset(events, config)`` returns the features frame; ``write_features`` /
``read_features`` store it as Parquet tagged with :data:`FEATURES_VERSION`; ``split_runs``,
``run_folds`` and ``rolling_origin`` give run-grouped splits and backtests.
"""

from bubblecast.dataset.builder import build_dataset
from bubblecast.dataset.config import FEATURES_VERSION, DatasetConfig
from bubblecast.dataset.features import (
    build_features,
    feature_columns,
    horizon_columns,
    horizons_of,
    is_scaled,
)
from bubblecast.dataset.series import step_series
from bubblecast.dataset.splits import rolling_origin, run_folds, split_runs
from bubblecast.dataset.store import FeaturesMeta, read_features, read_features_meta, write_features

__all__ = [
    "FEATURES_VERSION", "DatasetConfig", "FeaturesMeta", "build_dataset", "build_features",
    "feature_columns", "horizon_columns", "horizons_of", "is_scaled", "read_features",
    "read_features_meta", "rolling_origin", "run_folds", "split_runs", "step_series",
    "write_features",
]  # fmt: skip
