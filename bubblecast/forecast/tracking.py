"""MLflow tracking and registry for ``train`` and ``evaluate`` (mlflow imported lazily).

Tracking store: ``--tracking-uri``, else ``MLFLOW_TRACKING_URI``, else a SQLite file
``mlflow.db`` in the working directory (:data:`DEFAULT_TRACKING_URI`; artifacts then go to
``./mlruns``, MLflow's default for a database store). Models are logged as a pyfunc
"model from code" (``pyfunc_model.py``) carrying the bubblecast model directory as an artifact,
with a signature and explicit pip requirements (no environment inference, no pickle), then
registered and addressed by alias, e.g. ``models:/bubblecast-forecaster@champion``.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

from bubblecast.errors import BubblecastError

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
DEFAULT_EXPERIMENT = "bubblecast"
DEFAULT_MODEL_NAME = "bubblecast-forecaster"


def resolve_tracking_uri(cli_value: str | None = None) -> str:
    """The tracking URI: the option, else ``MLFLOW_TRACKING_URI``, else the local SQLite file."""
    return cli_value or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


def _quiet() -> None:
    """Keep MLflow's INFO logs, progress bars and hints off the terminal."""
    import logging
    import warnings

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "ERROR")
    import mlflow  # noqa: F401  (configures its loggers on import; override them after)

    for name in ("mlflow", "alembic", "alembic.runtime.migration"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=UserWarning, module=r"mlflow(\..*)?")


@contextmanager
def mlflow_run(tracking_uri: str | None, run_name: str, tags: dict[str, str] | None = None,
               experiment: str = DEFAULT_EXPERIMENT) -> Iterator[Any]:
    """An active MLflow run on the resolved store; yields the ``mlflow`` module."""
    _quiet()
    import mlflow

    mlflow.set_tracking_uri(resolve_tracking_uri(tracking_uri))
    try:
        mlflow.set_experiment(experiment)
    except Exception as exc:
        raise BubblecastError(f"MLflow tracking store {resolve_tracking_uri(tracking_uri)}: "
                              f"{' '.join(str(exc).split())[:200]}") from None
    with mlflow.start_run(run_name=run_name, tags=tags or {}):
        yield mlflow


def metric_dict(table: Any, prefix: str = "") -> dict[str, float]:
    """Flatten an evaluation table (``scenario == "all"`` rows) to ``{prefix}{model}.h{h}.{m}``."""
    out = {}
    rows = table[table["scenario"] == "all"]
    for r in rows.itertuples():
        for m in ("mae", "rmse", "mape", "pinball", "coverage_80", "skill", "mae_s"):
            value = getattr(r, m, None)
            if value is not None and value == value:
                out[f"{prefix}{r.model}.h{r.horizon}.{m}"] = float(value)
    return out


def _requirements(kind: str) -> list[str]:
    names = ["numpy", "pandas", "pyarrow", "scikit-learn"]
    names += {"lgbm": ["lightgbm"], "seq": ["torch"]}.get(kind, [])
    reqs = []
    for name in names:
        try:
            reqs.append(f"{name}=={importlib_metadata.version(name)}")
        except importlib_metadata.PackageNotFoundError:
            reqs.append(name)
    return reqs


def _plain(frame: Any) -> Any:
    """Categorical columns as strings (MLflow schemas have no categorical type)."""
    import pandas as pd

    cats = [c for c in frame.columns if isinstance(frame[c].dtype, pd.CategoricalDtype)]
    return frame.astype({c: str for c in cats}) if cats else frame


def log_model(mlflow: Any, model_dir: str | Path, sample: Any, registered_name: str | None,
              alias: str | None) -> dict[str, Any]:
    """Log the model directory as a pyfunc model (with signature); register and alias it."""
    from mlflow.models import infer_signature

    from bubblecast.forecast.modeldir import load_model

    model = load_model(model_dir)
    sample = _plain(sample.reset_index(drop=True))
    signature = infer_signature(sample, _plain(model.predict(sample)))
    code = Path(__file__).with_name("pyfunc_model.py")
    with contextlib.redirect_stderr(io.StringIO()):  # "Successfully registered model ..."
        info = mlflow.pyfunc.log_model(
            name="model", python_model=str(code), artifacts={"model_dir": str(model_dir)},
            signature=signature, pip_requirements=_requirements(model.kind),
            registered_model_name=registered_name)
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


def download_model(uri: str, dest: str | Path, tracking_uri: str | None = None) -> Path:
    """Download a logged model's bubblecast directory into ``dest``; returns that directory."""
    _quiet()
    import mlflow

    mlflow.set_tracking_uri(resolve_tracking_uri(tracking_uri))
    try:
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(dest)))
    except Exception as exc:
        raise BubblecastError(f"{uri}: cannot load the model from "
                              f"{resolve_tracking_uri(tracking_uri)} "
                              f"({type(exc).__name__}: {' '.join(str(exc).split())[:160]})"
                              ) from None
    found = sorted(local.rglob("model.json"))
    if not found:
        raise BubblecastError(f"{uri}: the logged model holds no bubblecast model directory")
    return found[0].parent
