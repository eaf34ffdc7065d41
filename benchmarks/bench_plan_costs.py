"""What a plan gains by its measured costs, against what the learned cost model predicts.

bench_live_balance compares the live gain of ``tokens`` and ``balance`` with the offline
prediction, which times the plans against a cost model fitted to the run. This benchmark
separates the two sources of a gap: for the same steps' documents (the documents setting's
loader, seed ``--seed``) it plans ``static``, ``tokens`` and ``balance`` and times each plan
twice:

- **measured**: every micro-batch of the plan run in isolation on the real stages of the
  packed GPT (stage 0: embedding and block; stage 1: block, head and loss; one thread),
  forward and backward timed per stage (median of ``--reps``), the step composed by the
  engine (:mod:`bubblecast.sim.steptime`, 1F1B, transfers left out, as the prediction);
- **modelled**: the same plans through the cost model (``predicted_plan_step``: its per-layer
  cost, its F/B/W shares, equal speeds).

If the modelled gains exceed the measured ones, the prediction, not the live runtime, is where
a live-over-predicted share below 1 comes from. Also reported: a least-squares fit of the
measured micro-batch seconds on ``[tokens, tokens_sq, documents, 1]`` beside the cost model's
coefficients (both as ratios to the per-token one).

The cost model is fitted as bench_live_balance fits it (two recorded static runs of the
documents setting, one held out), or read from ``--cost-model DIR``.

    python benchmarks/bench_plan_costs.py [--steps 30] [--reps 3] [--seed 21]
        [--cost-model DIR]

Prints a table, writes benchmarks/results/plan_costs.json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import run_header, write_json  # noqa: E402
from bench_live_balance import FULL, MODELS, documents_blocks, documents_loader  # noqa: E402
from bench_live_balance import cost_model as fit_cost_model  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
POLICIES = ("static", "tokens", "balance")


class StageTimer:
    """The packed GPT of bench_live_balance's documents setting, split in two stages, timing
    one micro-batch's forward and backward per stage (median of ``reps``)."""

    def __init__(self, loader: Any, reps: int) -> None:
        import torch

        from bubblecast.runtime.host_allocator import keep_freed_memory

        keep_freed_memory()  # the host allocator as on the live trainers' (gloo) ranks
        m = MODELS["documents"]
        half = m["layers"] // 2
        torch.set_num_threads(1)
        torch.manual_seed(0)
        self.stages = [documents_blocks(range(half)), documents_blocks(range(half, m["layers"]))]
        self.vocab, self.loader, self.reps = m["vocab"], loader, reps
        self._cache: dict[tuple[int, tuple[int, ...]], np.ndarray] = {}

    def microbatch(self, step: int, docs: tuple[int, ...]) -> np.ndarray:
        """``(2 stages, 2 kinds F/B)`` seconds of one micro-batch."""
        import torch.nn.functional as F

        key = (step, docs)
        if key not in self._cache:
            batch = self.loader.tensors(step, [list(docs)])
            runs = []
            for _ in range(self.reps):
                t0 = time.perf_counter()
                h = self.stages[0](batch.tokens, batch.documents)
                t1 = time.perf_counter()
                x = h.detach().requires_grad_(True)
                out = self.stages[1](x, batch.documents)
                loss = F.cross_entropy(out.view(-1, self.vocab), batch.labels.view(-1),
                                       ignore_index=-100, reduction="sum")
                t2 = time.perf_counter()
                loss.backward()
                t3 = time.perf_counter()
                h.backward(x.grad)
                t4 = time.perf_counter()
                runs.append([[t1 - t0, t4 - t3], [t2 - t1, t3 - t2]])
            self._cache[key] = np.median(np.array(runs), axis=0)
        return self._cache[key]

    def forget(self) -> None:
        """Drop the timed micro-batches (after a warm-up)."""
        self._cache.clear()

    @property
    def timed(self) -> int:
        """Micro-batches timed so far."""
        return len(self._cache)

    def step(self, step: int, plan: Any) -> float:
        """The plan's step composed by the engine from its measured micro-batches."""
        from bubblecast.sim.steptime import op_durations, step_times, timing_shape

        mbs = plan.microbatches[0]
        t = np.stack([self.microbatch(step, tuple(mb)) for mb in mbs], axis=-1)  # (2, 2, M)
        shape = timing_shape("1f1b", 2, len(mbs), 1)
        f, b = t[None, :, 0, :], t[None, :, 1, :]
        return float(step_times(shape, op_durations(shape, f, b, np.zeros_like(f)))[0][0])


def load_or_fit(cost_model: str | None, root: Path) -> tuple[str, dict[str, Any]]:
    if cost_model:
        return cost_model, {"source": cost_model}
    return fit_cost_model("documents", FULL, root)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=21)
    ap.add_argument("--cost-model", default=None)
    ap.add_argument("--out", default=str(RESULTS / "plan_costs.json"))
    args = ap.parse_args(argv)

    from bubblecast.forecast.cost_modeldir import load_cost_model
    from bubblecast.policy.work_plan import TOKENS, plan_batch
    from bubblecast.policy.work_timing import predicted_plan_step
    from bubblecast.sim.documents import microbatch_stats

    with tempfile.TemporaryDirectory() as tmp:
        where, fitted = load_or_fit(args.cost_model, Path(tmp))
        model = load_cost_model(where)
    work, weights = model.work_cost(), model.kind_weights()
    loader = documents_loader(args.seed)
    config = replace(loader.config, kind_weights=weights)
    timer = StageTimer(loader, args.reps)
    timer.step(0, loader.static_plan(0))  # warm-up, then forget it
    timer.forget()
    equal = np.array([[2.0, 2.0]])  # equal speeds x layers per stage, as the live planner
    measured = {p: [] for p in POLICIES}
    modelled = {p: [] for p in POLICIES}
    rows = []
    for step in range(args.steps):
        x = loader.lengths(step)
        plans = {"static": loader.static_plan(step),
                 "tokens": plan_batch(x, replace(loader.config, rebalance_counts=False),
                                      TOKENS, None, method="tokens"),
                 "balance": plan_batch(x, config, work, equal, method="balance")}
        for name, plan in plans.items():
            measured[name].append(timer.step(step, plan))
            mbs = plan.microbatches[0]
            owner = np.concatenate([np.full(len(mb), j) for j, mb in enumerate(mbs)])
            tokens, sq, docs = microbatch_stats(x[np.concatenate(mbs).astype(int)], owner,
                                                len(mbs))
            modelled[name].append(predicted_plan_step(
                "1f1b", 2, [work.microbatch(tokens, sq, docs)], equal, weights))
            for j, mb in enumerate(mbs):
                rows.append((tokens[j], sq[j], docs[j],
                             float(timer.microbatch(step, tuple(mb)).sum())))
    out: dict[str, Any] = {"measured_speedup": {}, "modelled_speedup": {}}
    for name in POLICIES:
        out["measured_speedup"][name] = float(np.mean(measured["static"])
                                              / np.mean(measured[name]))
        out["modelled_speedup"][name] = float(np.mean(modelled["static"])
                                              / np.mean(modelled[name]))
    a = np.array(rows)
    design = np.column_stack([a[:, 0], a[:, 1], a[:, 2], np.ones(len(a))])
    coef, *_ = np.linalg.lstsq(design, a[:, 3], rcond=None)
    out["measured_fit"] = dict(zip(("per_token", "per_token_sq", "per_document",
                                    "per_microbatch"), coef.tolist(), strict=True))
    out["model_coefficients"] = {"per_token": work.per_token, "per_token_sq":
                                 work.per_token_sq, "per_document": work.per_document,
                                 "per_microbatch": work.per_microbatch}
    ratio = {k: {"measured": out["measured_fit"][k] / coef[0],
                 "model": out["model_coefficients"][k] / work.per_token}
             for k in ("per_token_sq", "per_document")}
    print(f"{'policy':<9}{'measured':>10}{'modelled':>10}")
    for name in POLICIES:
        print(f"{name:<9}{out['measured_speedup'][name]:>9.4f}x"
              f"{out['modelled_speedup'][name]:>9.4f}x")
    for k, v in ratio.items():
        print(f"{k} / per_token: measured {v['measured']:.3g}, cost model {v['model']:.3g}")
    doc = {**run_header("plan_costs", argv, steps=args.steps, reps=args.reps, seed=args.seed,
                        microbatches_timed=timer.timed, cost_model=fitted),
           **out, "ratios_to_per_token": ratio,
           "step_s": {"measured": {n: float(np.mean(v)) for n, v in measured.items()},
                      "modelled": {n: float(np.mean(v)) for n, v in modelled.items()}}}
    write_json(args.out, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
