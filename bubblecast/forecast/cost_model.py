"""The learned micro-batch cost model: a packed micro-batch's F/B/W seconds on a stage.

Structure: ``duration = speed_recent(run, rank, step) x layers x g_kind(tokens, tokens_sq,
documents)``, where ``speed_recent`` is the rank's speed known before the step: the median of
its previous ``w`` steps' speeds (:mod:`bubblecast.forecast.cost_features`). ``w = 1`` follows
a change at once; a few steps' median does not carry one step's noise into the next; a long
median ignores ops stretched by another process taking the core now and then (a shared host),
as long as under half the window's steps are. With ``speed_window="auto"`` each of
:data:`SPEED_WINDOWS` is fitted and the held-out runs choose (``speed_window_``), and
``g_kind`` the per-layer cost of op kind ``F``, ``B``, ``W`` (or ``BW``, the fused backward)
at speed 1. Speed 1 is the median speed of the training runs (the speed ratios are normalised
to median 1). Fitting alternates ``rounds``
times: fit ``g`` on durations / (current speed x layers), recompute every (run, rank, step)'s
observed / nominal ratio, take the median of the previous ``w``.

Two learners, fitted on the fit runs and chosen by p90 relative error on held-out runs (whole
runs, ``holdout`` share, seeded): ``linear``, non-negative least squares per kind on
``[tokens, tokens_sq, documents, 1]`` in relative error; ``lgbm``, LightGBM on ``[tokens,
tokens_sq, documents, layers, speed_recent, kind]`` whose target is ``log(duration /
(speed_recent x layers))`` (the structure's offset: a tree cannot extrapolate a multiplicative
speed). Bounds are split-conformal: quantiles of observed / predicted on the held-out runs
(on the training rows, in sample, when nothing is held out).

:meth:`CostModel.work_cost` is the planner's input (``policy.work_plan.plan_batch(cost=...)``):
per-layer seconds at speed 1 summed over F+B+W (F+BW). With the ``linear`` learner these are
its own coefficients; with ``lgbm`` they come from a non-negative linear surrogate fitted to the
booster's predictions (at speed 1) on the training rows, and ``model.json`` says so
(``work_cost_source``). Speeds for the planner come from :meth:`CostModel.speeds`.

The model directory (save, load, ``models:/`` URIs, ``require_tokens_sq``) is
:mod:`bubblecast.forecast.cost_modeldir`; ``train --model cost`` is
:mod:`bubblecast.forecast.cost_training`.
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from bubblecast.errors import BubblecastError
from bubblecast.forecast.cost_features import KINDS, TERMS, cost_rows, design, speed_table
from bubblecast.forecast.cost_fitting import (
    conformal_ratios,
    crossfit_summary,
    error_summary,
    fit_booster,
    fit_nonneg,
    ratio_at,
)
from bubblecast.forecast.modeldir import COST_KIND
from bubblecast.sim.documents import WorkCost
from bubblecast.telemetry.events import Events

LEARNERS: tuple[str, ...] = ("auto", "linear", "lgbm")
#: The speed windows ``speed_window="auto"`` chooses from on held-out runs.
SPEED_WINDOWS: tuple[int, ...] = (1, 8, 32)
#: The interval :meth:`CostModel.score` checks (``coverage_p10_p90``).
BOUNDS: tuple[float, float] = (0.1, 0.9)
_CODE = {k: i for i, k in enumerate(KINDS)}


class CostModel:
    """Predicts a packed micro-batch's op seconds on a stage (see the module doc).

    Estimator rules as scikit-learn: ``__init__`` stores parameters, :meth:`fit` returns self,
    fitted attributes end in ``_``. ``learner``: ``auto`` (chosen on held-out runs; ``linear``
    when ``holdout`` is 0), ``linear`` or ``lgbm``. ``speed_window``: the steps whose median
    speed makes ``speed_recent``, an integer >= 1 or ``auto`` (each of :data:`SPEED_WINDOWS`,
    chosen on held-out runs like the learner; 1 when ``holdout`` is 0)."""

    kind: ClassVar[str] = COST_KIND

    def __init__(self, learner: str = "auto", holdout: float = 0.2, rounds: int = 3,
                 n_estimators: int = 300, learning_rate: float = 0.05, num_leaves: int = 31,
                 min_child_samples: int = 20, max_train_rows: int | None = 200_000,
                 speed_window: int | str = "auto", seed: int = 0) -> None:
        self.learner = learner
        self.holdout = holdout
        self.rounds = rounds
        self.n_estimators = n_estimators
        self.learning_rate = learning_rate
        self.num_leaves = num_leaves
        self.min_child_samples = min_child_samples
        self.max_train_rows = max_train_rows
        self.speed_window = speed_window
        self.seed = seed

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        names = [p for p in inspect.signature(type(self).__init__).parameters if p != "self"]
        return {name: getattr(self, name) for name in names}

    def set_params(self, **params: Any) -> CostModel:
        for key, value in params.items():
            if key not in self.get_params():
                raise ValueError(f"CostModel: unknown parameter '{key}'")
            setattr(self, key, value)
        return self

    def __repr__(self) -> str:
        return f"CostModel({', '.join(f'{k}={v!r}' for k, v in self.get_params().items())})"

    # -- fitting ------------------------------------------------------------------------------
    def fit(self, events: Events, where: str = "events") -> CostModel:
        """Fit on the compute ops of ``events`` (see the module doc); one-line errors naming
        ``where`` for unusable events, or a single run when ``holdout`` > 0."""
        self._check_params()
        if self.speed_window != "auto":
            windows: tuple[int, ...] = (int(self.speed_window),)
        else:
            windows = SPEED_WINDOWS if float(self.holdout) > 0 else (1,)
        fits = []
        for w in windows:
            self.speed_window_ = w
            self._fit_window(events, where)
            p90 = self.heldout_["p90_rel_error"] if self.heldout_ else 0.0
            fits.append((p90, w, dict(self.__dict__)))
        best = min(fits, key=lambda f: (f[0], f[1]))
        self.__dict__.update(best[2])
        self.metrics_["speed_window"] = {str(w): p90 for p90, w, _ in fits}
        return self

    def _fit_window(self, events: Events, where: str) -> None:
        """:meth:`fit` with ``speed_recent`` over ``speed_window_`` steps."""
        rows = cost_rows(events, where)
        self.has_tokens_sq_ = bool(np.isfinite(rows["tokens_sq"]).any())
        self.has_documents_ = bool(np.isfinite(rows["documents"]).any())
        self._check_stats(rows, where, fitting=True)
        fit_rows, held = self._split(rows, where)
        self.kinds_ = [k for k in KINDS if (fit_rows["kind"] == k).any()]
        self.coef_ = self._fit_linear(fit_rows)
        self.surrogate_: dict[str, np.ndarray] | None = None
        self.booster_: Any = None
        fit_rows = self._with_speed(fit_rows)
        self.mean_stats_ = np.zeros(len(TERMS))
        self.mean_stats_[[TERMS.index(t) for t in self.terms_]] = \
            design(fit_rows, self.terms_).mean(axis=0)
        wanted = ["linear", "lgbm"] if self.learner == "auto" and held is not None else \
            ["linear" if self.learner == "auto" else self.learner]
        if "lgbm" in wanted:
            self.booster_ = self._fit_lgbm(fit_rows)
        calib = fit_rows if held is None else self._with_speed(held)
        y = calib["duration_s"].to_numpy()
        preds = {name: self._point(calib, name) for name in wanted}
        errors = {n: error_summary(y, p, p, p)["p90_rel_error"] for n, p in preds.items()}
        self.learner_ = min(wanted, key=lambda n: (errors[n], n != "linear"))
        if self.learner_ == "lgbm":
            self.surrogate_ = self._fit_surrogate(fit_rows)
        self.ratios_ = conformal_ratios(y, preds[self.learner_])
        self.conformal_source_ = "training rows (in sample: no runs held out)" \
            if held is None else "held-out runs"
        self.conformal_rows_ = int(np.sum((y > 0) & np.isfinite(preds[self.learner_])))
        self.metrics_ = {"learners": {n: crossfit_summary(calib, p, n, BOUNDS)
                                      for n, p in preds.items()}}
        self.heldout_ = None if held is None else self.metrics_["learners"][self.learner_]
        self.metrics_["heldout"] = self.heldout_
        self.training_ = {"runs": sorted(set(fit_rows["run_id"])), "rows": len(fit_rows),
                          "heldout_runs": [] if held is None else sorted(set(held["run_id"])),
                          "heldout_rows": 0 if held is None else len(held),
                          "model_shape": model_shape(events)}
        self.sample_ = self._features_frame(fit_rows.head(5))

    def _check_params(self) -> None:
        if self.learner not in LEARNERS:
            raise BubblecastError(f"learner: '{self.learner}' is not one of "
                                  f"{', '.join(LEARNERS)}")
        if not 0.0 <= float(self.holdout) < 1.0:
            raise BubblecastError(f"holdout: must be in [0, 1), got {self.holdout}")
        if not isinstance(self.rounds, int) or self.rounds < 1:
            raise BubblecastError(f"rounds: must be an integer >= 1, got {self.rounds!r}")
        w = self.speed_window
        if w != "auto" and (isinstance(w, bool) or not isinstance(w, int) or w < 1):
            raise BubblecastError(f"speed_window: must be an integer >= 1 or 'auto', got {w!r}")

    @property
    def terms_(self) -> tuple[str, ...]:
        """The cost terms the training events support (tokens and the constant always)."""
        skip = {"per_token_sq": not self.has_tokens_sq_, "per_document": not self.has_documents_}
        return tuple(t for t in TERMS if not skip.get(t, False))

    def _check_stats(self, rows: pd.DataFrame, where: str, fitting: bool) -> None:
        """One-line error naming the first run whose compute ops lack a statistic the model
        uses (``tokens_sq``, ``documents``) where the model has it."""
        for flag, col in ((self.has_tokens_sq_, "tokens_sq"), (self.has_documents_,
                                                               "documents")):
            missing = ~np.isfinite(rows[col].to_numpy())
            if flag and missing.any():
                run = rows["run_id"].to_numpy()[missing][0]
                tail = "while other runs have it; give runs that all have it, or none" \
                    if fitting else "and this cost model was trained with it"
                raise BubblecastError(f"{where}: run '{run}' has no {col} on some compute "
                                      f"ops, {tail}")

    def _split(self, rows: pd.DataFrame, where: str) -> tuple[pd.DataFrame, pd.DataFrame | None]:
        """``(fit rows, held-out rows or None)``: ``round(holdout x runs)`` whole runs, at least
        1 and at most all but 1, drawn with ``seed``."""
        runs = sorted(set(rows["run_id"]))
        if self.holdout <= 0:
            return rows, None
        if len(runs) < 2:
            raise BubblecastError(f"{where}: the cost model holds out whole runs (holdout "
                                  f"{self.holdout}) and needs at least 2 runs (1 to fit, 1 "
                                  f"held out), got {len(runs)}; give more runs or holdout 0")
        n_held = min(len(runs) - 1, max(1, round(self.holdout * len(runs))))
        held = np.random.default_rng(self.seed).permutation(runs)[:n_held]
        mask = rows["run_id"].isin(set(held)).to_numpy()
        return (rows.loc[~mask].reset_index(drop=True), rows.loc[mask].reset_index(drop=True))

    def _fit_linear(self, rows: pd.DataFrame) -> dict[str, np.ndarray]:
        """Per-kind per-layer coefficients (all of :data:`TERMS`, unused ones 0), by the
        alternating fit of the module doc, scaled so the training ratios have median 1."""
        cols = [TERMS.index(t) for t in self.terms_]
        x = design(rows, self.terms_)
        y = rows["duration_s"].to_numpy()
        layers = rows["layers"].to_numpy()
        kind = rows["kind"].to_numpy()
        speed = np.ones(len(rows))
        coef: dict[str, np.ndarray] = {}
        for _ in range(self.rounds):
            for k in self.kinds_:
                m = kind == k
                coef[k] = np.zeros(len(TERMS))
                coef[k][cols] = fit_nonneg(x[m], y[m] / (speed[m] * layers[m]))
            self.coef_ = coef
            ratio = speed_table(rows, self._nominal(rows))["ratio"].to_numpy()
            scale = float(np.nanmedian(ratio)) if np.isfinite(ratio).any() else 1.0
            coef = {k: c * scale for k, c in coef.items()}
            self.coef_ = coef
            speed = self._with_speed(rows)["speed_recent"].to_numpy()
        return coef

    def _fit_lgbm(self, rows: pd.DataFrame) -> Any:
        """The booster on ``log(duration / (speed_recent x layers))`` (a seeded sample of at
        most ``max_train_rows`` rows with a positive duration)."""
        ok = np.flatnonzero(rows["duration_s"].to_numpy() > 0)
        if self.max_train_rows and len(ok) > self.max_train_rows:
            rng = np.random.default_rng(self.seed)
            ok = np.sort(rng.choice(ok, self.max_train_rows, replace=False))
        sub = rows.iloc[ok]
        target = np.log(sub["duration_s"].to_numpy()
                        / (sub["speed_recent"].to_numpy() * sub["layers"].to_numpy()))
        params = {"learning_rate": self.learning_rate, "num_leaves": self.num_leaves,
                  "min_data_in_leaf": self.min_child_samples, "seed": self.seed}
        return fit_booster(self._lgbm_x(sub, sub["kind"].to_numpy()), target, self.features,
                           params, self.n_estimators)

    def _fit_surrogate(self, rows: pd.DataFrame) -> dict[str, np.ndarray]:
        """Per-kind non-negative linear coefficients fitted to the booster's per-layer seconds
        at speed 1 on the training rows."""
        at_one = rows.assign(speed_recent=1.0)
        cols = [TERMS.index(t) for t in self.terms_]
        x = design(rows, self.terms_)
        out = {}
        for k in self.kinds_:
            m = (rows["kind"] == k).to_numpy()
            out[k] = np.zeros(len(TERMS))
            per_layer = np.exp(self.booster_.predict(self._lgbm_x(at_one.loc[m], k),
                                                     num_threads=1))
            out[k][cols] = fit_nonneg(x[m], per_layer)
        return out

    # -- prediction -----------------------------------------------------------------------------
    @property
    def features(self) -> list[str]:
        """Inputs of the model, in the booster's column order."""
        return ["tokens"] + ["tokens_sq"] * self.has_tokens_sq_ + \
            ["documents"] * self.has_documents_ + ["layers", "speed_recent", "kind"]

    @property
    def has_tokens_sq(self) -> bool:
        """Whether the model was trained on ``tokens_sq`` (it can price packed documents)."""
        self.check_fitted()
        return bool(self.has_tokens_sq_)

    def check_fitted(self) -> None:
        """One-line error unless fitted (or loaded)."""
        if not hasattr(self, "learner_"):
            raise BubblecastError("CostModel is not fitted; call fit() or load_cost_model()")

    def rows(self, events: Events, where: str = "events") -> pd.DataFrame:
        """The cost-model rows of ``events`` (:func:`~.cost_features.cost_rows`) with their
        ``speed_recent``: what :meth:`predict` and :meth:`score` price."""
        self.check_fitted()
        for flag, col in ((self.has_tokens_sq_, "tokens_sq"), (self.has_documents_,
                                                               "documents")):
            if flag and col not in events.frame.columns:
                raise BubblecastError(f"{where}: column '{col}' is missing; this cost model "
                                      "was trained with it")
        rows = cost_rows(events, where)
        self._check_stats(rows, where, fitting=False)
        return self._with_speed(rows)

    def _with_speed(self, rows: pd.DataFrame) -> pd.DataFrame:
        table = speed_table(rows, self._nominal(rows), self.speed_window_)
        return rows.assign(speed_recent=table["recent"].to_numpy()[table.attrs["group"]])

    def _resolve(self, kind: str) -> list[str]:
        """The learnt kinds whose costs add up to ``kind``'s (B from BW, BW from B + W)."""
        learnt = self.kinds_
        if kind in learnt:
            return [kind]
        if kind == "B" and "BW" in learnt:
            return ["BW"]
        if kind == "BW" and {"B", "W"} <= set(learnt):
            return ["B", "W"]
        raise BubblecastError(f"cost model: op kind '{kind}' was not in its training events "
                              f"(it learnt {', '.join(learnt)})")

    def _by_kind(self, rows: pd.DataFrame, per_layer: Any) -> np.ndarray:
        """Per-layer seconds of every row: ``per_layer(sub_rows, learnt_kind)`` summed over
        the learnt kinds standing for each row's kind."""
        kind = rows["kind"].astype(str).to_numpy()
        out = np.zeros(len(rows))
        for k in np.unique(kind):
            m = kind == k
            for learnt in self._resolve(str(k)):
                out[m] += per_layer(rows.loc[m], learnt)
        return out

    def _linear(self, rows: pd.DataFrame, kind: str) -> np.ndarray:
        """Per-layer seconds at speed 1 of ``rows`` as learnt ``kind`` (linear learner)."""
        cols = [TERMS.index(t) for t in self.terms_]
        return design(rows, self.terms_) @ self.coef_[kind][cols]

    def _nominal(self, rows: pd.DataFrame) -> np.ndarray:
        """Seconds at speed 1 by the linear structure (the speed estimate's yardstick)."""
        return rows["layers"].to_numpy() * self._by_kind(rows, self._linear)

    def _point(self, rows: pd.DataFrame, learner: str | None = None) -> np.ndarray:
        learner = learner or self.learner_
        if learner == "linear":
            per = self._by_kind(rows, self._linear)
        else:
            per = self._by_kind(rows, lambda sub, k: np.exp(self.booster_.predict(
                self._lgbm_x(sub, k), num_threads=1)))
        return rows["speed_recent"].to_numpy() * rows["layers"].to_numpy() * per

    def _lgbm_x(self, rows: pd.DataFrame, kind: Any) -> np.ndarray:
        cols = [rows[c].to_numpy(np.float64) for c in self.features[:-1]]
        codes = np.vectorize(_CODE.get)(kind) if not isinstance(kind, str) else \
            np.full(len(rows), _CODE[kind])
        return np.column_stack(cols + [np.asarray(codes, dtype=np.float64)])

    def _features_frame(self, rows: pd.DataFrame) -> pd.DataFrame:
        """``rows`` reduced to the inputs :meth:`predict` takes (the kind as text)."""
        return rows[["kind"] + self.features[:-1]].reset_index(drop=True)

    def predict(self, X: Events | pd.DataFrame,
                quantiles: tuple[float, ...] | None = None) -> np.ndarray:
        """Predicted seconds of each op: of the cost-model rows of events (:meth:`rows`, in
        their order), or of a frame with ``kind`` (or ``op``), ``tokens``, ``tokens_sq`` and
        ``documents`` when the model uses them, ``layers`` (default 1) and ``speed_recent``
        (default 1). ``(n,)``; with ``quantiles`` the conformal bounds ``(n, len(quantiles))``
        instead (e.g. ``(0.1, 0.9)``: lower and upper)."""
        self.check_fitted()
        rows = self.rows(X) if isinstance(X, Events) else self._prepare(X)
        point = self._point(rows)
        if quantiles is None:
            return point
        return point[:, None] * np.array([ratio_at(self.ratios_, q) for q in quantiles])[None]

    def _prepare(self, frame: pd.DataFrame) -> pd.DataFrame:
        out = frame.copy()
        if "kind" not in out.columns and "op" in out.columns:
            out["kind"] = out["op"].astype(str)
        for col, default in (("layers", 1.0), ("speed_recent", 1.0)):
            if col not in out.columns:
                out[col] = default
        for col in ["kind"] + self.features[:-1]:
            if col not in out.columns:
                raise BubblecastError(f"cost model input: column '{col}' is missing")
        return out

    # -- what the planner and the reports use -------------------------------------------------
    def work_cost(self) -> WorkCost:
        """Per-layer seconds at speed 1 of a micro-batch summed over F+B+W (F+BW for fused
        backwards): the linear learner's coefficients, or the LightGBM surrogate's."""
        self.check_fitted()
        coef = self.surrogate_ if self.surrogate_ is not None else self.coef_
        total = sum(coef[k] for k in step_kinds(self.kinds_))
        return WorkCost(**{t: float(v) for t, v in zip(TERMS, total, strict=True)})

    def kind_weights(self) -> tuple[float, float, float]:
        """``(f, b, w)`` shares of a mean training micro-batch's cost (a fused backward counts
        as ``b``, with ``w`` 0), as :class:`~bubblecast.policy.work_plan.PlanConfig` takes."""
        self.check_fitted()
        coef = self.surrogate_ if self.surrogate_ is not None else self.coef_
        x = self.mean_stats_

        def cost(kinds: list[str]) -> float:
            return float(sum(coef[k] @ x for k in kinds if k in coef))

        f = cost(["F"])
        b, w = (cost(["B"]), cost(["W"])) if "W" in coef else (cost(["B", "BW"]), 0.0)
        total = f + b + w
        if total <= 0:
            raise BubblecastError("cost model: every op kind costs 0")
        return (f / total, b / total, w / total)

    def speeds(self, events: Events, where: str = "events") -> pd.DataFrame:
        """Each (run, rank)'s latest speed: observed / nominal compute seconds of its ops at
        its latest step with a priced op (nominal: the linear structure at speed 1). One row
        per (run, rank) with ``run_id, replica, stage, rank, step, speed``; 1 is the training
        runs' median speed, 1.5 means 50% slower: the time multiplier to expect at the next
        step (the planner's ``speeds``; a replica runs at its slowest stage's)."""
        rows = self.rows(events, where)
        table = speed_table(rows, self._nominal(rows))
        table = table.loc[np.isfinite(table["ratio"])]
        latest = table.groupby(["run_id", "rank"], sort=True).tail(1)
        return latest.rename(columns={"ratio": "speed"})[
            ["run_id", "replica", "stage", "rank", "step", "speed"]].reset_index(drop=True)

    def score(self, events: Events, where: str = "events") -> dict[str, Any]:
        """Error on ``events``: ``mae_s``, ``p50_rel_error``, ``p90_rel_error``,
        ``coverage_p10_p90`` (share inside the conformal p10-p90 bounds), ``rows``,
        ``learner`` and ``runs`` (with a priced op)."""
        rows = self.rows(events, where)
        point = self._point(rows)
        lo, hi = (point * ratio_at(self.ratios_, q) for q in BOUNDS)
        out: dict[str, Any] = error_summary(rows["duration_s"].to_numpy(), point, lo, hi)
        return {**out, "learner": self.learner_, "runs": int(rows["run_id"].nunique())}


def step_kinds(kinds: list[str]) -> list[str]:
    """The learnt kinds one micro-batch runs on a stage: F, then B and W (or the fused BW)."""
    back = ["B", "W"] if {"B", "W"} <= set(kinds) else ["BW"] if "BW" in kinds else \
        [k for k in ("B", "W") if k in kinds]
    return [k for k in ["F", *back] if k in kinds]


#: The model fields a cost model's per-layer costs depend on (the runtime's ``ModelSpec``).
SHAPE_KEYS: tuple[str, ...] = ("kind", "layers", "hidden", "heads", "seq_len", "vocab", "dtype")


def model_shape(events: Events) -> dict[str, Any] | None:
    """The model shape the runs of ``events`` trained (their metadata's ``model``, the
    :data:`SHAPE_KEYS` fields), None when no run records one (simulations, imported logs);
    ``{"mixed": [...]}`` when the runs differ."""
    shapes = []
    for meta in events.runs.values():
        spec = meta.extra.get("model")
        if isinstance(spec, dict):
            shape = {k: spec[k] for k in SHAPE_KEYS if k in spec}
            if shape not in shapes:
                shapes.append(shape)
    if not shapes:
        return None
    return shapes[0] if len(shapes) == 1 else {"mixed": shapes}


def shape_mismatch(model: Any, spec: dict[str, Any]) -> str | None:
    """Why cost model ``model`` does not price model ``spec`` (a ``ModelSpec`` as a dict), None
    when it does or its training runs recorded no shape."""
    trained = (getattr(model, "training_", None) or {}).get("model_shape")
    if not trained:
        return None
    if "mixed" in trained:
        return f"it was trained on runs of {len(trained['mixed'])} different model shapes"
    diff = [f"{k} {trained[k]} (model) vs {spec[k]} (this run)" for k in SHAPE_KEYS
            if k in trained and k in spec and trained[k] != spec[k]]
    return "; ".join(diff) if diff else None

