"""What slows a pipeline rank's compute on this host: a second rank computing, or transfers.

bench_live_balance finds the same documents' ops take longer in total when the planner
balances them (the ``pace`` figure): its plans leave less of the step to one rank alone. Two
candidate causes, measured directly on the documents setting's first stage (two packed GPT
layers, one thread, forward and backward of one full micro-batch of ``--docs`` documents):

- **compute**: two processes each computing that micro-batch at once (ranks that share the
  host's cores, cache and memory bandwidth), against one alone;
- **transfers**: two gloo ranks each computing it while a thread of each exchanges activation-
  sized tensors (the micro-batch's ``budget x hidden`` float32s, 1 MiB) with the other at
  ``--rate`` tensors a second (the live setting's rate: 2 per micro-batch per step, about 24 a
  second), against the same two ranks without transfers. On this host gloo's transfers run on
  the cores that compute; between separate devices they would not.

Each arm runs ``--seconds`` per repeat, arms alternating, ``--repeats`` times; the figure is
the median op time, per arm, and its ratio to the reference arm of the same repeat.

    python benchmarks/bench_host_interference.py [--seconds 8] [--repeats 3] [--rate 24]

Prints a table, writes benchmarks/results/host_interference.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import run_header, write_json  # noqa: E402
from bench_serve import free_port  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
ARMS = ("alone", "compute", "ranks", "transfers")


def child(seconds: float, start_at: float, docs: int, rate: float, ranks: bool) -> dict:
    """One process: F+B of one full micro-batch until ``seconds`` pass; as a gloo rank of two
    (``ranks``) with a transfer thread when ``rate`` > 0. Median and count of the op times."""
    import torch
    from bench_live_balance import MODELS, documents_blocks

    from bubblecast.runtime.balanced_sampler import packed_microbatch
    from bubblecast.runtime.host_allocator import keep_freed_memory

    keep_freed_memory()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    m = MODELS["documents"]
    stage = documents_blocks(range(m["layers"] // 2))
    g = torch.Generator().manual_seed(1)
    length = m["seq_len"] // docs
    batch = packed_microbatch([torch.randint(0, m["vocab"], (length,), generator=g)
                               for _ in range(docs)], m["seq_len"])
    stop, pump = threading.Event(), None
    if ranks:
        import torch.distributed as dist

        from bubblecast.runtime.trainer import init_distributed

        init_distributed("gloo")
        dist.barrier()
        if rate > 0:
            pump = threading.Thread(target=_exchange, args=(m, rate, stop), daemon=True)
            pump.start()
    while time.time() < start_at:
        time.sleep(0.001)
    times, end = [], time.time() + seconds
    while time.time() < end:
        t0 = time.perf_counter()
        stage(batch.tokens.view(1, -1), batch.documents.view(1, -1)).sum().backward()
        times.append(time.perf_counter() - t0)
    stop.set()
    if ranks:  # both done computing before either exits (the exchange may be mid-transfer)
        dist.barrier()
    return {"median_ms": 1e3 * float(np.median(times[2:])), "ops": len(times)}


def _exchange(m: dict[str, int], rate: float, stop: threading.Event) -> None:
    """Send and receive activation-sized tensors with the other rank, ``rate`` a second."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    group = dist.new_group(backend="gloo")
    out, into = torch.zeros(m["seq_len"] * m["hidden"]), torch.zeros(m["seq_len"] * m["hidden"])
    ops = [(dist.send, out), (dist.recv, into)]
    ops = ops if rank == 0 else ops[::-1]  # rank 0 sends first, rank 1 receives first
    while not stop.is_set():
        t0 = time.perf_counter()
        try:
            for op, tensor in ops:
                op(tensor, 1 - rank, group=group)
        except RuntimeError:
            if stop.is_set():  # the other rank exited after both finished computing
                return
            raise
        time.sleep(max(0.0, 2.0 / rate - (time.perf_counter() - t0)))


def run_arm(arm: str, args: argparse.Namespace) -> list[dict]:
    """The arm's processes, started together; their results."""
    n = 1 if arm == "alone" else 2
    ranks = arm in ("ranks", "transfers")
    rate = args.rate if arm == "transfers" else 0.0
    start_at = time.time() + 6.0  # after imports (and the process group)
    port = free_port()
    procs = []
    for rank in range(n):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(n), "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        cmd = [sys.executable, __file__, "--child", json.dumps(
            {"seconds": args.seconds, "start_at": start_at, "docs": args.docs, "rate": rate,
             "ranks": ranks})]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=300)[0] for p in procs]
    if any(p.returncode for p in procs):
        sys.exit(f"{arm}: a child failed")
    return [json.loads(o.strip().splitlines()[-1]) for o in outs]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rate", type=float, default=24.0)
    ap.add_argument("--docs", type=int, default=4, help="documents in the micro-batch")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(RESULTS / "host_interference.json"))
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(**json.loads(args.child))), flush=True)
        os._exit(0)  # no finalization of the process group's threads
    per: dict[str, list[float]] = {a: [] for a in ARMS}
    for _ in range(args.repeats):
        for arm in ARMS:
            per[arm].append(float(np.mean([r["median_ms"] for r in run_arm(arm, args)])))
    ratios = {"compute / alone": [c / a for c, a in zip(per["compute"], per["alone"],
                                                        strict=True)],
              "transfers / ranks": [t / r for t, r in zip(per["transfers"], per["ranks"],
                                                          strict=True)]}
    print(f"{'arm':<11}" + "".join(f"{'repeat ' + str(k + 1):>12}" for k in range(args.repeats)))
    for arm in ARMS:
        print(f"{arm:<11}" + "".join(f"{v:>12.2f}" for v in per[arm]) + "  ms")
    for name, vals in ratios.items():
        print(f"{name}: " + ", ".join(f"{v:.3f}" for v in vals)
              + f" (mean {np.mean(vals):.3f})")
    doc: dict[str, Any] = {**run_header("host_interference", argv, seconds=args.seconds,
                                        repeats=args.repeats, rate=args.rate, docs=args.docs),
                           "median_ms": per, "ratios": ratios,
                           "mean_ratios": {k: float(np.mean(v)) for k, v in ratios.items()}}
    write_json(args.out, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
