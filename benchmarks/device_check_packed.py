"""Section (iii) of ``device_check.py``: the packed GPT (``--model packed``) on one device.

(a) **Cost against the micro-batch's documents.** The packed GPT's blocks, forward and
    backward on one fixed-shape micro-batch of ``budget`` real tokens split into ``k`` equal
    documents (``k`` = 1, 2, 4, ...): the tokens stay fixed while ``tokens_sq`` falls as
    ``1/k`` and the documents (one attention call each) grow. Timed with CUDA events (the
    device's view) and with ``perf_counter`` around a synchronize (the host's view).
(b) **The learned cost model, live on the device.** The packed GPT as one pipeline stage of
    one rank (``Schedule1F1B`` over 4 micro-batches: on one device a stage per rank, as the
    cost model's per-rank speed assumes; the global-token loss, ``scale_grads=False``), fed
    the documents setting's data loader (``bench_live_balance.documents_loader``: lognormal
    documents of at most a quarter of the budget, the loader's own packing), recorded with
    ``bubblecast.record`` (device timing on CUDA, NVML metrics every step): two runs to fit
    :class:`~bubblecast.forecast.cost_model.CostModel` on, a held-out run with another seed to
    score it on (its p90 relative error: the "cost model, live" figure of issue 25, here on one
    device), and the held-out run once more with the same seed: the per-op spread of the two
    (``_live_ops.op_spread``) is the floor under any model's p90 on that run.
(c) **Device metrics into covariates.** The held-out run's NVML rows (what the sampler read:
    temperature, SM clock, power, the throttle reasons, the slowdown temperature) and the
    covariate features ``dataset --covariates auto`` builds from them.

Called by ``device_check.py`` (``--cpu`` dry-runs it at toy sizes); not a test.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

#: The packed GPT on the device: the documents setting's budget and vocabulary, wider blocks.
GPU_SHAPE = {"layers": 8, "hidden": 1024, "heads": 16}
CPU_SHAPE = {"layers": 4, "hidden": 64, "heads": 4}
#: Seconds one recorded run may go without finishing before every thread's stack is dumped.
STALL_S = 60.0


def _blocks(device: Any, dtype: Any, shape: dict[str, int], budget: int, vocab: int,
            layers: range) -> Any:
    """Layers ``layers`` of the packed GPT of ``shape`` as one ``DocumentStack``."""
    import torch

    from bubblecast.runtime.packed_gpt import DocumentStack, construct

    torch.manual_seed(0)
    kw = {"hidden": shape["hidden"], "heads": shape["heads"], "vocab": vocab, "budget": budget}
    return DocumentStack(*[construct(shape["layers"], i, **kw) for i in layers]).to(
        device=device, dtype=dtype)


def shape_sweep(device: Any, dtype: Any, shape: dict[str, int], budget: int, reps: int
                ) -> list[dict[str, Any]]:
    """(a): forward + backward of the blocks on ``budget`` tokens in ``k`` equal documents."""
    import torch

    cuda = device.type == "cuda"
    stack = _blocks(device, dtype, shape, budget, 128, range(1, shape["layers"] - 1))
    x = torch.randn(1, budget, shape["hidden"], device=device, dtype=dtype)
    rows = []
    k = 1
    while budget // k >= 16:
        n = budget // k
        documents = torch.arange(k, device=device).repeat_interleave(n)[None, :]

        def once(documents: Any = documents) -> None:
            y = x.detach().requires_grad_(True)
            stack(y, documents).float().square().mean().backward()

        for _ in range(2):
            once()
        host, dev = [], []
        for _ in range(reps):
            if cuda:
                torch.cuda.synchronize(device)
                a, b = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                a.record()
            t0 = time.perf_counter()
            once()
            if cuda:
                b.record()
                torch.cuda.synchronize(device)
                dev.append(a.elapsed_time(b))
            host.append(1e3 * (time.perf_counter() - t0))
        rows.append({"documents": k, "tokens": budget, "tokens_sq": k * n * n,
                     "host_ms": statistics.median(host),
                     "device_ms": statistics.median(dev) if dev else None})
        k *= 4
    return rows


def _record_run(device: Any, dtype: Any, shape: dict[str, int], seed: int, steps: int,
                out: Path, run_id: str) -> Path:
    """Train ``steps`` steps of the packed GPT (one stage holding it all) on the
    documents loader of ``seed``, recorded into ``out``; the events directory."""
    import torch
    from bench_live_balance import MODELS, documents_loader
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    import bubblecast
    from bubblecast.runtime.balanced_sampler import global_token_loss, loss_tokens

    m = MODELS["documents"]
    loader = documents_loader(seed)
    stack = _blocks(device, dtype, shape, m["seq_len"], m["vocab"], range(shape["layers"]))
    stage = PipelineStage(stack, 0, 1, device)
    denominator = {"tokens": 1}

    def loss_fn(logits: Any, labels: Any) -> Any:
        return global_token_loss(logits.float(), labels, denominator["tokens"])

    schedule = Schedule1F1B(stage, 4, loss_fn=loss_fn, scale_grads=False)
    opt = torch.optim.SGD(stack.parameters(), lr=1e-3)
    with bubblecast.record(schedule, out=out, run_id=run_id, optimizer=opt,
                           metrics_every=1) as rec:
        for step in range(steps):
            plan = loader.static_plan(step)
            batch = loader.tensors(step, plan.microbatches[0])
            denominator["tokens"] = loss_tokens(loader.lengths(step))
            rec.set_documents(batch.lengths)
            schedule.step(batch.tokens.to(device), documents=batch.documents.to(device),
                          target=batch.labels.to(device), losses=[])
            opt.step()
            opt.zero_grad(set_to_none=True)
        where = rec.events_dir
    return Path(where)


def metrics_summary(metrics: Any) -> dict[str, dict[str, float]]:
    """Per device metric: its samples' count, min, median and max."""
    out = {}
    for name, part in metrics.groupby("metric", sort=True):
        v = part["value"].astype(float)
        out[str(name)] = {"n": int(len(v)), "min": float(v.min()), "median": float(v.median()),
                          "max": float(v.max())}
    return out


def covariate_summary(events: Any, metrics: Any) -> dict[str, Any]:
    """The covariate columns ``dataset --covariates auto`` builds from ``metrics`` (short
    windows for a short run) and each one's share of finite values."""
    import numpy as np

    from bubblecast.dataset.builder import build_dataset
    from bubblecast.dataset.config import DatasetConfig
    from bubblecast.dataset.covariates import covariate_columns

    config = DatasetConfig(horizons=(1, 5), windows=(5, 20), lags=16, max_period=10,
                           covariates="auto")
    frame, _ = build_dataset(events, config, metrics=metrics)
    cols = covariate_columns(frame.columns)
    return {"rows": int(len(frame)),
            "columns": {c: float(np.isfinite(frame[c].to_numpy(dtype=float)).mean())
                        for c in cols}}


def packed_check(device: Any, steps: int, reps: int, tmp: Path,
                 keep: Any = lambda _partial: None) -> dict[str, Any]:
    """Sections (a)-(c) (module doc); one rank's process group must not exist yet. ``keep``
    gets the partial result after each part (the caller writes it: a run cut short keeps what
    it measured); a recorded run that makes no progress for ``STALL_S`` seconds dumps every
    thread's stack to stderr (``faulthandler``), so a stall says where it is."""
    import faulthandler

    from _device import dtype_for, one_rank_group, progress
    from _live_ops import op_spread
    from bench_live_balance import MODELS

    import bubblecast
    from bubblecast.forecast.cost_model import CostModel
    from bubblecast.telemetry.metrics import read_metrics

    dtype = dtype_for(device)
    shape = GPU_SHAPE if device.type == "cuda" else CPU_SHAPE
    budget = MODELS["documents"]["seq_len"]
    out: dict[str, Any] = {"model": {**shape, "budget": budget,
                                     "dtype": str(dtype).split(".")[-1]}}
    out["sweep"] = shape_sweep(device, dtype, shape, budget, reps)
    progress(f"(a) done: {len(out['sweep'])} shapes")
    keep(out)
    dirs: dict[str, Path] = {}
    with one_rank_group(device, tmp / "store-packed"):
        for name, seed in (("fit-a", 11), ("fit-b", 12), ("held", 13), ("held-again", 13)):
            faulthandler.dump_traceback_later(STALL_S, exit=False)
            try:
                dirs[name] = _record_run(device, dtype, shape, seed, steps, tmp / "packed",
                                         name)
            finally:
                faulthandler.cancel_dump_traceback_later()
            progress(f"(b) recorded {name}")
    events = {name: bubblecast.read_events(d) for name, d in dirs.items()}
    fit = bubblecast.Events.concat([events["fit-a"], events["fit-b"]])
    model = CostModel(holdout=0.5, seed=0).fit(fit)
    progress("(b) cost model fitted")
    scored = model.score(events["held"], "the held-out run")
    frame = events["held"].frame
    ends = frame["start_s"] + frame["duration_s"]
    step_s = ends.groupby(frame["step"]).max() - frame.groupby("step")["start_s"].min()
    out["cost_model"] = {"steps": steps, "learner": scored["learner"],
                         "speed_window": model.speed_window_,
                         "p50_rel_error": scored["p50_rel_error"],
                         "p90_rel_error": scored["p90_rel_error"],
                         "coverage_p10_p90": scored.get("coverage_p10_p90"),
                         "noise": op_spread(events["held"], events["held-again"]),
                         "timing": next(iter(events["held"].runs.values())).extra.get("timing"),
                         "median_step_ms": 1e3 * float(step_s.iloc[2:].median())}
    keep(out)
    metrics = read_metrics(dirs["held"])
    out["device_metrics"] = metrics_summary(metrics)
    out["covariates"] = covariate_summary(events["held"], metrics)
    return out


def print_packed(p: dict[str, Any]) -> None:
    """The section's table."""
    m = p["model"]
    print(f"(iii) packed GPT {m['layers']} layers, hidden {m['hidden']}, {m['heads']} heads, "
          f"budget {m['budget']}, {m['dtype']}")
    print(f"  (a) {'documents':>9} {'tokens_sq':>12} {'device ms':>10} {'host ms':>9}")
    for r in p["sweep"]:
        dev = f"{r['device_ms']:.3f}" if r["device_ms"] is not None else "-"
        print(f"      {r['documents']:>9} {r['tokens_sq']:>12} {dev:>10} {r['host_ms']:>9.3f}")
    c = p["cost_model"]
    print(f"  (b) cost model ({c['learner']}, speed window {c['speed_window']}) on a held-out "
          f"run of {c['steps']} steps ({c['timing']} timing, median step "
          f"{c['median_step_ms']:.1f} ms): p50 {c['p50_rel_error']:.3f}, p90 "
          f"{c['p90_rel_error']:.3f}; floor under any model's p90 "
          f"{c['noise']['p90_floor']:.3f} from {c['noise']['pairs']} ops run twice")
    print("  (c) device metrics (n, min, median, max):")
    for name, s in p["device_metrics"].items():
        print(f"      {name:<24} {s['n']:>5} {s['min']:>10.2f} {s['median']:>10.2f} "
              f"{s['max']:>10.2f}")
    cov = p["covariates"]
    print(f"      covariate features on {cov['rows']} rows: "
          + (", ".join(f"{k} ({v:.2f} finite)" for k, v in sorted(cov["columns"].items())[:8])
             or "none"))
