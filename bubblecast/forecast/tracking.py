"""MLflow tracking and registry for ``train`` and ``evaluate`` (mlflow imported lazily).

The model directory is logged by :func:`bubblecast.forecast.modeldir.log_model` and read back by
:func:`download_model` (``modeldir.load_model`` of a ``models:/`` or ``runs:/`` URI); this
module never imports ``modeldir``. Tracking store: ``--tracking-uri``, else
``MLFLOW_TRACKING_URI``, else a SQLite file ``mlflow.db`` in the working directory
(:data:`DEFAULT_TRACKING_URI`; artifacts then go to ``./mlruns``, MLflow's default for a
database store). Models are logged as a pyfunc "model from code" (``pyfunc_model.py``) carrying
the bubblecast model directory as an artifact, with a signature and explicit pip requirements
(no environment inference, no pickle), then registered and addressed by alias, e.g.
``models:/bubblecast-forecaster@champion``.
"""

from __future__ import annotations

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


def quiet_mlflow() -> None:
    """Keep MLflow's INFO logs, progress bars and hints off the terminal."""
    import logging
    import warnings

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "ERROR")
    import mlflow  # noqa: F401  (configures its loggers on import; override them after)

    for name in ("mlflow", "alembic", "alembic.runtime.migration"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=UserWarning, module=r"mlflow(\..*)?")


def create_experiment(tracking_uri: str, name: str, artifact_location: str | Path) -> str:
    """Create experiment ``name`` on the store at ``tracking_uri`` with its artifacts under
    ``artifact_location`` (a folder), before any run, so that they do not land in the
    working directory's ``./mlruns``; returns its id."""
    quiet_mlflow()
    import mlflow

    return str(mlflow.MlflowClient(tracking_uri=tracking_uri).create_experiment(
        name, artifact_location=Path(artifact_location).absolute().as_uri()))


@contextmanager
def mlflow_run(tracking_uri: str | None, run_name: str, tags: dict[str, str] | None = None,
               experiment: str = DEFAULT_EXPERIMENT) -> Iterator[Any]:
    """An active MLflow run on the resolved store; yields the ``mlflow`` module."""
    quiet_mlflow()
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


def pip_requirements(kind: str) -> list[str]:
    """Pinned pip requirements of a logged model of ``kind`` (installed versions)."""
    names = ["numpy", "pandas", "pyarrow", "scikit-learn"]
    names += {"lgbm": ["lightgbm"], "seq": ["torch"], "cost": ["lightgbm"]}.get(kind, [])
    reqs = []
    for name in names:
        try:
            reqs.append(f"{name}=={importlib_metadata.version(name)}")
        except importlib_metadata.PackageNotFoundError:
            reqs.append(name)
    return reqs


def plain_frame(frame: Any) -> Any:
    """Categorical columns as strings (MLflow schemas have no categorical type)."""
    import pandas as pd

    cats = [c for c in frame.columns if isinstance(frame[c].dtype, pd.CategoricalDtype)]
    return frame.astype({c: str for c in cats}) if cats else frame


def download_model(uri: str, dest: str | Path, tracking_uri: str | None = None) -> Path:
    """Download a logged model's bubblecast directory into ``dest``; returns that directory."""
    quiet_mlflow()
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
