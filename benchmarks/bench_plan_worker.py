"""Where the live planner runs: a thread of the training process against a worker process.

One process trains the packed GPT of bench_live_balance's documents setting (4 layers, hidden
64, a 4096-token budget, 4 micro-batches a step, one thread) on the data loader's micro-batches.
Each step runs in one of three arms, in an order shuffled every step (seeded):

- ``none``: nothing planned;
- ``thread``: the next step's ``balance`` plan (:class:`bubblecast.runtime.plan_worker.PlanWorker`,
  a fixed per-layer cost and a 64-step speed history, the newest ratios sent with each
  request) is computed on a thread of the training
  process while the step trains;
- ``process``: the same plan in :class:`~bubblecast.runtime.plan_worker.PlanProcess`, the
  worker process the live planner uses.

Each step waits for its plan, so both arms do the same planning work per step. Reported: the
mean step per arm and each arm's paired difference to ``none`` (same step index, the one
before it in the shuffled order aside) with its standard error, plus the worker's own planning
seconds per call. Direct A/B in one run; this machine is shared, so compare the ratios.

    python benchmarks/bench_plan_worker.py [--steps 100] [--seed 0]

Prints a table, writes benchmarks/results/plan_worker.json.
"""

from __future__ import annotations

import argparse
import queue
import random
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import run_header, write_json  # noqa: E402
from bench_live_balance import MODELS, documents_blocks, documents_loader  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
MODEL = MODELS["documents"]
#: A per-layer cost of the documents setting's order of magnitude (a cost model fitted there:
#: seconds per token, per squared token, per document, per micro-batch).
COST = {"per_token": 4.1e-6, "per_token_sq": 2.6e-9, "per_document": 7.2e-5,
        "per_microbatch": 1.3e-3}
ARMS = ("none", "thread", "process")
WARM = 5


def make_worker(seed: int) -> Any:
    from bubblecast.runtime.plan_worker import PlanWorker
    from bubblecast.sim.documents import WorkCost

    loader = documents_loader(seed)
    config = replace(loader.config, kind_weights=(0.35, 0.65, 0.0))
    return PlanWorker("balance", loader, config, WorkCost(**COST), None, np.array([2.0, 2.0]))


def history(seed: int) -> list[np.ndarray]:
    """The live planner's full history (``HISTORY`` steps) of two ranks' speed ratios around
    1 (seeded noise)."""
    from bubblecast.runtime.plan_worker import HISTORY

    rng = np.random.default_rng(seed)
    return [1.0 + 0.03 * rng.standard_normal((1, 2)) for _ in range(HISTORY)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(RESULTS / "plan_worker.json"))
    args = ap.parse_args(argv)

    import torch
    import torch.nn.functional as F

    from bubblecast.runtime.plan_worker import PlanProcess

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    worker = make_worker(args.seed)
    loader, hist = worker.loader, history(args.seed)
    model = documents_blocks(range(MODEL["layers"]))

    def train_step(step: int) -> None:
        batch = loader.tensors(step, loader.static_plan(step).microbatches[0])
        for j in range(len(batch.lengths)):
            out = model(batch.tokens[j:j + 1], batch.documents[j:j + 1])
            loss = F.cross_entropy(out.view(-1, MODEL["vocab"]), batch.labels[j].view(-1),
                                   ignore_index=-100, reduction="sum")
            loss.backward()

    requests: queue.Queue[int | None] = queue.Queue()
    done: queue.Queue[Any] = queue.Queue()

    # each arm's worker holds the history and gets the newest ratios with each request, as
    # the live planner's does
    mine = replace(worker, history=list(hist))

    def thread_loop() -> None:
        while (step := requests.get()) is not None:
            done.put(mine.answer(step, hist[-1]))

    thread = threading.Thread(target=thread_loop, name="bench-planner", daemon=True)
    thread.start()
    proc = PlanProcess(replace(worker, history=list(hist)))
    proc.request(0, hist[-1])
    proc.result(0, 60.0)  # started and planning
    step_s: dict[str, list[float]] = {a: [] for a in ARMS}
    plan_s: dict[str, list[float]] = {a: [] for a in ARMS if a != "none"}
    order = random.Random(args.seed)
    for step in range(args.steps):
        for arm in order.sample(ARMS, len(ARMS)):
            t0 = time.perf_counter()
            if arm == "thread":
                requests.put(step + 1)
            elif arm == "process":
                proc.request(step + 1, hist[-1])
            train_step(step)
            if arm == "thread":
                plan_s[arm].append(done.get()[2]["latency_s"])
            elif arm == "process":
                got = proc.result(step + 1, 60.0)
                if isinstance(got, str):
                    proc.close()
                    sys.exit(f"bench_plan_worker: the worker process gave no plan: {got}")
                plan_s[arm].append(got[2]["latency_s"])
            step_s[arm].append(time.perf_counter() - t0)
    requests.put(None)
    proc.close()

    base = np.array(step_s["none"][WARM:])
    arms: dict[str, dict[str, float]] = {}
    for arm in ARMS:
        v = np.array(step_s[arm][WARM:])
        d = v - base
        arms[arm] = {"step_ms": 1e3 * v.mean(),
                     "paired_pct": 100 * d.mean() / base.mean(),
                     "paired_se_pct": 100 * d.std(ddof=1) / np.sqrt(len(d)) / base.mean(),
                     "plan_ms": 1e3 * float(np.mean(plan_s[arm][WARM:])) if arm in plan_s
                     else None}
    print(f"{'arm':<9}{'step ms':>9}{'vs none':>10}{'se':>7}{'plan ms':>9}")
    for arm, a in arms.items():
        plan = f"{a['plan_ms']:.2f}" if a["plan_ms"] is not None else "-"
        print(f"{arm:<9}{a['step_ms']:9.1f}{a['paired_pct']:+9.2f}%{a['paired_se_pct']:6.2f}%"
              f"{plan:>9}")
    doc = {**run_header("plan_worker", argv, model=MODEL, cost=COST, steps=args.steps,
                        warm=WARM, seed=args.seed), "arms": arms}
    write_json(args.out, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
