"""bubblecast works installed from a wheel, outside the repository.

Builds the sdist and, from it, the wheel (``python -m build --no-isolation``; ``--builder pip``
uses ``pip wheel --no-deps --no-build-isolation`` instead) from the working tree (``--ref REF``:
from that git commit, ``git archive``) into a temporary folder, installs the wheel with
``--no-deps --no-index`` into a fresh virtual environment (``venv`` without system
site-packages), and runs ``bubblecast demo --quick`` there from an empty folder. Exit 0 when the
demo exits 0, every stage reports success (a record and no ``skipped``), bubblecast was imported
from the fresh environment and the real-trace stage read the trace the wheel carries; 1
otherwise. Prints one table row per step.

The fresh environment gets bubblecast from the wheel only. Its dependencies (torch, pandas,
LightGBM, MLflow, ...) are not downloaded again: a ``.pth`` file appends the site-packages of the
interpreter running this script (the repository's ``.venv``) to its ``sys.path``, after its
own site-packages. A ``.pth`` line only adds a folder, so that environment's editable
bubblecast (an import hook installed by its own ``.pth`` file) stays out. No network.

    .venv/bin/python tools/check_wheel.py                # 2 to 5 minutes on 2 cores
    .venv/bin/python tools/check_wheel.py --keep /tmp/wc # keep the wheel, venv and demo output
    .venv/bin/python tools/check_wheel.py --ref HEAD     # the last commit, not the working tree
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import venv
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: What the demo's real-trace stage must read: the wheel's copy (bubblecast/_bundled/...).
BUNDLED_TRACE = Path("bubblecast") / "_bundled" / "data" / "megatron-ops" / "trace-ST.parquet"
#: Environment variables that would let the fresh environment see the checkout or its settings.
DROPPED_ENV = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "MLFLOW_TRACKING_URI")


@dataclass
class Step:
    """One row of the table: a step's name, whether it passed, a short detail, its seconds."""

    name: str
    ok: bool
    detail: str
    seconds: float


@dataclass
class WheelCheck:
    """Every step of one check, the wheel built and the demo's ``demo.json`` (None if absent)."""

    steps: list[Step] = field(default_factory=list)
    wheel: Path | None = None
    demo: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return bool(self.steps) and all(s.ok for s in self.steps)

    def table(self) -> str:
        rows = [("step", "result", "seconds", "detail")] + [
            (s.name, "ok" if s.ok else "FAILED", f"{s.seconds:.1f}", s.detail) for s in self.steps]
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        return "\n".join(" | ".join([*(c.ljust(w) for c, w in zip(r[:3], widths, strict=True)),
                                     r[3]]) for r in rows)


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None,
         timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)


def _tail(proc: subprocess.CompletedProcess[str], lines: int = 15) -> str:
    return "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-lines:])


def export_ref(ref: str, dest: Path) -> Path:
    """The files of git ``ref`` of this repository, written to ``dest`` (``git archive``)."""
    tar = dest.with_suffix(".tar")
    proc = _run(["git", "-C", str(ROOT), "archive", "--format=tar", "-o", str(tar), ref], ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"git archive {ref} failed:\n{_tail(proc)}")
    with tarfile.open(tar) as archive:
        archive.extractall(dest, filter="data")
    tar.unlink()
    return dest


def build_wheel(dist: Path, builder: str = "build", source: Path = ROOT) -> Path:
    """Build bubblecast's wheel from ``source`` into ``dist`` (``build``: sdist, then the wheel
    from the sdist; ``pip``: the wheel straight from the tree); returns its path. RuntimeError
    on failure."""
    if builder == "build":
        cmd = [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(source)]
    elif builder == "pip":
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
               "--wheel-dir", str(dist), str(source)]
    else:
        raise ValueError(f"builder must be 'build' or 'pip', got {builder!r}")
    proc = _run(cmd, source)
    wheels = sorted(dist.glob("bubblecast-*.whl"))
    if proc.returncode != 0 or len(wheels) != 1:
        raise RuntimeError(f"{' '.join(cmd[2:4])} failed (rc {proc.returncode}):\n{_tail(proc)}")
    return wheels[0]


def fresh_env(where: Path, wheel: Path) -> Path:
    """A new venv at ``where`` (no system site-packages, no pip of its own) with ``wheel``
    installed by this interpreter's pip (``--no-deps --no-index``) and this interpreter's
    site-packages appended to its path for the dependencies; returns its ``bin`` folder."""
    venv.EnvBuilder(with_pip=False, system_site_packages=False, clear=True).create(where)
    bindir = where / ("Scripts" if os.name == "nt" else "bin")
    python = bindir / "python"
    proc = _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                 "--no-index", "--no-cache-dir", str(wheel)], where)
    if proc.returncode != 0:
        raise RuntimeError(f"pip install of {wheel.name} failed:\n{_tail(proc)}")
    site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                where).stdout.strip()
    deps = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (Path(site) / "zz_bubblecast_check_deps.pth").write_text("\n".join(deps) + "\n")
    return bindir


def _clean_env(bindir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
    env["PATH"] = os.pathsep.join([str(bindir), env.get("PATH", "")])
    return env


def _import_step(bindir: Path, run_dir: Path, env: dict[str, str]) -> Step:
    t0 = time.perf_counter()
    proc = _run([str(bindir / "python"), "-c", "import bubblecast; print(bubblecast.__file__)"],
                run_dir, env)
    where = Path(proc.stdout.strip() or ".").resolve()
    inside = proc.returncode == 0 and bindir.parent.resolve() in where.parents
    return Step("import", inside, str(where) if proc.returncode == 0 else _tail(proc, 3),
                time.perf_counter() - t0)


def demo_steps(doc: dict[str, Any], venv_dir: Path) -> list[Step]:
    """One step per demo stage from its ``demo.json``: ok when it has a record that was not
    skipped; the real-trace stage must also have read the wheel's own trace."""
    steps = []
    for name, record in doc.get("stages", {}).items():
        seconds = float(doc.get("stage_seconds", {}).get(name, 0.0))
        skipped = record.get("skipped") if isinstance(record, dict) else "no record"
        ok, detail = skipped is None, f"skipped: {skipped}" if skipped else ""
        if name == "megatron" and ok:
            trace = Path(record.get("trace", ""))
            ok = (trace.is_relative_to(venv_dir.resolve())
                  and trace.parts[-len(BUNDLED_TRACE.parts):] == BUNDLED_TRACE.parts)
            detail = f"trace {'from the wheel' if ok else 'NOT from the wheel'}: {trace}"
        steps.append(Step(f"demo: {name}", ok, detail, seconds))
    return steps


def check_wheel(work: Path, builder: str = "build", ref: str | None = None,
                timeout: float = 1800) -> WheelCheck:
    """Build (from the working tree, or from git ``ref``), install into ``work/venv`` and run
    the quick demo in the empty ``work/run``."""
    result, t0 = WheelCheck(), time.perf_counter()
    try:
        source = ROOT if ref is None else export_ref(ref, work / "src")
        result.wheel = build_wheel(work / "dist", builder, source)
        size = result.wheel.stat().st_size / 2**20
        result.steps.append(Step(f"build ({builder}, {ref or 'working tree'})", True,
                                 f"{result.wheel.name}, {size:.1f} MiB",
                                 time.perf_counter() - t0))
        t0 = time.perf_counter()
        bindir = fresh_env(work / "venv", result.wheel)
        result.steps.append(Step("install", True, f"fresh venv {work / 'venv'}",
                                 time.perf_counter() - t0))
    except RuntimeError as exc:
        result.steps.append(Step("build/install", False, str(exc), time.perf_counter() - t0))
        return result
    run_dir = work / "run"
    run_dir.mkdir()
    env = _clean_env(bindir)
    result.steps.append(_import_step(bindir, run_dir, env))
    t0 = time.perf_counter()
    proc = _run([str(bindir / "bubblecast"), "demo", "--quick", "--out", "demo"], run_dir, env,
                timeout)
    summary = run_dir / "demo" / "demo.json"
    result.demo = json.loads(summary.read_text()) if summary.is_file() else None
    result.steps.append(Step("demo --quick", proc.returncode == 0 and result.demo is not None,
                             f"rc {proc.returncode}" + ("" if proc.returncode == 0 else
                                                       "\n" + _tail(proc)),
                             time.perf_counter() - t0))
    if result.demo is not None:
        result.steps += demo_steps(result.demo, work / "venv")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--builder", choices=("build", "pip"), default="build",
                        help="python -m build (sdist, then wheel) or pip wheel")
    parser.add_argument("--ref", default=None,
                        help="build from this git ref (git archive) instead of the working tree")
    parser.add_argument("--keep", type=Path, default=None,
                        help="work in this new folder and keep it (default: a temporary one)")
    args = parser.parse_args(argv)
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=False)
        result = check_wheel(args.keep.resolve(), args.builder, args.ref)
    else:
        with tempfile.TemporaryDirectory(prefix="bubblecast-wheel-") as tmp:
            result = check_wheel(Path(tmp), args.builder, args.ref)
    print(result.table())
    print("wheel check:", "passed" if result.ok else "FAILED")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
