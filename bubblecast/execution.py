"""Where fleet work runs: in this process (the default) or on Dask (``--cluster``).

Every fleet command maps a plain function over units of work (a run, or a file of runs) and
reduces the results itself; this module only runs the map. ``--cluster local:N`` starts a
``dask.distributed.LocalCluster`` of N single-threaded worker processes, ``--cluster
tcp://HOST:PORT`` joins an existing scheduler; without it the map is a loop in this process,
so the results are the same either way. Dask is the optional ``bubblecast[fleet]`` extra.

A worker that dies mid-task is replaced and the task retried by Dask (up to its
``allowed-failures``); if the task keeps killing workers the job fails with one line. Task
errors that are :class:`~bubblecast.errors.BubblecastError` come back as they are.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from bubblecast.errors import BubblecastError

T = TypeVar("T")
R = TypeVar("R")

#: The error when Dask is not installed.
MISSING_EXTRA = ("--cluster needs Dask, the optional 'fleet' extra: "
                 "pip install 'bubblecast[fleet]'")
_SPEC = re.compile(r"^(?:local:(?P<n>\d+)|(?P<addr>tcp://[^\s:/]+:\d+))$")
#: Dask settings of the local clusters bubblecast starts (:func:`local_cluster`). Dask's nanny
#: sets ``MALLOC_TRIM_THRESHOLD_=65536`` in its workers so that freed memory goes back to the
#: system at once; that also fixes glibc's mmap threshold, so every array over 128 KiB is a
#: fresh mapping, paid in page faults and system time on every build. A task's memory is
#: bounded by its group of runs anyway, so workers keep glibc's default. The statistical
#: profiler (periodic stack samples in every worker) is off: it takes worker CPU.
LOCAL_CLUSTER_CONFIG: dict[str, Any] = {
    "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None,
    "distributed.worker.profile.enabled": False,
}


@dataclass(frozen=True)
class ClusterSpec:
    """A parsed ``--cluster`` value: ``local`` with ``workers`` processes, or ``tcp`` with the
    scheduler ``address``."""

    kind: str
    workers: int = 0
    address: str = ""

    def __post_init__(self) -> None:
        if self.kind not in ("local", "tcp"):
            raise BubblecastError(f"--cluster: unknown kind '{self.kind}'")
        if self.kind == "local" and not 1 <= self.workers <= 512:
            raise BubblecastError(f"--cluster local:N: N must be in 1..512, got {self.workers}")
        if self.kind == "tcp" and not self.address.startswith("tcp://"):
            raise BubblecastError(f"--cluster: expected tcp://HOST:PORT, got '{self.address}'")

    @staticmethod
    def parse(text: str) -> ClusterSpec:
        """``local:N`` or ``tcp://HOST:PORT``; anything else is a one-line error."""
        m = _SPEC.match(text.strip())
        if m is None:
            raise BubblecastError(f"--cluster: expected local:N or tcp://HOST:PORT, got '{text}'")
        if m.group("n") is not None:
            return ClusterSpec("local", workers=int(m.group("n")))
        return ClusterSpec("tcp", address=m.group("addr"))


def _progress(total: int, label: str, enabled: bool) -> Any:
    """A rich progress bar on stderr (shown only on a terminal)."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    console = Console(stderr=True)
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), console=console, transient=True,
                   disable=not (enabled and console.is_terminal))
    bar.start()
    bar.add_task(label, total=total)
    return bar


class Executor:
    """Runs ``fn`` over items in this process, in order (the embedded default)."""

    client: Any = None
    workers: int = 1

    def __init__(self, progress: bool = True) -> None:
        self.progress = progress

    def map(self, fn: Callable[..., R], items: Sequence[T], *args: Any, label: str = "runs",
            **kwargs: Any) -> list[R]:
        """``[fn(item, *args, **kwargs) for item in items]``, with a progress bar."""
        bar = _progress(len(items), label, self.progress)
        out = []
        try:
            for item in items:
                out.append(fn(item, *args, **kwargs))
                bar.advance(bar.task_ids[0])
        finally:
            bar.stop()
        return out


class DaskExecutor(Executor):
    """Runs ``fn`` over items as Dask tasks, one per item; results in item order."""

    def __init__(self, client: Any, progress: bool = True) -> None:
        super().__init__(progress)
        self.client = client
        self.workers = max(1, len(client.scheduler_info(n_workers=-1).get("workers", {})))

    def map(self, fn: Callable[..., R], items: Sequence[T], *args: Any, label: str = "runs",
            **kwargs: Any) -> list[R]:
        from distributed import as_completed

        if not items:
            return []
        futures = self.client.map(fn, list(items), *[[a] * len(items) for a in args],
                                  pure=False, **kwargs)
        index = {f.key: i for i, f in enumerate(futures)}
        out: list[Any] = [None] * len(futures)
        bar = _progress(len(futures), label, self.progress)
        try:
            for future in as_completed(futures):
                out[index[future.key]] = _result(future, items[index[future.key]])
                bar.advance(bar.task_ids[0])
        except BaseException:
            self.client.cancel(futures)
            wait_stopped(self.client, {f.key for f in futures})
            raise
        finally:
            bar.stop()
        return out


def _still_running(keys: set[Any], dask_worker: Any = None) -> int:
    """On a worker: how many of ``keys`` it still executes (a cancelled task included)."""
    state = dask_worker.state
    return sum(ts.key in keys for ts in (*state.executing, *state.long_running))


def wait_stopped(client: Any, keys: set[Any], timeout_s: float = 60.0) -> None:
    """Block until no worker executes any of ``keys``. Cancelling a future does not stop a
    task that is running: it runs to its end, writing what it writes, so the caller must not
    clean up (a failed job's temporary output) before then. Gives up after ``timeout_s`` or
    when the workers cannot be asked."""
    import functools
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            counts = client.run(functools.partial(_still_running, keys))
        except Exception:  # noqa: BLE001 - workers gone or unreachable: nothing to wait for
            return
        if not any(counts.values()):
            return
        time.sleep(0.05)


def _result(future: Any, item: Any) -> Any:
    """A task's result; a task that killed its workers becomes one line naming the item."""
    from distributed.scheduler import KilledWorker

    try:
        return future.result()
    except KilledWorker:
        label = getattr(item, "label", item)
        raise BubblecastError(f"{label}: Dask workers died running this task repeatedly "
                              "(out of memory, or killed); nothing was written") from None


def _client(spec: ClusterSpec) -> Iterator[Any]:
    try:
        import dask  # noqa: F401
        from distributed import Client
    except ImportError:
        raise BubblecastError(MISSING_EXTRA) from None
    if spec.kind == "tcp":
        try:
            client = Client(spec.address, timeout="10s")
        except (OSError, TimeoutError) as exc:
            raise BubblecastError(f"--cluster {spec.address}: cannot reach the Dask scheduler "
                                  f"({' '.join(str(exc).split())})") from None
        with client:
            yield client
        return
    cluster = local_cluster(spec.workers)
    with cluster, Client(cluster) as client:
        try:
            import bokeh  # noqa: F401

            where = client.dashboard_link
        except ImportError:
            where = "not served (install bokeh for the Dask dashboard)"
        print(f"dask: local cluster of {spec.workers} worker processes, scheduler "
              f"{cluster.scheduler_address}, dashboard {where}", file=sys.stderr)
        yield client


def local_cluster(workers: int, **kwargs: Any) -> Any:
    """A ``LocalCluster`` of ``workers`` single-threaded worker processes with
    :data:`LOCAL_CLUSTER_CONFIG` (dashboard on a free port; ``kwargs`` go to LocalCluster)."""
    import logging

    import dask
    from distributed import LocalCluster

    with dask.config.set(LOCAL_CLUSTER_CONFIG):
        return LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                            dashboard_address=":0", silence_logs=logging.ERROR, **kwargs)


@contextmanager
def executor(cluster: str | None, progress: bool = True) -> Iterator[Executor]:
    """The executor of a ``--cluster`` value (None: this process)."""
    if cluster is None:
        yield Executor(progress)
        return
    spec = ClusterSpec.parse(cluster)
    with contextmanager(_client)(spec) as client:
        yield DaskExecutor(client, progress)


def load_runs(paths: Sequence[Any], format: str = "auto", skip_bad: bool = False,
              command: str | None = None, run: str | None = None,
              quiet: bool = False) -> tuple[Any, list[dict[str, Any]]]:
    """Read command-line inputs in this process, unit by unit (a fleet run by run), as one
    ``Events``; and the runs skipped as unreadable (``skip_bad``), each ``{run_id, path,
    error}``. Without ``skip_bad`` an unreadable fleet run fails naming the run and its file.
    ``command`` refuses step-granularity input for a command that needs per-op order.
    ``run``: of a fleet holding that run, read only it. ``quiet``: skipped runs are not
    printed (a worker's caller prints them)."""
    from bubblecast.telemetry.events import Events
    from bubblecast.telemetry.fleet import units_of
    from bubblecast.telemetry.importers import load_events, require_per_op

    parts, skipped = [], []
    units = units_of(list(paths))
    if run is not None and any(u.run_id == run for u in units):
        units = [u for u in units if u.run_id in (None, run)]
    for unit in units:
        try:
            ev = load_events(unit.path, format)
        except BubblecastError as exc:
            if not skip_bad:
                where = f"run '{unit.run_id}': " if unit.run_id is not None else ""
                raise BubblecastError(f"{where}{exc}") from None
            skipped.append({"run_id": unit.run_id, "path": str(unit.path), "error": str(exc)})
            continue
        if command is not None:
            require_per_op(ev, command, unit.source or unit.path)
        parts.append(ev)
    if skipped and not quiet:
        note_skipped(skipped)
    if not parts:
        raise BubblecastError(f"no run could be read ({len(skipped)} skipped)")
    return (parts[0] if len(parts) == 1 else Events.concat(parts)), skipped


def note_skipped(skipped: list[dict[str, Any]]) -> None:
    """One line per skipped run on stderr."""
    for s in skipped:
        print(f"skipped {s['run_id'] or s['path']}: {s['error']}", file=sys.stderr)


def require_dask() -> None:
    """Raise the one-line missing-extra error when Dask is not installed."""
    try:
        import dask  # noqa: F401
        import distributed  # noqa: F401
    except ImportError:
        raise BubblecastError(MISSING_EXTRA) from None


__all__ = ["LOCAL_CLUSTER_CONFIG", "MISSING_EXTRA", "ClusterSpec", "DaskExecutor", "Executor",
           "executor", "load_runs", "local_cluster", "note_skipped", "require_dask"]
