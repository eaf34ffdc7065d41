"""What ``bubblecast demo`` runs: one validated dataclass with embedded defaults and presets.

Every number the demo reports follows from this config and its ``seed``; each stage records
the fingerprint of the config fields it reads (and of the stages it reads from), so a resumed
demo reuses a finished stage only when nothing it depends on changed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from bubblecast.errors import BubblecastError

#: Scenarios of the simulated suite (``bubblecast.sim.scenarios``).
DEMO_SCENARIOS: tuple[str, ...] = ("throttle", "failslow", "periodic", "seqlen", "mixed",
                                   "jitter")
#: The real Megatron-LM trace, relative to the repository root (``../shared/data``).
MEGATRON_RELATIVE = Path("..") / "shared" / "data" / "megatron-ops" / "trace-ST.parquet"
POLICIES: tuple[str, ...] = ("static", "reactive", "predictive", "oracle")

#: Config fields each stage reads (its fingerprint); upstream stages are chained separately.
STAGE_FIELDS: dict[str, tuple[str, ...]] = {
    "simulate": ("seed", "scenarios", "runs", "heldout_runs", "steps", "replicas"),
    "dataset": ("horizons", "windows", "lags"),
    "train": ("seed", "holdout", "lgbm_estimators", "lgbm_leaves", "seq_epochs", "seq_hidden",
              "max_train_rows", "track"),
    "forecast_eval": ("seed", "track"),
    "policy_eval": ("policies", "policy_runs"),
    "megatron": ("megatron",),
    "live": ("seed", "live", "live_steps", "live_layers", "live_hidden", "live_inject",
             "live_policies", "live_model"),
}
#: Stages each stage reads from.
UPSTREAM: dict[str, tuple[str, ...]] = {
    "simulate": (), "dataset": ("simulate",), "train": ("dataset",),
    "forecast_eval": ("dataset", "train"), "policy_eval": ("simulate", "train"),
    "megatron": (), "live": ("train",),
}


def default_megatron() -> str | None:
    """The Megatron trace: ``../shared/data/...`` from the working directory, else from the
    repository this package sits in; None when neither exists."""
    here = Path(__file__).resolve().parents[2]
    for base in (Path.cwd(), here):
        candidate = (base / MEGATRON_RELATIVE).resolve()
        if candidate.is_file():
            return str(candidate)
    return None


@dataclass(frozen=True)
class DemoConfig:
    """The demo's workload. ``runs`` / ``heldout_runs``: simulated runs per scenario for
    training and for held-out evaluation (the two sets come from different seeds); ``steps``
    per run; dataset ``horizons``/``windows``/``lags``; model sizes; ``policy_runs``: held-out
    runs the policies are replayed on (0 = all); ``megatron``: the real trace (None skips that
    stage); ``live``: run the CPU closed loop (2 processes) of ``live_steps`` steps of an MLP
    of ``live_layers`` layers ``live_hidden`` wide under the slowdown ``live_inject``
    (``collect --inject`` syntax), once per policy of ``live_policies``; the predictive one
    forecasts with the ``champion`` model trained here or the ``builtin`` trend forecaster."""

    seed: int = 0
    scenarios: tuple[str, ...] = DEMO_SCENARIOS
    runs: int = 5
    heldout_runs: int = 2
    steps: int = 400
    replicas: int = 1
    horizons: tuple[int, ...] = (1, 5, 10)
    windows: tuple[int, ...] = (5, 20, 60)
    lags: int = 32
    holdout: float = 0.2
    lgbm_estimators: int = 300
    lgbm_leaves: int = 31
    seq_epochs: int = 12
    seq_hidden: int = 32
    max_train_rows: int = 60_000
    track: bool = True
    policies: tuple[str, ...] = POLICIES
    policy_runs: int = 0
    megatron: str | None = field(default_factory=default_megatron)
    live: bool = True
    live_steps: int = 240
    live_layers: int = 12
    live_hidden: int = 512
    live_inject: str = "rank=1,factor=2.0,start=60,ramp=40,end=220"
    live_policies: tuple[str, ...] = ("static", "predictive")
    live_model: str = "champion"

    def __post_init__(self) -> None:
        from bubblecast.sim.scenarios import SCENARIOS

        object.__setattr__(self, "scenarios", tuple(self.scenarios))
        object.__setattr__(self, "horizons", tuple(int(h) for h in self.horizons))
        object.__setattr__(self, "windows", tuple(int(w) for w in self.windows))
        object.__setattr__(self, "policies", tuple(self.policies))
        object.__setattr__(self, "live_policies", tuple(self.live_policies))
        unknown = [s for s in self.scenarios if s not in SCENARIOS]
        if not self.scenarios or unknown:
            raise BubblecastError(f"demo config: scenarios must be known names, got "
                                  f"{list(self.scenarios)}")
        for name in ("runs", "heldout_runs", "steps", "replicas", "lgbm_estimators",
                     "lgbm_leaves", "seq_epochs", "seq_hidden", "max_train_rows", "live_steps",
                     "live_layers", "live_hidden"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise BubblecastError(f"demo config: '{name}' must be a positive integer, "
                                      f"got {value!r}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise BubblecastError(f"--seed: must be a non-negative integer, got {self.seed!r}")
        if len(self.scenarios) * self.runs < 4:
            raise BubblecastError("demo config: need at least 4 training runs in all "
                                  "(scenarios x runs) to fit and hold out")
        if self.policy_runs < 0:
            raise BubblecastError(f"demo config: 'policy_runs' must be >= 0, "
                                  f"got {self.policy_runs}")
        if not 0.0 < self.holdout < 1.0:
            raise BubblecastError(f"demo config: 'holdout' must be in (0, 1), got {self.holdout}")
        bad = [p for p in self.policies if p not in POLICIES]
        if bad or not self.policies:
            raise BubblecastError(f"demo config: policies must be among {', '.join(POLICIES)}")
        bad = [p for p in self.live_policies if p not in POLICIES[:3]]
        if bad or not self.live_policies:
            raise BubblecastError(f"demo config: live_policies must be among static, reactive, "
                                  f"predictive, got {list(self.live_policies)}")
        if self.live_model not in ("champion", "builtin"):
            raise BubblecastError(f"demo config: 'live_model' must be champion or builtin, "
                                  f"got '{self.live_model}'")
        self.dataset_config()  # validates horizons, windows and lags
        if self.steps < self.dataset_config().min_steps + 2 * max(self.horizons):
            raise BubblecastError(f"demo config: 'steps' must be at least "
                                  f"{self.dataset_config().min_steps + 2 * max(self.horizons)}"
                                  f" for windows {list(self.windows)} and horizons "
                                  f"{list(self.horizons)}, got {self.steps}")

    def dataset_config(self) -> Any:
        """The :class:`bubblecast.dataset.DatasetConfig` of this demo."""
        from bubblecast.dataset import DatasetConfig

        try:
            return DatasetConfig(horizons=self.horizons, windows=self.windows, lags=self.lags,
                                 max_period=min(30, max(2, self.windows[-1] // 2)))
        except ValueError as exc:
            raise BubblecastError(f"demo config: {exc}") from None

    def with_(self, **changes: Any) -> DemoConfig:
        return replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        for key, value in out.items():
            if isinstance(value, tuple):
                out[key] = list(value)
        return out

    def fingerprint(self, stage: str, upstream: dict[str, str]) -> str:
        """Hash of the fields ``stage`` reads and of its upstream stages' fingerprints."""
        fields = {k: self.to_json()[k] for k in STAGE_FIELDS[stage]}
        if stage == "megatron" and self.megatron is not None:
            p = Path(self.megatron)
            fields["megatron"] = [str(p.resolve()), p.stat().st_size if p.exists() else None]
        doc = {"stage": stage, "fields": fields,
               "upstream": {u: upstream.get(u, "") for u in UPSTREAM[stage]}}
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def preset(name: str, **overrides: Any) -> DemoConfig:
    """``default`` (what ``make demo`` runs), ``quick`` (about a third of the time) or ``tiny``
    (seconds per stage, no live loop and no MLflow; for tests)."""
    if name == "default":
        return DemoConfig(**overrides)
    if name == "quick":
        base: dict[str, Any] = dict(runs=3, heldout_runs=1, steps=240, lgbm_estimators=120,
                                    seq_epochs=5, max_train_rows=20_000, live_steps=150,
                                    live_inject="rank=1,factor=2.0,start=30,ramp=30,end=140",
                                    live_policies=("static", "predictive"))
    elif name == "tiny":
        base = dict(scenarios=("throttle", "failslow", "periodic"), runs=2, heldout_runs=1,
                    steps=60, horizons=(1, 4), windows=(4, 8, 16), lags=8,
                    lgbm_estimators=20, lgbm_leaves=7, seq_epochs=2, seq_hidden=8,
                    max_train_rows=5_000, track=False, live=False, live_steps=30,
                    live_hidden=64, live_inject="rank=1,factor=2.0,start=8,ramp=8",
                    live_policies=("static", "predictive"))
    else:
        raise BubblecastError(f"unknown demo preset '{name}' (default, quick, tiny)")
    base.update(overrides)
    return DemoConfig(**base)
