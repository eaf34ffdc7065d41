"""The host allocator A/B: what glibc's default malloc costs a packed plan on CPU.

The same steps of bench_live_balance's documents setting run in two fresh processes, one with
the host allocator as a gloo rank sets it (:mod:`bubblecast.runtime.host_allocator`: freed
blocks up to 32 MiB kept for reuse) and one with ``BUBBLECAST_HOST_MALLOC=system`` (glibc's
own adaptive thresholds). Each step runs twice, packed by the data loader and planned by token
balancing (light ends, middles of long documents): the packed GPT's four layers in one process,
one thread, every micro-batch's forward then every backward (the activations of all of them
held at once, as a 1F1B stage holds a few). Per allocator and packing: seconds and minor page
faults per step (after ``--warm`` passes), and the planned packing's seconds over the loader's:
the same documents, so the same work.

    python benchmarks/bench_host_allocator.py [--steps 12] [--passes 3] [--warm 1]

Prints a table, writes benchmarks/results/host_allocator.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import run_header, write_json  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
ENV = "BUBBLECAST_HOST_MALLOC"
PACKINGS = ("loader", "tokens")


def child(steps: int, passes: int, warm: int) -> dict[str, Any]:
    """In a fresh process: seconds and faults per step of each packing (see the module doc)."""
    from bubblecast.runtime.host_allocator import keep_freed_memory

    applied = keep_freed_memory()  # as init_distributed on a gloo rank (or the opt-out)
    import torch
    import torch.nn.functional as F
    from bench_live_balance import MODELS, documents_blocks, documents_loader

    from bubblecast.policy.work_plan import plan_batch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    m = MODELS["documents"]
    stages = [documents_blocks(range(m["layers"] // 2)),
              documents_blocks(range(m["layers"] // 2, m["layers"]))]
    loader = documents_loader(21)

    def run(step: int, mbs: Any) -> None:
        held = []
        for docs in mbs:
            b = loader.tensors(step, [list(docs)])
            h = stages[0](b.tokens, b.documents)
            x = h.detach().requires_grad_(True)
            out = stages[1](x, b.documents)
            loss = F.cross_entropy(out.view(-1, m["vocab"]), b.labels.view(-1),
                                   ignore_index=-100, reduction="sum")
            held.append((loss, h, x))
        for loss, h, x in held:
            loss.backward()
            h.backward(x.grad)

    plans = {k: {"loader": loader.static_plan(k).microbatches[0],
                 "tokens": plan_batch(loader.lengths(k), loader.config).microbatches[0]}
             for k in range(steps)}
    seconds: dict[str, list[float]] = {p: [] for p in PACKINGS}
    faults: dict[str, list[int]] = {p: [] for p in PACKINGS}
    for n in range(passes):
        for k in range(steps):
            for p in PACKINGS:
                f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                t0 = time.perf_counter()
                run(k, plans[k][p])
                t = time.perf_counter() - t0
                if n >= warm:
                    seconds[p].append(t)
                    faults[p].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    return {"allocator_note": applied,
            "step_s": {p: float(np.mean(v)) for p, v in seconds.items()},
            "faults_per_step": {p: float(np.mean(v)) for p, v in faults.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--warm", type=int, default=1)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(RESULTS / "host_allocator.json"))
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.steps, args.passes, args.warm)))
        return 0
    rows = {}
    for name, env in (("kept", None), ("system", "system")):
        environ = {k: v for k, v in os.environ.items() if k != ENV}
        if env:
            environ[ENV] = env
        out = subprocess.run([sys.executable, __file__, "--child", "--steps", str(args.steps),
                              "--passes", str(args.passes), "--warm", str(args.warm)],
                             env=environ, capture_output=True, text=True, check=True)
        rows[name] = json.loads(out.stdout.strip().splitlines()[-1])
        r = rows[name]
        r["tokens_over_loader"] = r["step_s"]["tokens"] / r["step_s"]["loader"]
    print(f"{'allocator':<10}{'loader s':>10}{'tokens s':>10}{'tokens/loader':>15}"
          f"{'loader faults':>15}{'tokens faults':>15}")
    for name, r in rows.items():
        print(f"{name:<10}{r['step_s']['loader']:>10.4f}{r['step_s']['tokens']:>10.4f}"
              f"{r['tokens_over_loader']:>15.4f}{r['faults_per_step']['loader']:>15.0f}"
              f"{r['faults_per_step']['tokens']:>15.0f}")
    write_json(args.out, {**run_header("host_allocator", argv, steps=args.steps,
                                       passes=args.passes, warm=args.warm), "allocators": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
