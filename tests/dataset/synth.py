"""Small synthetic events with known structure: a drifting rank, periodic spikes, noise.

Used by the dataset and forecast tests (and as a fallback by the benchmarks) so they do not
depend on the simulator. Vectorised: a million ops take well under a second.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from bubblecast.telemetry import RunMeta, from_frame
from bubblecast.telemetry.events import Events


def speed_factors(kind: str, steps: int, ranks: int, rng: np.random.Generator) -> np.ndarray:
    """(steps, ranks) slowdown factors (1 = nominal) for a scenario ``kind``."""
    t = np.arange(steps)[:, None].astype(np.float64)
    speed = np.ones((steps, ranks))
    slow = int(rng.integers(ranks))
    if kind in ("drift", "mixed"):
        amp = rng.uniform(0.2, 0.5)
        speed[:, slow] *= 1.0 + amp * np.clip((t[:, 0] - steps * 0.2) / (steps * 0.6), 0, 1)
    if kind in ("periodic", "mixed"):
        period = int(rng.integers(7, 13))
        phase = int(rng.integers(period))
        spiky = (t[:, 0] % period) == phase
        speed[spiky, (slow + 1) % ranks] *= rng.uniform(1.8, 2.5)
    if kind in ("step", "mixed"):
        at = int(rng.integers(steps // 3, 2 * steps // 3))
        speed[at:, (slow + 2) % ranks] *= rng.uniform(1.5, 2.0)
    return speed


def make_events(runs: int = 2, steps: int = 120, stages: int = 4, replicas: int = 1,
                microbatches: int = 4, kind: str = "mixed", noise: float = 0.03,
                tokens: bool = False, layers: bool = True, comm_ops: bool = True,
                seed: int = 0, prefix: str = "run") -> Events:
    """Events of ``runs`` runs: F and B per microbatch per rank (plus SEND_F when ``comm_ops``).

    Compute time = layers x base x speed x lognormal(noise) (x tokens/512 with ``tokens``);
    the ground-truth speed goes in the ``speed`` column, the scenario in the run metadata.
    """
    rng = np.random.default_rng(seed)
    frames, metas = [], {}
    for r in range(runs):
        run_id = f"{prefix}{r}"
        ranks = stages * replicas
        speed = speed_factors(kind, steps, ranks, rng)
        partition = [2] * stages
        s, rk, mb, op = np.meshgrid(np.arange(steps), np.arange(ranks), np.arange(microbatches),
                                    np.arange(2), indexing="ij")
        s, rk, mb, op = s.ravel(), rk.ravel(), mb.ravel(), op.ravel()
        stage, replica = rk % stages, rk // stages
        base = np.where(op == 0, 1e-3, 2e-3) * np.asarray(partition)[stage]
        dur = base * speed[s, rk] * rng.lognormal(0.0, noise, size=len(s))
        cols = {"run_id": run_id, "step": s, "rank": rk, "stage": stage, "replica": replica,
                "chunk": 0, "microbatch": mb, "op": np.where(op == 0, "F", "B"),
                "start_s": (mb * 2 + op) * 3e-3, "duration_s": dur, "speed": speed[s, rk]}
        if tokens:
            tok = rng.integers(128, 1024, size=(steps, replicas, microbatches))
            t = tok[s, replica, mb]
            cols["tokens"] = t.astype(np.int64)
            cols["duration_s"] = dur * t / 512.0
        if layers:
            cols["layers"] = np.asarray(partition, dtype=np.int32)[stage]
        frame = pd.DataFrame(cols)
        if comm_ops:
            comm = frame.loc[frame["op"] == "F"].copy()
            comm["op"] = "SEND_F"
            comm["duration_s"] = 1e-4
            frame = pd.concat([frame, comm], ignore_index=True)
        frames.append(frame)
        metas[run_id] = RunMeta(schedule="1f1b", stages=stages, microbatches=microbatches,
                                replicas=replicas, partition=partition, source="synthetic",
                                extra={"scenario": kind})
    return from_frame(pd.concat(frames, ignore_index=True), metas)
