"""MLflow "model from code" wrapping a bubblecast model directory as a pyfunc model.

MLflow executes this file when it loads the logged model (no pickle): ``load_context`` reads
the model directory logged as the ``model_dir`` artifact and ``predict`` returns the long
quantile frame of :meth:`bubblecast.forecast.base.Forecaster.predict`. Only MLflow imports it.
"""

from __future__ import annotations

from typing import Any

import mlflow
from mlflow.pyfunc import PythonModel


class BubblecastForecaster(PythonModel):
    """pyfunc face of a bubblecast forecaster (input: a features frame)."""

    def load_context(self, context: Any) -> None:
        from bubblecast.forecast.modeldir import load_model

        self.model = load_model(context.artifacts["model_dir"])

    def predict(self, context, model_input, params=None):  # noqa: ANN001, ANN201 (MLflow
        # reads type hints here as a schema; the logged signature is the schema instead)
        horizons = (params or {}).get("horizons")
        return self.model.predict(model_input, horizons)


mlflow.models.set_model(BubblecastForecaster())
