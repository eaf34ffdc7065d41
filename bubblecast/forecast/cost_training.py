"""What ``bubblecast train EVENTS... --model cost`` does: fit the micro-batch cost model, save
its directory, log it to MLflow.

The model holds out whole runs (``holdout`` share, seeded) to choose its learner and calibrate
its bounds (:class:`~bubblecast.forecast.cost_model.CostModel`); their error (``heldout``, with
cross-fitted coverage) goes into ``model.json``, the result and MLflow. Logged like the other
kinds: parameters, held-out metrics, ``model.json`` as an artifact, and the directory as a
pyfunc model, registered and aliased on request (``models:/NAME@ALIAS``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bubblecast.forecast.cost_model import BOUNDS, CostModel
from bubblecast.forecast.cost_modeldir import save_cost_model
from bubblecast.forecast.modeldir import COST_KIND
from bubblecast.telemetry.events import Events


def train_cost_model(events: Events, out: str | os.PathLike[str], *, where: str = "events",
                     holdout: float = 0.2, seed: int = 0, params: dict[str, Any] | None = None,
                     track: bool = True, tracking_uri: str | None = None,
                     register: str | None = None, alias: str | None = None,
                     progress: Callable[[str], None] | None = None,
                     sources: Sequence[str | os.PathLike[str]] = ()) -> dict[str, Any]:
    """Fit a :class:`CostModel` (``params`` on top of ``holdout`` and ``seed``) on ``events``
    (``where`` names them in errors), save it to ``out`` and log it when ``track``. The
    ``train --json`` object: ``model``, ``learner``, ``out``, ``heldout`` (score keys; None
    with ``holdout`` 0), ``rows`` and ``runs`` fitted on, plus ``mlflow_run_id``,
    ``model_uri`` and ``registered`` when logged."""
    note = progress or (lambda _msg: None)
    model = CostModel(**{**(params or {}), "holdout": holdout, "seed": seed})
    note(f"fitting the cost model on {len(events.run_ids)} runs")
    model.fit(events, where)
    model.training_["sources"] = [str(s) for s in sources]
    note(f"saving {out}")
    save_cost_model(model, out)
    result: dict[str, Any] = {"model": COST_KIND, "learner": model.learner_, "out": str(out),
                              "heldout": model.heldout_, "rows": model.training_["rows"],
                              "runs": len(model.training_["runs"])}
    if track:
        note("logging to MLflow")
        result.update(_log_training(model, Path(out), holdout, seed, tracking_uri, register,
                                    alias))
    return result


def cost_metrics(metrics: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """A cost model's ``metrics`` (``heldout`` and per learner) flattened for MLflow:
    ``{prefix}cost.{key}`` and ``{prefix}cost.{learner}.{key}``, numbers only."""
    out: dict[str, float] = {}
    parts = [("cost.", metrics.get("heldout") or {})]
    parts += [(f"cost.{name}.", m) for name, m in (metrics.get("learners") or {}).items()]
    for head, summary in parts:
        for key, value in summary.items():
            if isinstance(value, (int, float)) and value == value:
                out[f"{prefix}{head}{key}"] = float(value)
    return out


def _log_training(model: CostModel, out: Path, holdout: float, seed: int,
                  tracking_uri: str | None, register: str | None, alias: str | None
                  ) -> dict[str, Any]:
    import pandas as pd
    from mlflow.models import infer_signature

    from bubblecast.forecast.modeldir import log_model_dir
    from bubblecast.forecast.tracking import mlflow_run

    tags = {"bubblecast.command": "train", "bubblecast.kind": COST_KIND}
    with mlflow_run(tracking_uri, run_name=f"train-{COST_KIND}", tags=tags) as mlflow:
        params = {f"model.{k}": v for k, v in model.get_params().items()}
        params.update({"kind": COST_KIND, "learner": model.learner_, "seed": seed,
                       "holdout": holdout, "rows": model.training_["rows"],
                       "runs": len(model.training_["runs"]),
                       "has_tokens_sq": model.has_tokens_sq_,
                       "work_cost_source": "linear" if model.surrogate_ is None
                       else "lgbm-surrogate"})
        mlflow.log_params({k: str(v)[:500] for k, v in params.items()})
        mlflow.log_metrics(cost_metrics(model.metrics_, "holdout."))
        mlflow.log_artifact(str(out / "model.json"))
        sample = model.sample_
        quantiles = (BOUNDS[0], 0.5, BOUNDS[1])
        output = pd.DataFrame(model.predict(sample, quantiles=quantiles),
                              columns=["p10", "p50", "p90"])
        logged = log_model_dir(mlflow, out, infer_signature(sample, output), COST_KIND,
                               register, alias)
        run_id = mlflow.active_run().info.run_id
    info: dict[str, Any] = {"mlflow_run_id": run_id, "model_uri": logged["model_uri"]}
    if register:
        info["registered"] = {k: logged[k] for k in ("name", "version", "uri")}
    return info
