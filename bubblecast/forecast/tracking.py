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

A logged model runs where bubblecast is not installed: its ``code/`` holds bubblecast's
source (:func:`package_source`, MLflow's ``code_paths``), its requirements are the libraries
that source needs (:func:`pip_requirements`; not bubblecast itself, which no package index
is known to serve: an environment MLflow builds from the requirements would fail on it) and
its MLflow metadata records ``bubblecast_version``. A forecaster's
signature (:func:`forecaster_signature`) lists only the columns the model reads
(:func:`forecaster_inputs`), as doubles, so the extra columns of a features file (keys,
targets, the scenario) are dropped before prediction whatever their dtype.
"""

from __future__ import annotations

import os
import shutil
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
    """Pinned pip requirements of a logged model of ``kind`` (installed versions): the
    libraries bubblecast's load and predict path imports (bubblecast itself travels as code,
    :func:`package_source`)."""
    names = ["numpy", "pandas", "pyarrow", "scikit-learn", "scipy"]
    names += {"lgbm": ["lightgbm"], "seq": ["torch"], "cost": ["lightgbm"]}.get(kind, [])
    reqs = []
    for name in names:
        try:
            reqs.append(f"{name}=={importlib_metadata.version(name)}")
        except importlib_metadata.PackageNotFoundError:
            reqs.append(name)
    return reqs


def package_source(dest: str | Path) -> Path:
    """Copy the bubblecast package's source (no bytecode, no bundled sample data) into
    ``dest/bubblecast``; returns that folder, for MLflow's ``code_paths``."""
    src = Path(__file__).resolve().parents[1]
    target = Path(dest) / "bubblecast"
    shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc",
                                                                "_bundled"))
    return target


def forecaster_inputs(model: Any) -> list[str]:
    """The features-frame columns a fitted forecaster reads to predict: its inputs (shared
    and per-horizon), the anchor it scales by, ``f_tokens_ratio`` (the conformal group) for
    a model with an anchor, and a seasonal baseline's ``f_u_lag0`` fall-back; sorted."""
    from bubblecast.dataset.online_frame import FastFeatures
    from bubblecast.forecast.base import ANCHORS

    need = set(FastFeatures.needed(model))
    anchor = getattr(model, "anchor", None)
    if anchor is not None:
        need |= {ANCHORS[anchor], "f_tokens_ratio"}
    if getattr(model, "kind", None) == "seasonal_naive":
        need.add("f_u_lag0")
    return sorted(need)


def wide_quantiles(preds: dict[int, Any]) -> Any:
    """``{h: (n, 3) array}`` as one row per input row: ``p10_h{h}``, ``p50_h{h}``,
    ``p90_h{h}`` for each horizon (the pyfunc face's output)."""
    import numpy as np
    import pandas as pd

    out = {}
    for h, q in preds.items():
        q = np.sort(np.asarray(q, dtype=np.float64), axis=1)
        for j, name in enumerate(("p10", "p50", "p90")):
            out[f"{name}_h{h}"] = q[:, j]
    return pd.DataFrame(out)


def numeric_inputs(frame: Any, columns: list[str]) -> Any:
    """``frame``'s ``columns`` as float64 (nullable and Arrow numbers too; missing values
    NaN), in that order; one-line error naming a column that is absent or not numeric."""
    import numpy as np
    import pandas as pd

    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise BubblecastError(f"model input: column '{missing[0]}' is missing")
    out = {}
    for c in columns:
        try:
            out[c] = frame[c].to_numpy(dtype=np.float64, na_value=np.nan)
        except (TypeError, ValueError):
            raise BubblecastError(f"model input: column '{c}' is not numeric "
                                  f"({frame[c].dtype})") from None
    return pd.DataFrame(out, index=range(len(frame)))


def forecaster_signature(model: Any, inputs: list[str]) -> Any:
    """MLflow signature of a forecaster's pyfunc face: ``inputs`` as required doubles, the
    :func:`wide_quantiles` columns out, and a ``horizons`` parameter (default: all)."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, DataType, ParamSchema, ParamSpec, Schema

    hz = [int(h) for h in model.horizons_]
    outputs = [f"{q}_h{h}" for h in hz for q in ("p10", "p50", "p90")]
    return ModelSignature(
        inputs=Schema([ColSpec(DataType.double, c) for c in inputs]),
        outputs=Schema([ColSpec(DataType.double, c) for c in outputs]),
        params=ParamSchema([ParamSpec("horizons", DataType.long, hz, shape=(-1,))]))


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
