"""The cost model's directory: save, load (directories and ``models:/`` URIs), and the checks
its users need.

A cost-model directory is a bubblecast model directory (:mod:`bubblecast.forecast.modeldir`:
same atomic writer, ``model.json`` format and sha256 manifest) of kind ``cost``::

    DIR/model.json    kind "cost", version, learner, params, kinds, features, has_tokens_sq,
                      has_documents, coefficients (per kind: per_token, per_token_sq,
                      per_document, per_microbatch; seconds per layer at speed 1), surrogate
                      (the LightGBM learner's linear surrogate, else null), work_cost and
                      work_cost_source ("linear" or "lgbm-surrogate"), kind_weights,
                      mean_stats, conformal (levels, ratios, source, rows), metrics
                      (heldout, learners), training (runs, heldout_runs, rows, sources),
                      files, sha256
    DIR/booster.txt   the LightGBM booster (text), when the learner is lgbm

:func:`load_cost_model` reads one (refusing a forecaster's directory or a file that does not
match its sha256); :func:`load_any_model` reads a forecaster or a cost model, whichever the
directory holds; :func:`require_tokens_sq` is the planner's check.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from bubblecast._version import __version__
from bubblecast.errors import BubblecastError
from bubblecast.forecast.base import Forecaster
from bubblecast.forecast.cost_features import TERMS
from bubblecast.forecast.cost_fitting import LEVELS
from bubblecast.forecast.cost_model import CostModel
from bubblecast.forecast.modeldir import (
    COST_KIND,
    FORMAT,
    FORMAT_VERSION,
    load_model,
    read_model_json,
    verify_files,
    write_model_dir,
)

#: Version of the cost model's ``model.json`` layout.
COST_VERSION = 1
BOOSTER_FILE = "booster.txt"


def save_cost_model(model: CostModel, directory: str | os.PathLike[str],
                    extra: dict[str, Any] | None = None) -> Path:
    """Write ``model``'s directory (see the module doc) atomically; ``extra`` keys go into
    ``model.json``."""
    model.check_fitted()

    def build(tmp: Path) -> tuple[dict[str, Any], list[str]]:
        files = []
        if model.booster_ is not None:
            model.booster_.save_model(str(tmp / BOOSTER_FILE))
            files.append(BOOSTER_FILE)
        return {**cost_model_doc(model), **(extra or {})}, files

    return write_model_dir(directory, build)


def _table(coef: dict[str, np.ndarray] | None) -> dict[str, Any] | None:
    return None if coef is None else {
        k: dict(zip(TERMS, map(float, c), strict=True)) for k, c in coef.items()}


def _arrays(obj: dict[str, Any] | None) -> dict[str, np.ndarray] | None:
    return None if obj is None else {
        k: np.array([float(c[t]) for t in TERMS]) for k, c in obj.items()}


def cost_model_doc(model: CostModel) -> dict[str, Any]:
    """The ``model.json`` document of a fitted cost model (without the file manifest)."""
    model.check_fitted()
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "kind": COST_KIND,
            "version": COST_VERSION, "bubblecast_version": __version__,
            "learner": model.learner_, "params": model.get_params(), "kinds": model.kinds_,
            "speed_window": model.speed_window_,
            "features": model.features, "has_tokens_sq": model.has_tokens_sq_,
            "has_documents": model.has_documents_, "coefficients": _table(model.coef_),
            "surrogate": _table(model.surrogate_), "work_cost": model.work_cost().to_json(),
            "work_cost_source": "linear" if model.surrogate_ is None else "lgbm-surrogate",
            "kind_weights": list(model.kind_weights()),
            "mean_stats": dict(zip(TERMS, map(float, model.mean_stats_), strict=True)),
            "conformal": {"levels": LEVELS.tolist(), "ratios": model.ratios_.tolist(),
                          "source": model.conformal_source_, "rows": model.conformal_rows_},
            "metrics": model.metrics_, "training": model.training_}


def cost_model_from_doc(doc: dict[str, Any], directory: str | os.PathLike[str]) -> CostModel:
    """A fitted cost model from its ``model.json`` document and directory."""
    names = CostModel().get_params()
    model = CostModel(**{k: v for k, v in doc["params"].items() if k in names})
    model.speed_window_ = int(doc.get("speed_window", 1))  # saved before it: the last step
    model.learner_ = str(doc["learner"])
    model.kinds_ = [str(k) for k in doc["kinds"]]
    model.has_tokens_sq_ = bool(doc["has_tokens_sq"])
    model.has_documents_ = bool(doc["has_documents"])
    model.coef_ = _arrays(doc["coefficients"]) or {}
    model.surrogate_ = _arrays(doc.get("surrogate"))
    model.mean_stats_ = np.array([float(doc["mean_stats"][t]) for t in TERMS])
    model.ratios_ = np.array(doc["conformal"]["ratios"], dtype=np.float64)
    if model.ratios_.shape != LEVELS.shape:
        raise ValueError(f"conformal: {model.ratios_.size} ratios for {LEVELS.size} levels")
    model.conformal_source_ = str(doc["conformal"]["source"])
    model.conformal_rows_ = int(doc["conformal"]["rows"])
    model.metrics_ = dict(doc.get("metrics") or {})
    model.heldout_ = model.metrics_.get("heldout")
    model.training_ = dict(doc.get("training") or {})
    model.booster_ = None
    if BOOSTER_FILE in doc.get("files", []):
        import lightgbm as lgb

        model.booster_ = lgb.Booster(model_file=str(Path(directory) / BOOSTER_FILE))
    return model


def load_cost_model(where: str | os.PathLike[str], tracking_uri: str | None = None
                    ) -> CostModel:
    """A fitted cost model from its directory or an MLflow ``models:/`` / ``runs:/`` URI;
    one-line errors for anything else (a forecaster's directory, a corrupt one)."""
    text = str(where)
    if text.startswith(("models:/", "runs:/")):
        from bubblecast.forecast.tracking import download_model

        with tempfile.TemporaryDirectory(prefix="bubblecast-model-") as tmp:
            model = load_cost_model(download_model(text, tmp, tracking_uri))
        model.source_ = text
        return model
    doc = read_model_json(where)
    if doc["kind"] != COST_KIND:
        raise BubblecastError(f"{where}: a {doc['kind']} forecaster, not a cost model (train "
                              "one with `bubblecast train EVENTS... --model cost`)")
    if doc.get("version") != COST_VERSION:
        raise BubblecastError(f"{where}: cost model version {doc.get('version')!r}, this "
                              f"bubblecast reads {COST_VERSION} (retrain it)")
    verify_files(where, doc)
    try:
        model = cost_model_from_doc(doc, where)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise BubblecastError(f"{where}: corrupt model file ({type(exc).__name__}: "
                              f"{' '.join(str(exc).split())[:160]})") from None
    model.source_ = text
    return model


def load_any_model(where: str | os.PathLike[str], tracking_uri: str | None = None
                   ) -> Forecaster | CostModel:
    """The forecaster or the cost model a directory or ``models:/`` / ``runs:/`` URI holds."""
    text = str(where)
    if text.startswith(("models:/", "runs:/")):
        from bubblecast.forecast.tracking import download_model

        with tempfile.TemporaryDirectory(prefix="bubblecast-model-") as tmp:
            model = load_any_model(download_model(text, tmp, tracking_uri))
        if isinstance(model, CostModel):
            model.source_ = text
        else:
            model.metadata_["uri"] = text
        return model
    if read_model_json(where)["kind"] == COST_KIND:
        return load_cost_model(where)
    return load_model(where)


def require_tokens_sq(model: CostModel, where: str) -> None:
    """For the planner: refuse, in one line naming ``where``, a cost model trained without
    ``tokens_sq`` (it cannot price packed documents)."""
    if not model.has_tokens_sq:
        raise BubblecastError(f"cost model {where} was trained without tokens_sq; it cannot "
                              "price packed documents (retrain on events with tokens_sq)")
