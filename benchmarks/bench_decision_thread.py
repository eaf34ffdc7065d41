"""Where rank 0 decides: in its decision process or on its decision thread while a step
trains, or inline on the training thread (direct A/B).

One trainer (bench_live's pipeline: 2 CPU ranks under torchrun/gloo, MLP of 12 layers, 1F1B, 4
micro-batches, no fault) with two controllers running the predictive policy on a LightGBM model
with device covariates (the learned lead's model of ``bench_live.py --learned``: trained here,
or reused from ``--work``), one deciding in a worker process (``decide_in="process"``) and one
on a thread (``decide_in="thread"``), decisions every :data:`EVERY` steps. Four arms, in
interleaved blocks of ``--block`` steps (``benchmarks/_ab.py``: the order rotates every round,
barriers around each block); in each block at most one controller observes boundaries:

- ``off``: both controllers disabled (no boundary observed): the reference;
- ``process``: ``Controller.before_step`` hands each decision to rank 0's decision process
  before the step and ``after_step`` collects it (``bubblecast run``'s default);
- ``thread``: the same with the decision on a thread of the training process;
- ``inline``: the thread's controller without ``before_step``, so ``after_step`` takes the
  decision itself on the training thread (the controller's behaviour until commit 049e25a).

Blocks are a multiple of :data:`EVERY` steps long, so each holds the same number of decisions;
a decision observed at a block's last boundary is taken in the next block, in that block's way.
Wall seconds per step, per round and arm, on rank 0; per-round ratios against ``off`` and
between ``inline`` and ``thread``: the median with its distribution-free 95% interval and the
ratio of totals with a bootstrap interval (``paired_summary``). The decisions' own latency
(``latency_s`` of each record, on whichever thread took it) and the layer moves are reported
beside, since a move changes every later block's step.

    python benchmarks/bench_decision_thread.py [--rounds 60] [--block 20] [--work DIR]

Prints a table; writes benchmarks/results/decision_thread.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _ab import is_worker, paired_summary, run_job, timed_rounds  # noqa: E402

from bubblecast.runtime.shutdown import exit_process  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "decision_thread.json"
ARMS = ("off", "process", "thread", "inline")
#: The paired comparisons reported: ``(a, b)`` is a's step time against b's.
PAIRS = (("process", "off"), ("thread", "off"), ("inline", "off"), ("thread", "process"))
EVERY = 10
#: Steps before the rounds: the model's features need 60 steps of history.
WARMUP_STEPS = 80
TIMEOUT_S = 5.0


def worker(job_dir: Path) -> None:
    """Each rank: the trainer, its controller and the timed rounds (module docstring)."""
    import torch
    import torch.distributed as dist

    from bubblecast.runtime.control.control_config import ControllerConfig
    from bubblecast.runtime.control.loop import Controller
    from bubblecast.runtime.train_config import TrainConfig
    from bubblecast.runtime.trainer import Trainer, init_distributed

    job = json.loads((job_dir / "bench.json").read_text())
    init_distributed("gloo")
    torch.set_num_threads(1)
    trainer = Trainer(TrainConfig.from_json(job["config"]), group=dist.new_group(backend="gloo"))
    control = ControllerConfig.from_json(job["control"])
    ctls = {where: Controller(trainer, replace(control, decide_in=where))
            for where in ("process", "thread")}
    mode = {"before": True}

    def step() -> None:
        if mode["before"]:
            for c in ctls.values():
                c.before_step()
        trainer.train_step()
        for c in ctls.values():
            c.after_step()

    def arm(name: str) -> tuple[Any, Any]:
        def enter() -> None:
            ctls["process"].enabled = name == "process"
            ctls["thread"].enabled = name in ("thread", "inline")
            mode["before"] = name != "inline"
        return enter, (lambda: None)

    for _ in range(WARMUP_STEPS):
        step()
    sync = dist.new_group(backend="gloo")
    times = timed_rounds({n: arm(n) for n in ARMS}, step, job["rounds"], job["block"],
                         lambda: dist.barrier(group=sync))
    for c in ctls.values():
        c.finish()
    if dist.get_rank() == 0:
        moves = [a for a in trainer.actions if a.get("ok") and a.get("from") != a.get("to")]
        (job_dir / "result.json").write_text(json.dumps({
            "wall": {n: times[n]["wall"] for n in ARMS},
            "latency_s": {w: [d["latency_s"] for d in c.decisions] for w, c in ctls.items()},
            "reasons": [d["reason"] for c in ctls.values() for d in c.decisions],
            "forecaster": ctls["process"].note,
            "moves": [{"step": a["step"], "to": a["to"]} for a in moves]}, default=float))
    for c in ctls.values():
        c.close()
    dist.destroy_process_group()


def summarize(res: dict[str, Any]) -> dict[str, Any]:
    """Per arm the median step; the paired overheads; the decisions' latency and failures."""
    wall = res["wall"]
    lat = {w: sorted(1e3 * x for x in v) for w, v in res["latency_s"].items()}
    failed = [r for r in res["reasons"] if any(
        w in r for w in ("failed", "timed out", "still running", "unanswered"))]
    return {
        "step_ms": {n: 1e3 * statistics.median(wall[n]) for n in ARMS},
        **{f"{a}_vs_{b}": paired_summary(wall[a], wall[b]) for a, b in PAIRS},
        "decisions": sum(len(v) for v in lat.values()),
        "decision_ms_median": {w: statistics.median(v) if v else None for w, v in lat.items()},
        "decisions_failed": len(failed), "moves": res["moves"], "forecaster": res["forecaster"],
    }


def report(s: dict[str, Any], rounds: int, block: int) -> None:
    print(f"{rounds} rounds x {block} steps per arm; median step "
          + ", ".join(f"{n} {v:.2f} ms" for n, v in s["step_ms"].items()))
    print(f"{'comparison':>17} {'median % (95% CI)':>26} {'total % (95% CI)':>26}")
    for key in (f"{a}_vs_{b}" for a, b in PAIRS):
        r = s[key]
        print(f"{key:>17} " + " ".join(
            f"{r[m]:+7.2f} ({r[ci][0]:+.2f}..{r[ci][1]:+.2f})".rjust(26)
            for m, ci in (("median_pct", "ci95_pct"), ("total_pct", "total_ci95_pct"))))
    median = ", ".join(f"{w} {v:.2f} ms" for w, v in s["decision_ms_median"].items()
                       if v is not None)
    print(f"decisions {s['decisions']} (median {median}; {s['decisions_failed']} failed or "
          f"late), layer moves {len(s['moves'])}")


def main() -> int:
    from _results import run_header, write_json
    from bench_live import lead_model, train_config

    from bubblecast.runtime.control.control_config import ControllerConfig

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=60, help="rounds (default 60)")
    ap.add_argument("--block", type=int, default=20,
                    help=f"steps per arm per round, a multiple of {EVERY} (default 20)")
    ap.add_argument("--hidden", type=int, default=512, help="MLP width")
    ap.add_argument("--work", type=Path, default=None,
                    help="bench_live.py --learned's folder: reuse its model (else train one)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    if args.block < EVERY or args.block % EVERY or args.rounds < 6:
        ap.error(f"--block: a positive multiple of {EVERY}; --rounds: at least 6")
    with tempfile.TemporaryDirectory(prefix="bench-decision-thread-") as tmp:
        model, training = lead_model(args.work or Path(tmp), args.hidden, quick=False)
        rise = training["lead_rise"]["rise"]
        steps = WARMUP_STEPS + args.rounds * len(ARMS) * args.block + 2 * EVERY
        config = train_config(steps, None, "decision-thread", args.hidden)
        control = ControllerConfig(policy="predictive", every=EVERY, model=model,
                                   timeout_s=TIMEOUT_S, lead_rise=rise)
        load = list(os.getloadavg())
        res = run_job(__file__, {"config": config.to_json(), "control": control.to_json(),
                                 "rounds": args.rounds, "block": args.block}, timeout=1800)
    summary = summarize(res)
    report(summary, args.rounds, args.block)
    write_json(args.out, {**run_header(
        "decision_thread", backend="gloo", ranks=2, load_average=[load, list(os.getloadavg())],
        model=f"mlp L=12 hidden={args.hidden} batch=64 microbatches=4 1f1b sgd",
        every=EVERY, rounds=args.rounds, block=args.block, arms=list(ARMS)),
        "summary": summary})
    return 0


if __name__ == "__main__":
    if is_worker():
        worker(Path(sys.argv[1]))
        exit_process(0)  # no finalization: see bubblecast.runtime.shutdown
    else:
        sys.exit(main())
