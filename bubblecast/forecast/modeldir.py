"""Model directories: ``model.json`` (kind, version, horizons, features, metrics, the sha256 of
each native file) + native files.

``save_model`` writes a directory atomically (a temporary sibling renamed into place,
:func:`write_model_dir`); ``load_model`` reads one back, from a local directory or an MLflow
``models:/name@alias`` (or ``runs:/``) URI (fetched by ``tracking.download_model``);
``log_model`` logs a directory to MLflow as a pyfunc model and registers it
(:func:`log_model_dir`). No pickle anywhere: LightGBM boosters are text, torch weights are
loaded with ``weights_only=True``, everything else is JSON.

The micro-batch cost model (kind ``cost``, :mod:`bubblecast.forecast.cost_model`) uses the same
format, writer, checks and logging; it is no forecaster: ``load_model`` refuses it in one line,
and ``cost_modeldir.load_cost_model`` (or ``load_any_model``) reads it.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bubblecast._version import __version__
from bubblecast.dataset.config import FEATURES_VERSION, DatasetConfig
from bubblecast.errors import BubblecastError
from bubblecast.forecast.base import Forecaster

MODEL_FILE = "model.json"
FORMAT = "bubblecast-forecaster"
FORMAT_VERSION = 1
MODEL_KINDS: tuple[str, ...] = ("last", "ewma", "rolling_median", "seasonal_naive", "lgbm", "seq")
#: Kind of the micro-batch cost model's directories (not a forecaster; see the module doc).
COST_KIND = "cost"


def model_class(kind: str) -> type[Forecaster]:
    """The forecaster class of ``kind``; one-line error naming the choices otherwise."""
    if kind in ("last", "ewma", "rolling_median", "seasonal_naive"):
        from bubblecast.forecast import baselines

        return {"last": baselines.LastValue, "ewma": baselines.EWMA,
                "rolling_median": baselines.RollingMedian,
                "seasonal_naive": baselines.SeasonalNaive}[kind]
    if kind == "lgbm":
        from bubblecast.forecast.lgbm import LGBMForecaster

        return LGBMForecaster
    if kind == "seq":
        from bubblecast.forecast.seq import SeqForecaster

        return SeqForecaster
    raise BubblecastError(f"unknown model '{kind}' (choose from {', '.join(MODEL_KINDS)})")


def make_model(kind: str, **params: Any) -> Forecaster:
    cls = model_class(kind)
    accepted = {k: v for k, v in params.items() if k in cls._param_names()}
    return cls(**accepted)


def _sha256(path: Path) -> str:
    """Hex SHA-256 of a file's content."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def save_model(model: Forecaster, directory: str | os.PathLike[str],
               metrics: dict[str, Any] | None = None, extra: dict[str, Any] | None = None
               ) -> Path:
    """Write ``model`` (fitted) to ``directory``, replacing what was there, atomically."""
    model.check_fitted()

    def build(tmp: Path) -> tuple[dict[str, Any], list[str]]:
        files = model.save_native(str(tmp))
        state = model.state()
        doc = {
            "format": FORMAT, "format_version": FORMAT_VERSION, "kind": model.kind,
            "bubblecast_version": __version__, "features_version": FEATURES_VERSION,
            "horizons": list(state["horizons_"]),
            "features": list(getattr(model, "features_", [])) + list(
                getattr(model, "horizon_features_", [])),
            "params": model.get_params(), "state": state,
            "metrics": metrics or {}, **(extra or {}),
        }
        config = getattr(model, "dataset_config_", None)
        if config is not None:
            doc["dataset_config"] = config.to_json()
        return doc, files

    return write_model_dir(directory, build)


def write_model_dir(directory: str | os.PathLike[str],
                    build: Callable[[Path], tuple[dict[str, Any], list[str]]]) -> Path:
    """Replace ``directory`` atomically by a model directory: ``build(tmp)`` writes the native
    files into the temporary directory ``tmp`` and returns ``(doc, files)``; ``doc`` is
    written as ``model.json`` with ``files`` and their ``sha256``."""
    target = Path(directory)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    tmp.chmod(0o755)  # mkdtemp creates 0700; a model directory is meant to be shared
    try:
        doc, files = build(tmp)
        # The files' contents: a server loads a copied directory only when they match
        # (serve.registry.directory_state), so a half-copied model is never served.
        doc = {**doc, "files": files, "sha256": {f: _sha256(tmp / f) for f in files}}
        (tmp / MODEL_FILE).write_text(json.dumps(doc, indent=1, sort_keys=True, default=float))
        if target.exists():
            old = target.with_name(f".{target.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            target.rename(old)
            tmp.rename(target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def verify_files(directory: str | os.PathLike[str], doc: dict[str, Any]) -> None:
    """One-line error unless every file of ``doc``'s ``sha256`` manifest has that content."""
    d = Path(directory)
    for name, digest in (doc.get("sha256") or {}).items():
        if _sha256(d / name) != digest:
            raise BubblecastError(f"{d}: corrupt model directory ({name} does not match its "
                                  f"sha256 in {MODEL_FILE})")


def record_coverage(directory: str | os.PathLike[str], coverage: dict[str, Any]) -> None:
    """Set ``model.json``'s ``coverage`` field: the model's p10-p90 coverage on held-out runs
    of new seeds, with how it was measured. Rewrites ``model.json`` atomically; the native
    files (and so their ``sha256``) are untouched."""
    from bubblecast.telemetry.io import atomic_write_text

    path = Path(directory) / MODEL_FILE
    doc = json.loads(path.read_text())
    doc["coverage"] = coverage
    atomic_write_text(path, json.dumps(doc, indent=1, sort_keys=True, default=float))


def read_model_json(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The parsed ``model.json`` of a model directory, checked; one-line errors otherwise."""
    d = Path(directory)
    if not d.exists():
        raise BubblecastError(f"{d}: model directory does not exist")
    if not d.is_dir():
        raise BubblecastError(f"{d}: not a model directory")
    path = d / MODEL_FILE
    if not path.is_file():
        raise BubblecastError(f"{d}: not a bubblecast model directory (no {MODEL_FILE})")
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BubblecastError(f"{path}: corrupt model file ({type(exc).__name__})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise BubblecastError(f"{path}: not a bubblecast forecaster (format "
                              f"{doc.get('format') if isinstance(doc, dict) else None!r})")
    required: tuple[str, ...] = ("version", "learner", "coefficients", "conformal")
    if doc.get("kind") != COST_KIND:  # a cost model reads events, not features
        if doc.get("features_version") != FEATURES_VERSION:
            raise BubblecastError(f"{path}: model built for features version "
                                  f"{doc.get('features_version')!r}, this bubblecast uses "
                                  f"{FEATURES_VERSION} (retrain it)")
        required = ("kind", "params", "state", "horizons")
    for key in required:
        if key not in doc:
            raise BubblecastError(f"{path}: corrupt model file (no '{key}')")
    missing = [f for f in doc.get("files", []) if not (d / f).is_file()]
    if missing:
        raise BubblecastError(f"{d}: corrupt model directory (missing {missing[0]})")
    return doc


def load_model(where: str | os.PathLike[str], tracking_uri: str | None = None) -> Forecaster:
    """A fitted forecaster from a directory or an MLflow ``models:/`` / ``runs:/`` URI."""
    text = str(where)
    if text.startswith(("models:/", "runs:/")):
        from bubblecast.forecast.tracking import download_model

        with tempfile.TemporaryDirectory(prefix="bubblecast-model-") as tmp:
            model = load_model(download_model(text, tmp, tracking_uri))
        model.metadata_["uri"] = text
        return model
    doc = read_model_json(where)
    if doc["kind"] == COST_KIND:
        raise BubblecastError(f"{where}: a micro-batch cost model (kind '{COST_KIND}'), not a "
                              "forecaster; give it to policy-eval --cost-model, or evaluate it "
                              "on events")
    cls = model_class(str(doc["kind"]))
    try:
        model = cls(**{k: v for k, v in doc["params"].items() if k in cls._param_names()})
        model.load_state(doc["state"], str(where))
    except BubblecastError:
        raise
    except Exception as exc:  # a native file that will not parse, a state that does not fit
        raise BubblecastError(f"{where}: corrupt model directory ({type(exc).__name__}: "
                              f"{' '.join(str(exc).split())[:160]})") from None
    model.metadata_ = {k: doc.get(k) for k in ("metrics", "bubblecast_version", "kind",
                                                "dataset_config", "dataset")}
    model.dataset_config_ = None
    if isinstance(doc.get("dataset_config"), dict):
        try:
            model.dataset_config_ = DatasetConfig.from_json(doc["dataset_config"])
        except (TypeError, ValueError) as exc:
            raise BubblecastError(f"{where}: corrupt model file (dataset_config: {exc})") from None
    return model


def log_model(mlflow: Any, model_dir: str | Path, sample: Any, registered_name: str | None,
              alias: str | None) -> dict[str, Any]:
    """Log the model directory as a pyfunc model whose signature holds only the columns the
    forecaster reads; register and alias it. ``sample``: a few features-frame rows, on
    which the pyfunc's inputs must give the forecaster's own predictions (else an error)."""
    import numpy as np

    from bubblecast.forecast.tracking import (
        forecaster_inputs,
        forecaster_signature,
        numeric_inputs,
    )

    model = load_model(model_dir)
    inputs = forecaster_inputs(model)
    hz = list(model.horizons_)
    full = model.predict_signal(sample.reset_index(drop=True), hz)
    narrow = model.predict_signal(numeric_inputs(sample, inputs), hz)
    for h in hz:
        if not np.allclose(full[h], narrow[h], rtol=1e-6, equal_nan=True):
            raise BubblecastError(f"{model_dir}: the {model.kind} model reads columns beyond "
                                  f"its signature ({', '.join(inputs)}); cannot log it")
    return log_model_dir(mlflow, model_dir, forecaster_signature(model, inputs), model.kind,
                         registered_name, alias)


def log_model_dir(mlflow: Any, model_dir: str | Path, signature: Any, kind: str,
                  registered_name: str | None, alias: str | None) -> dict[str, Any]:
    """Log a model directory of ``kind`` with ``signature`` as a pyfunc model carrying
    bubblecast's source as ``code_paths`` and ``bubblecast_version`` in its metadata;
    register it under ``registered_name`` and point ``alias`` at it. ``{"model_uri"}``,
    plus ``name``, ``version`` and ``uri`` when registered."""
    from bubblecast.forecast.tracking import package_source, pip_requirements

    code = Path(__file__).with_name("pyfunc_model.py")
    with (tempfile.TemporaryDirectory(prefix="bubblecast-code-") as tmp,
          contextlib.redirect_stderr(io.StringIO())):  # "Successfully registered model ..."
        info = mlflow.pyfunc.log_model(
            name="model", python_model=str(code), artifacts={"model_dir": str(model_dir)},
            code_paths=[str(package_source(tmp))], signature=signature,
            pip_requirements=pip_requirements(kind), registered_model_name=registered_name,
            metadata={"bubblecast_version": __version__, "bubblecast_kind": kind})
    out: dict[str, Any] = {"model_uri": info.model_uri}
    if registered_name:
        version = getattr(info, "registered_model_version", None)
        if version is None:
            client = mlflow.MlflowClient()
            version = max(int(v.version) for v in client.search_model_versions(
                f"name='{registered_name}'"))
        out.update({"name": registered_name, "version": int(version)})
        if alias:
            mlflow.MlflowClient().set_registered_model_alias(registered_name, alias, str(version))
            out["uri"] = f"models:/{registered_name}@{alias}"
        else:
            out["uri"] = f"models:/{registered_name}/{version}"
    return out
