"""The demo's local MLflow store: ``<out>/mlflow.db`` (SQLite) with artifacts in ``<out>/mlruns``.

Stages never log into the published database directly: a stage logs into a working copy in
its temporary folder and the copy replaces ``<out>/mlflow.db`` when the stage commits, so an
interrupted stage leaves no half-logged run behind. The ``bubblecast`` experiment keeps its
artifacts under ``<out>/mlruns/<root>``; a fresh store gets a new root and :meth:`prune`
removes the roots no committed store refers to. mlflow is imported inside the methods.
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
import warnings
from pathlib import Path

from bubblecast.errors import BubblecastError

EXPERIMENT = "bubblecast"
MODEL_NAME = "bubblecast-forecaster"


def sqlite_uri(db: Path) -> str:
    """``sqlite:///`` URI of an absolute database path (four slashes on POSIX)."""
    return f"sqlite:///{Path(db).resolve().as_posix()}"


def _quiet() -> None:
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    import mlflow  # noqa: F401  (sets up its loggers on import; quiet them afterwards)

    for name in ("mlflow", "alembic", "alembic.runtime.migration"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=UserWarning, module=r"mlflow(\..*)?")


class DemoStore:
    """The published store of one demo output folder."""

    def __init__(self, out: str | os.PathLike[str]) -> None:
        self.out = Path(out).resolve()
        self.db = self.out / "mlflow.db"
        self.artifacts = self.out / "mlruns"

    @property
    def uri(self) -> str:
        return sqlite_uri(self.db)

    def ui_command(self) -> str:
        """The command that opens the MLflow UI on this store."""
        return f"mlflow ui --backend-store-uri {self.uri}"

    def fresh(self, work: Path) -> tuple[Path, str]:
        """A new empty store in ``work``; returns (its database file, its artifact root).

        Each store file gets a new name: MLflow caches a database engine per URI in the
        process, and a cached engine must never meet a different file under the same name.
        """
        _quiet()
        import mlflow

        root = uuid.uuid4().hex[:12]
        db = Path(work) / f"mlflow-{root}.db"
        uri = sqlite_uri(db)
        location = self.artifacts / root
        location.mkdir(parents=True, exist_ok=True)
        try:
            mlflow.MlflowClient(tracking_uri=uri).create_experiment(
                EXPERIMENT, artifact_location=location.as_uri())
        except Exception as exc:
            raise BubblecastError(f"MLflow store {db}: cannot create it "
                                  f"({' '.join(str(exc).split())[:160]})") from None
        return db, root

    def working_copy(self, work: Path) -> Path:
        """A copy of the published store in ``work`` (a new file name, see :meth:`fresh`)."""
        if not self.db.is_file():
            raise BubblecastError(f"{self.db}: no MLflow store (the train stage makes it)")
        _quiet()
        target = Path(work) / f"mlflow-{uuid.uuid4().hex[:12]}.db"
        shutil.copyfile(self.db, target)
        return target

    def prune(self, keep: str) -> list[str]:
        """Remove artifact roots other than ``keep`` (left by earlier or interrupted runs)."""
        removed = []
        if self.artifacts.is_dir():
            for entry in self.artifacts.iterdir():
                if entry.name != keep:
                    shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() \
                        else entry.unlink(missing_ok=True)
                    removed.append(entry.name)
        return removed
