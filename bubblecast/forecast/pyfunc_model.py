"""MLflow "model from code" wrapping a bubblecast model directory as a pyfunc model.

MLflow executes this file when it loads the logged model (no pickle): ``load_context`` reads
the model directory logged as the ``model_dir`` artifact and ``predict`` returns the long
quantile frame of :meth:`bubblecast.forecast.base.Forecaster.predict` (a forecaster) or the
``p10``/``p50``/``p90`` op seconds of :meth:`bubblecast.forecast.cost_model.CostModel.predict`
(a micro-batch cost model). Only MLflow imports it.
"""

from __future__ import annotations

from typing import Any

import mlflow
from mlflow.pyfunc import PythonModel


class BubblecastForecaster(PythonModel):
    """pyfunc face of a bubblecast model directory (input: a features frame, or the op rows
    of a cost model)."""

    def load_context(self, context: Any) -> None:
        from bubblecast.forecast.cost_modeldir import load_any_model

        self.model = load_any_model(context.artifacts["model_dir"])

    def predict(self, context, model_input, params=None):  # noqa: ANN001, ANN201 (MLflow
        # reads type hints here as a schema; the logged signature is the schema instead)
        if getattr(self.model, "kind", None) == "cost":
            import pandas as pd

            quantiles = self.model.predict(model_input, quantiles=(0.1, 0.5, 0.9))
            return pd.DataFrame(quantiles, columns=["p10", "p50", "p90"])
        horizons = (params or {}).get("horizons")
        return self.model.predict(model_input, horizons)


mlflow.models.set_model(BubblecastForecaster())
