"""``run_demo``: every stage in order, each committed atomically, then the report.

A fresh run (the default) redoes every stage, each one replacing its previous folder only when
it finishes; ``resume=True`` keeps a finished stage whose fingerprint matches (same config
fields, same upstream stages) and redoes the rest, plus everything downstream of a redone
stage. Leftovers of an interrupted run are removed first, and the previous report is removed
before any stage runs, so a report only ever describes the run that wrote it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bubblecast.demo.analysis import megatron_stage, policy_eval_stage
from bubblecast.demo.config import UPSTREAM, DemoConfig
from bubblecast.demo.live import live_stage
from bubblecast.demo.mlstore import DemoStore
from bubblecast.demo.pipeline import (
    dataset_stage,
    forecast_eval_stage,
    simulate_stage,
    train_stage,
)
from bubblecast.demo.progress import Progress
from bubblecast.demo.stages import StageContext, Workspace, dumps

StageFn = Callable[[DemoConfig, Workspace, StageContext, Progress], None]

#: (name, title, function) in the order they run.
STAGES: tuple[tuple[str, str, StageFn], ...] = (
    ("simulate", "Simulate the scenario suite", simulate_stage),
    ("dataset", "Build features and targets", dataset_stage),
    ("train", "Train LightGBM and the sequence model", train_stage),
    ("forecast_eval", "Evaluate forecasters on held-out runs", forecast_eval_stage),
    ("policy_eval", "Evaluate policies offline", policy_eval_stage),
    ("megatron", "Inspect the real Megatron-LM trace", megatron_stage),
    ("live", "Live closed loop on CPU", live_stage),
)
REPORT = "report.md"
SUMMARY = "demo.json"


@dataclass
class DemoResult:
    """Where the demo wrote its report and what each stage recorded."""

    out: Path
    report: Path
    records: dict[str, dict[str, Any]] = field(default_factory=dict)
    seconds: float = 0.0
    reused: list[str] = field(default_factory=list)
    mlflow_ui: str | None = None
    serve: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"out": str(self.out), "report": str(self.report), "seconds": self.seconds,
                "reused": self.reused, "mlflow_ui": self.mlflow_ui, "serve": self.serve,
                "stages": {k: v.get("result", {}) for k, v in self.records.items()}}


def figures(stages: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The forecasting and policy figures of a run, from its stage results (``DemoResult.
    to_json()["stages"]`` or ``demo.json``'s): what must repeat for the same seed."""
    fc, pol, train = stages["forecast_eval"], stages["policy_eval"], stages["train"]
    return {"train": {k: m["metrics"] for k, m in train["models"].items()},
            "forecast_eval": {"table": fc["table"], "baseline": fc["baseline"],
                              "skill_per_scenario": fc["skill_per_scenario"]},
            "policy_eval": {"policies": pol["policies"], "per_run": pol["per_run"]}}


def run_demo(config: DemoConfig, out: str | os.PathLike[str], *, resume: bool = False,
             progress: Progress | None = None, command: str | None = None) -> DemoResult:
    """Run the demo into ``out`` and write ``out/report.md``; returns what it recorded."""
    from bubblecast.demo.report import write_report

    progress = progress or Progress()
    started = time.perf_counter()
    ws = Workspace(out)
    ws.check((SUMMARY, REPORT, "mlflow.db", "mlruns", *(f"{n}/stage.json" for n, _, _ in STAGES)))
    ws.out.mkdir(parents=True, exist_ok=True)
    ws.clean()
    for stale in (REPORT, "report.html", SUMMARY):
        (ws.out / stale).unlink(missing_ok=True)
    fingerprints: dict[str, str] = {}
    redone: set[str] = set()
    result = DemoResult(out=ws.out, report=ws.out / REPORT)
    total = len(STAGES) + 1
    for index, (name, title, fn) in enumerate(STAGES, start=1):
        fingerprint = config.fingerprint(name, fingerprints)
        fingerprints[name] = fingerprint
        progress.stage(index, total, title)
        record = None
        if resume and not (set(UPSTREAM[name]) & redone):
            record = ws.finished(name, fingerprint)
        if record is not None:
            result.reused.append(name)
            progress.finish(title, float(record.get("seconds", 0.0)), True)
        else:
            with ws.stage(name, fingerprint) as ctx:
                fn(config, ws, ctx, progress)
            record = ws.record(name) or {}
            redone.add(name)
            if name == "train" and record.get("result", {}).get("artifact_root"):
                DemoStore(ws.out).prune(record["result"]["artifact_root"])
            progress.finish(title, float(record.get("seconds", 0.0)), False,
                            _note(record.get("result", {})))
        result.records[name] = record
    progress.stage(total, total, "Write the report")
    t0 = time.perf_counter()
    train = result.records["train"].get("result", {})
    if train.get("tracked"):
        store = DemoStore(ws.out)
        result.mlflow_ui = store.ui_command()
        result.serve = (f"bubblecast serve --model {train['champion_uri']} "
                        f"--tracking-uri {store.uri}")
    else:
        champion = ws.out / train["models"][train["champion"]]["dir"]
        result.serve = f"bubblecast serve --model {champion}"
    result.seconds = time.perf_counter() - started
    write_report(result, config, command)
    from bubblecast.telemetry.io import atomic_write_text

    result.seconds = time.perf_counter() - started
    atomic_write_text(ws.out / SUMMARY, dumps({"config": config.to_json(), **result.to_json()}))
    progress.finish("Write the report", time.perf_counter() - t0, False)
    return result


def _note(result: dict[str, Any]) -> str:
    if result.get("skipped"):
        return f"skipped: {result['skipped']}"
    return str(result.get("note") or "")
