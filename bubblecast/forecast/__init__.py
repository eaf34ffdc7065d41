"""Forecasters of the per-stage delay signal, their evaluation and their MLflow life cycle.

One interface (:class:`~bubblecast.forecast.base.Forecaster`: ``fit(frame) -> self``,
``predict(frame, horizons)`` -> p10/p50/p90 per row and horizon): baselines
(``baselines``), LightGBM (``lgbm``), a GRU sequence model (``seq``), split-conformal
calibration (``conformal``), model directories (``modeldir``: ``save_model``, ``load_model``
for directories and ``models:/`` URIs), evaluation (``evaluate``, ``bubbles``, ``backtest``)
and MLflow tracking (``tracking``). Import the submodules you need: torch, lightgbm and
mlflow load only inside the functions that use them.
"""
