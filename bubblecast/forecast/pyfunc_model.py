"""MLflow "model from code" wrapping a bubblecast model directory as a pyfunc model.

MLflow executes this file when it loads the logged model (no pickle), after putting the
logged model's ``code/`` (bubblecast's own source) on ``sys.path``, so it loads where
bubblecast is not installed. ``load_context`` reads the model directory logged as the
``model_dir`` artifact. ``predict`` of a forecaster takes a features frame (only the columns
of :func:`~bubblecast.forecast.tracking.forecaster_inputs` are read; any numeric dtype) and
returns one row per input row, in input order, with ``p10_h{h}``/``p50_h{h}``/``p90_h{h}`` of
the delay signal (seconds per unit of work) for each horizon (parameter ``horizons``, default
all). ``predict`` of a micro-batch cost model returns the ``p10``/``p50``/``p90`` op seconds
of :meth:`bubblecast.forecast.cost_model.CostModel.predict`. Only MLflow imports it.
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
        from bubblecast.forecast.tracking import forecaster_inputs

        self.model = load_any_model(context.artifacts["model_dir"])
        self.inputs = [] if self.model.kind == "cost" else forecaster_inputs(self.model)

    def predict(self, context, model_input, params=None):  # noqa: ANN001, ANN201 (MLflow
        # reads type hints here as a schema; the logged signature is the schema instead)
        import pandas as pd

        if self.model.kind == "cost":
            quantiles = self.model.predict(model_input, quantiles=(0.1, 0.5, 0.9))
            return pd.DataFrame(quantiles, columns=["p10", "p50", "p90"])
        from bubblecast.forecast.tracking import numeric_inputs, wide_quantiles

        horizons = (params or {}).get("horizons")
        hz = [int(h) for h in (self.model.horizons_ if horizons is None else horizons)]
        unknown = [h for h in hz if h not in self.model.horizons_]
        if unknown:
            from bubblecast.errors import BubblecastError

            raise BubblecastError(f"params.horizons: the model forecasts horizons "
                                  f"{list(self.model.horizons_)}, not {unknown}")
        frame = numeric_inputs(model_input, self.inputs)
        return wide_quantiles(self.model.predict_signal(frame, hz))


mlflow.models.set_model(BubblecastForecaster())
