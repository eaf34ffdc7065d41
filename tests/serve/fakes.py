"""Fake forecasters and request builders for the service tests.

``ScaledLast`` forecasts the last observed delay per work times ``scale`` for every horizon
(p10/p90 at -/+10%), so a test can compute every expected number by hand. A model directory for
it is a ``model.json`` of ``{"name", "scale", "load_delay_s"}``, loaded by :func:`load_fake`.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import numpy as np


class ScaledLast:
    """p50 = scale x the last delay per work; p10 / p90 = 0.9 / 1.1 x p50."""

    horizons: tuple[int, ...] | None = None

    def __init__(self, scale: float = 1.0, min_window: int = 2,
                 horizons: tuple[int, ...] | None = None) -> None:
        self.scale = scale
        self.min_window = min_window
        self.horizons = horizons

    def predict_window(self, window, horizons: list[int]) -> np.ndarray:
        last = window.delay[-1] * self.scale
        q = np.stack([last * 0.9, last, last * 1.1], axis=-1)
        return np.repeat(q[:, None, :], len(horizons), axis=1)


class Broken(ScaledLast):
    """Returns NaN: the service must answer 422, never 500."""

    def predict_window(self, window, horizons: list[int]) -> np.ndarray:
        return np.full((window.stages, len(horizons), 3), np.nan)


def write_model_dir(path: Path, scale: float = 1.0, load_delay_s: float = 0.0,
                    name: str = "fake", spread: float | None = None) -> Path:
    """A fake model directory. With ``spread``, a second file ``spread.json`` holds the p10/p90
    spread (like a booster file beside ``model.json``) and ``model.json`` lists it with its
    sha256 (the manifest a model directory carries)."""
    path.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"name": name, "scale": scale, "load_delay_s": load_delay_s}
    if spread is not None:
        data = json.dumps({"spread": spread}).encode()
        (path / "spread.json").write_bytes(data)
        doc.update(files=["spread.json"], sha256={"spread.json": hashlib.sha256(data).hexdigest()})
    tmp = path / "model.json.tmp"
    tmp.write_text(json.dumps(doc))
    tmp.replace(path / "model.json")
    return path


class _Loaded(ScaledLast):
    def __init__(self, spec: dict[str, Any], spread: float = 0.1) -> None:
        super().__init__(float(spec["scale"]))
        self.name = spec.get("name", "fake")
        self.spread = spread
        self.metrics = {"mae_h1": 0.1, "scale": float(spec["scale"])}

    def predict_window(self, window, horizons: list[int]) -> np.ndarray:
        last = window.delay[-1] * self.scale
        q = np.stack([last * (1 - self.spread), last, last * (1 + self.spread)], axis=-1)
        return np.repeat(q[:, None, :], len(horizons), axis=1)


def load_fake(uri: str) -> ScaledLast:
    """Loader for ``ModelSource(dir, loader=load_fake)``; sleeps ``load_delay_s`` first, then
    reads ``spread.json`` when ``model.json`` lists it (no checks of its own: consistency is
    the model source's job)."""
    spec = json.loads((Path(uri) / "model.json").read_text())
    time.sleep(float(spec.get("load_delay_s", 0.0)))
    spread = 0.1
    if "spread.json" in spec.get("files", []):
        spread = float(json.loads((Path(uri) / "spread.json").read_text())["spread"])
    return _Loaded(spec, spread)


def slow_copy(src: Path, dst: Path, pause_s: float,
              order: tuple[str, ...] = ("model.json", "spread.json")) -> None:
    """``cp src/* dst/`` done slowly: each file rewritten in place (truncated, half written,
    a pause, the rest), with a longer pause between files."""
    for k, name in enumerate(order):
        if k:
            time.sleep(4 * pause_s)
        data = (src / name).read_bytes()
        with open(dst / name, "wb") as fh:
            fh.write(data[: len(data) // 2])
            fh.flush()
            time.sleep(pause_s)
            fh.write(data[len(data) // 2:])


def forecast_request(stages: int = 4, steps: int = 8, microbatches: int = 8,
                     slow_stage: int | None = None, horizons: tuple[int, ...] = (1, 5),
                     schedule: str = "1f1b", seed: int = 0) -> dict[str, Any]:
    """A valid forecast request; ``slow_stage`` takes twice the others' compute."""
    rng = np.random.default_rng(seed)
    ranks = []
    for s in range(stages):
        base = 2.0 if s == slow_stage else 1.0
        ranks.append({"rank": 10 + s, "stage": s,
                      "compute_s": (base * (1 + 0.01 * rng.random(steps))).round(6).tolist()})
    return {"pipeline": {"schedule": schedule, "stages": stages, "microbatches": microbatches},
            "horizons": list(horizons), "ranks": ranks}


def recommend_request(stages: int = 4, layers_per_stage: int = 4, **kw: Any) -> dict[str, Any]:
    req = forecast_request(stages=stages, **kw)
    req["partition"] = [layers_per_stage] * stages
    req["layer_costs"] = [1.0] * (layers_per_stage * stages)
    return req


class TokenAware(ScaledLast):
    """Reads the tokens known ahead the way a feature model does: one value per horizon it is
    asked, in that order (``zip(strict=True)``), so misaligned tokens fail or move answers.
    p50 at horizon h = scale x last delay x next_tokens[h] / last tokens x (1 + h / 100)."""

    def __init__(self, scale: float = 1.0, min_window: int = 60,
                 horizons: tuple[int, ...] | None = (1, 5, 10)) -> None:
        super().__init__(scale, min_window, horizons)

    def predict_window(self, window, horizons: list[int]) -> np.ndarray:
        last = window.delay[-1] * self.scale  # (P,)
        ratios = np.ones((len(horizons), window.stages))
        if window.next_tokens is not None and window.tokens is not None:
            for i, (_, ahead) in enumerate(zip(horizons, window.next_tokens, strict=True)):
                ratios[i] = np.where(np.isfinite(ahead), ahead, window.tokens[-1]) \
                    / window.tokens[-1]
        p50 = last[:, None] * ratios.T * (1 + np.asarray(horizons)[None, :] / 100)
        return np.stack([p50 * 0.9, p50, p50 * 1.1], axis=-1)


def token_request(stages: int = 1, steps: int = 60, horizons=(1, 5),
                  next_tokens=(100.0, 100.0), seed: int = 0) -> dict[str, Any]:
    """A recommend request whose ranks carry tokens (and tokens known ahead)."""
    req = recommend_request(stages=stages, layers_per_stage=2, steps=steps,
                            horizons=tuple(horizons), seed=seed)
    rng = np.random.default_rng(seed + 1)
    tokens = rng.integers(50, 150, steps).astype(float).tolist()
    for r in req["ranks"]:
        r["tokens"] = tokens
    req["next_tokens"] = list(next_tokens)
    return req
