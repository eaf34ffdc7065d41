"""The demo's live stage: a 2-process CPU pipeline under an emulated slowdown, closed loop.

Each policy of ``live_policies`` trains the same seeded MLP pipeline (``live_layers`` equal
layers on 2 ranks, gloo, SGD, 64 samples per step in 4 microbatches: the set-up of
``benchmarks/bench_live.py``) while the last rank slows down as ``live_inject`` says; the
controller (``bubblecast.runtime.control_job``, what ``bubblecast run`` uses) decides every
few steps and repartitions live. Per policy: step times, throughput over the slowed period,
the actions taken, control overhead. When the controller is not installed the stage records
a static run with ``collect``'s launcher instead and says so.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from bubblecast.demo.config import DemoConfig
from bubblecast.demo.pipeline import champion_dir
from bubblecast.demo.progress import Progress
from bubblecast.demo.stages import StageContext, Workspace

STAGES = 2
MICROBATCHES = 4


def controller_available() -> bool:
    """Whether the closed-loop controller is importable (no torch import)."""
    import importlib.util

    return all(importlib.util.find_spec(f"bubblecast.runtime.{m}") is not None
               for m in ("control_job", "control_config", "controller"))


def train_config(config: DemoConfig, run_id: str) -> Any:
    from bubblecast.runtime.config import ModelSpec, TrainConfig

    return TrainConfig(model=ModelSpec(kind="mlp", layers=config.live_layers,
                                       hidden=config.live_hidden),
                       stages=STAGES, microbatches=MICROBATCHES, schedule="1f1b",
                       steps=config.live_steps, batch_size=16 * MICROBATCHES, seed=config.seed,
                       optimizer="sgd", lr=1e-3, inject=config.live_inject, run_id=run_id,
                       flush_every=50, layer_cost_every=10)


def slowed_steps(config: DemoConfig) -> tuple[int, int]:
    """[first, last) steps during which the injected slowdown is at full strength."""
    from bubblecast.runtime.inject import parse_inject

    slow = [i for i in parse_inject(config.live_inject) if i.kind == "slowdown"]
    if not slow:
        return 0, config.live_steps
    first = min(i.start + i.ramp for i in slow)
    last = min(config.live_steps, min(i.end if i.end is not None else config.live_steps
                                      for i in slow))
    return min(first, last), last


def ideal_speedup(config: DemoConfig) -> float | None:
    """Best speed-up over static a repartition can give while the slowdown is at full
    strength, if compute set the pace: static's slowest rank against the best integer split."""
    from bubblecast.runtime.inject import parse_inject

    factors = np.ones(STAGES)
    for i in parse_inject(config.live_inject):
        if i.kind == "slowdown":
            factors[i.rank] *= i.factor
    layers = config.live_layers
    even = layers // STAGES
    static = max(factors[0] * even, factors[1] * (layers - even))
    best = min(max(factors[0] * k, factors[1] * (layers - k)) for k in range(1, layers))
    return float(static / best) if best > 0 else None


def _step_times(summary: dict[str, Any]) -> np.ndarray:
    ends = np.asarray(summary.get("step_end_s") or [], dtype=np.float64)
    if ends.size:
        return np.diff(np.r_[0.0, ends])
    return np.full(int(summary["steps"]), float(summary["step_time_s"]))


def _controlled(config: DemoConfig, policy: str, model: str | None, out: Path,
                progress: Progress) -> dict[str, Any]:
    from bubblecast.runtime.control_config import ControllerConfig
    from bubblecast.runtime.control_job import launch_controlled, write_actions

    control = ControllerConfig(policy=policy, model=model if policy == "predictive" else None)
    train = train_config(config, f"live-{policy}")
    summary = launch_controlled(train, control, out / f"{policy}.parquet",
                                on_progress=lambda s, t, _l: progress.advance(s, t),
                                timeout=600)
    write_actions(out / f"{policy}-actions.json", summary, control, train.run_id)
    return summary


def _collected(config: DemoConfig, out: Path, progress: Progress) -> dict[str, Any]:
    """Fallback without the controller: the same run, static, through ``collect``'s launcher."""
    import shutil
    import tempfile

    from bubblecast.runtime.launch import failure_message, launch, write_job

    train = train_config(config, "live-static")
    job = Path(tempfile.mkdtemp(prefix=".live-", dir=out))
    try:
        write_job(job, train, out=str((out / "static.parquet").resolve()), progress=True)
        code = launch(job, STAGES, on_progress=lambda s, t, _l: progress.advance(s, t),
                      timeout=600)
        if code != 0:
            raise RuntimeError(f"live run failed ({failure_message(job)})")
        summary = json.loads((job / "summary.json").read_text())
    finally:
        shutil.rmtree(job, ignore_errors=True)
    summary.update({"decisions": [], "actions_taken": 0, "first_action_step": None,
                    "control_pct_of_wall": None})
    return summary


def live_stage(config: DemoConfig, ws: Workspace, ctx: StageContext,
               progress: Progress) -> None:
    """Run the live pipeline once per policy and summarise throughput and actions."""
    from bubblecast.demo.plots import plot_live

    if not config.live:
        ctx.result["skipped"] = "live stage disabled in this configuration"
        return
    closed = controller_available()
    policies = list(config.live_policies) if closed else ["static"]
    model = str(champion_dir(ws)) if config.live_model == "champion" else None
    lo, hi = slowed_steps(config)
    runs: dict[str, Any] = {}
    series: dict[str, np.ndarray] = {}
    for policy in policies:
        progress.note(f"{policy} policy, {config.live_steps} steps on {STAGES} processes")
        summary = _controlled(config, policy, model, ctx.dir, progress) if closed \
            else _collected(config, ctx.dir, progress)
        times = _step_times(summary)
        series[policy] = times
        slow = times[lo:hi] if hi > lo else times
        moves = [{"step": a.get("step"), "from": a.get("from"), "to": a.get("to")}
                 for a in summary.get("actions", [])
                 if a.get("ok", True) and a.get("from") != a.get("to")]
        runs[policy] = {
            "events": f"live/{policy}.parquet", "mean_step_s": float(times.mean()),
            "slowed_step_s": float(slow.mean()),
            "slowed_steps_per_s": float(1.0 / slow.mean()) if slow.mean() > 0 else None,
            "actions_taken": int(summary.get("actions_taken", len(moves))),
            "first_action_step": summary.get("first_action_step"), "moves": moves,
            "final_partition": summary.get("partition"),
            "control_pct_of_wall": summary.get("control_pct_of_wall"),
            "forecaster": summary.get("forecaster"),
            "first_loss": _first(summary.get("losses")), "last_loss": _last(summary.get("losses")),
        }
    if "static" in runs:
        base = runs["static"]["slowed_step_s"]
        for r in runs.values():
            r["speedup_vs_static"] = base / r["slowed_step_s"] if r["slowed_step_s"] else None
    progress.note("plotting")
    plot_live(series, (lo, hi), ctx.dir / "live.png", config.live_inject)
    ctx.result.update({
        "closed_loop": closed, "policies": runs, "slowed": [lo, hi], "steps": config.live_steps,
        "inject": config.live_inject, "layers": config.live_layers, "stages": STAGES,
        "ideal_speedup": ideal_speedup(config),
        "model": model if closed and "predictive" in policies else None,
        "figure": "live/live.png",
        "note": None if closed else "closed loop pending: the controller "
        "(bubblecast.runtime.control_job) is not installed; a static run was recorded",
    })


def _first(losses: Any) -> float | None:
    values = list(losses.values()) if isinstance(losses, dict) else list(losses or [])
    return float(values[0]) if values else None


def _last(losses: Any) -> float | None:
    values = list(losses.values()) if isinstance(losses, dict) else list(losses or [])
    return float(values[-1]) if values else None
