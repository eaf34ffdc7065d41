"""Balanced work, live: static, tokens and balance plans of the packed GPT on a real CPU pipeline.

Two settings (issue 25's goals), each ``--runs`` times:

- **documents**: 1 replica x 2 stages, 4 micro-batches per step, ``lognormal`` documents (at
  most a quarter of the 4096-token budget, where per-document attention is a large share of a
  micro-batch's time);
- **slow-replica**: 2 replicas x 2 stages (4 ranks), 4 micro-batches per replica, every rank
  of replica 1 slowed 1.5x from step ``onset`` on. Four ranks share this machine's 2 cores, so
  every rank's compute ops are stretched ``DILATION`` times by sleeping after them (an emulated
  device that much slower than the CPU): the ranks then need about one core between them, and
  the slowed replica's sleep does not hand the healthy one extra cores. ``--dilation X``
  stretches the documents setting's two ranks the same way (default: not stretched).

First, per setting, two static runs of the same setup are recorded (``collect``'s code path,
healthy) and the learned cost model is fitted to them (``CostModel``, the learner chosen on the
held-out run: its p90 relative error there is the "cost model, live" figure); the held-out run
is then recorded once more with the same seed, and the two runs' per-op spread is the noise
floor under that figure (below); beside it, a reference that is not a bound: the same learner
and speed window fitted on the held-out run itself and scored there (``insample_p90``). Then
one launch
per run holds one trainer per policy, each on its own process groups, their steps
interleaved (in an order shuffled every step, seeded, so that no trainer always follows the
same one; a barrier around each step) so that every policy sees the same load of this shared
machine; every trainer reads the same documents (same seed), so
their losses must agree at every step (asserted, float32 tolerance) and samples/s compare plain
step times. Extra trainers: ``loader`` (the live planner's machinery planning the loader's own
order: its step time against ``static`` is the planning overhead, A/B on the same steps),
``unrecorded`` (static without telemetry: the recording overhead) and, in slow-replica,
``healthy`` (static without the slowdown: the recovery's reference). Each trainer's time in
the step's plan call (the exchange with rank 0's planner process included) is reported beside.

Per run and policy: documents/s (after the first ``warm`` steps; in slow-replica over the slowed
steps after ``settle`` more), the ratio to static; slow-replica: the share of the slowdown
recovered, ``(t_static - t_policy) / (t_static - t_healthy)``, beside the bound the best
integer split of the micro-batches gives when a replica's time is ``speed x (M_r + P - 1)``
(fill and drain) -- 60% at 3|5 -- and the micro-batch counts balance ran. The static trainer's
telemetry is also evaluated offline (``policy-eval``'s code, timed against the run's own fit):
what the planner predicts for the same documents, the live gain's share of it (as a ratio, and
in seconds saved per step: the prediction's step is compute and bubbles only, the live one
also transfers and the rest of a step, which dilutes a ratio), and where the live gain goes
between the prediction and the wall clock: every recorded trainer writes its ops, and per
step the engine's 1F1B step composed from those ops' own durations (what the live costs
allow) and the compute window (first op start to last op end: what the pipeline made of
them) are compared with static's, and so is each trainer's pace (its ops' seconds over
what the cost model prices them at speed 1: packing does not change a step's work, so a
policy whose ops run at a slower pace loses that share of its gain to something the model
does not see), split into the ops no other rank computed beside (solo) and the rest (with
the solo ops' share of the modelled work); the bound (every
micro-batch at the step's mean cost), the floor (no plan of the same documents into the same
micro-batches beats it: :func:`bubblecast.policy.work_eval.step_floors`) and the optimum (the
best plan, solved exactly: :func:`bubblecast.policy.work_eval.step_optima`, whose proven bound
is the tight one). The cost model is
also scored on the static trainer's ops, and ``static`` and ``loader`` ran the same
micro-batches at the same steps, so their per-op time differences bound any cost model's error
from below: the "noise floor" (for a prediction ``f`` of ops timed ``a`` and ``b``,
``max(|f-a|/a, |f-b|/b) >= |a-b|/(a+b)``, so at least half the pairs whose spread exceeds ``x``
put an error above ``x``: the p90 error of any model is at least the 80th percentile of the
spread). Plain means over runs.

    python benchmarks/bench_live_balance.py [--quick] [--runs 3] [--settings documents]
        [--dilation 2] [--out results/live_balance-documents.json]

Prints a table, writes benchmarks/results/live_balance.json (``--quick``: live_balance-quick).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from bubblecast.runtime.shutdown import exit_process

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _live_ops import compute_windows, op_pace, op_spread  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
#: The packed GPT per setting: a 4096-token budget makes attention (per document, so
#: ``tokens_sq``) a large share of a micro-batch's time, which is what packing can balance.
MODELS = {"documents": {"kind": "packed", "layers": 4, "hidden": 64, "heads": 4,
                        "seq_len": 4096, "vocab": 128},
          "slow-replica": {"kind": "packed", "layers": 4, "hidden": 64, "heads": 4,
                           "seq_len": 1024, "vocab": 128}}
SETTINGS = {"documents": {"replicas": 1, "stages": 2, "microbatches": 4},
            "slow-replica": {"replicas": 2, "stages": 2, "microbatches": 4}}
FULL = {"steps": 90, "onset": 24, "settle": 12, "warm": 8, "collect": 48}
QUICK = {"steps": 48, "onset": 12, "settle": 12, "warm": 4, "collect": 40}
POLICIES = ("static", "tokens", "balance")
FACTOR = 1.5
#: slow-replica runs 4 ranks on this 2-core machine: every rank's compute ops are stretched
#: ``DILATION`` times by sleeping after them (``--inject rank=R,factor=DILATION`` on every
#: rank: the emulated device is that much slower than this CPU), so the ranks need about one
#: core between them and a sleeping slow replica does not hand its cores to the healthy one.
DILATION = 4.0
#: The documents setting's stretch by default: none (``--dilation`` sets one: its two ranks
#: then compute part of the time, as slow-replica's four do).
DOCUMENTS_DILATION = 1.0
#: Relative loss difference allowed between policies (float32 sums in another order).
LOSS_RTOL = 1e-4
#: Seconds the offline prediction's MILP may spend on each step's best plan.
OPTIMUM_S = 2.0


def documents_loader(seed: int) -> Any:
    """The documents setting's data loader (its budget, vocabulary and step shape)."""
    from bubblecast.runtime.document_loader import DocumentLoader

    m = MODELS["documents"]
    return DocumentLoader(budget=m["seq_len"], vocab=m["vocab"], seed=seed, schedule="1f1b",
                          **SETTINGS["documents"])


def documents_blocks(layers: range) -> Any:
    """The documents setting's packed GPT blocks ``layers`` (of its ``MODELS`` layers) as one
    ``DocumentStack``: the whole model, or one stage of it."""
    from bubblecast.runtime.packed_gpt import DocumentStack, construct

    m = MODELS["documents"]
    kw = {"hidden": m["hidden"], "heads": m["heads"], "vocab": m["vocab"],
          "budget": m["seq_len"]}
    return DocumentStack(*[construct(m["layers"], i, **kw) for i in layers])


def train_config(setting: str, steps: int, seed: int, run_id: str,
                 inject: str | None = None) -> Any:
    from bubblecast.runtime.train_config import ModelSpec, TrainConfig

    return TrainConfig(model=ModelSpec(**MODELS[setting]), **SETTINGS[setting],
                       schedule="1f1b", steps=steps, optimizer="adamw", lr=1e-3, seed=seed,
                       run_id=run_id, inject=inject, layer_cost_every=0)


def dilation_spec(setting: str, documents: float = DOCUMENTS_DILATION) -> str | None:
    """Every rank stretched :data:`DILATION` times in slow-replica, ``documents`` times in
    the documents setting (None: not stretched)."""
    factor = DILATION if setting == "slow-replica" else documents
    if factor == 1.0:
        return None
    ranks = SETTINGS[setting]["replicas"] * SETTINGS[setting]["stages"]
    return ";".join(f"rank={r},factor={factor:g}" for r in range(ranks))


def slow_spec(onset: int) -> str:
    """Replica 1 ``FACTOR`` times slower than the (dilated) others from ``onset``: the
    stretches add, so its extra factor is ``(FACTOR - 1) x DILATION``."""
    return f"{dilation_spec('slow-replica')};replica=1,factor={1 + (FACTOR - 1) * DILATION:g}," \
        f"start={onset}"


# -- the cost model: two recorded static runs of the same setup ------------------------------
def cost_model(setting: str, scale: dict[str, int], root: Path,
               stretch: str | None) -> tuple[str, dict[str, Any]]:
    """Record two static runs (every rank stretched by ``stretch``, an ``--inject`` spec, or
    not), fit the cost model on one and score it on the other; its directory and held-out
    metrics."""
    from bubblecast.forecast.cost_model import CostModel
    from bubblecast.forecast.cost_modeldir import save_cost_model
    from bubblecast.runtime.launch import run_out_job
    from bubblecast.telemetry import read_events
    from bubblecast.telemetry.events import Events

    recorded = {}  # run id -> (seed, events)
    for seed in (11, 12):
        out = root / f"{setting}-collect-{seed}.parquet"
        run_out_job(out, train_config(setting, scale["collect"], seed, f"collect-{seed}",
                                      stretch), timeout=1800)
        recorded[f"collect-{seed}"] = (seed, read_events(out))
    model = CostModel(holdout=0.5, seed=0).fit(Events.concat([e for _, e in recorded.values()]))
    where = root / f"{setting}-cost"
    save_cost_model(model, where)
    # the held-out run again, same seed: its ops' spread is the noise floor of any cost model
    held = model.training_["heldout_runs"][0]
    seed, held_events = recorded[held]
    twin = root / f"{setting}-collect-{seed}-twin.parquet"
    run_out_job(twin, train_config(setting, scale["collect"], seed, f"{held}-twin",
                                   stretch), timeout=1800)
    noise = op_spread(held_events, read_events(twin))
    # a reference, not a bound: the chosen learner and speed window fitted on the held-out
    # run itself and scored there (what this model family reaches having seen the run)
    own = CostModel(learner=model.learner_, holdout=0.0, speed_window=model.speed_window_,
                    seed=0).fit(held_events)
    noise["insample_p90"] = float(own.score(held_events)["p90_rel_error"])
    return str(where), {"learner": model.learner_, **(model.metrics_.get("heldout") or {}),
                        "heldout_run": held, "noise": noise}


# -- one interleaved launch --------------------------------------------------------------------
def worker(job_dir: Path) -> None:
    """On each rank under torchrun: one trainer per policy, their steps interleaved."""
    import torch
    import torch.distributed as dist

    from bubblecast.runtime.live_plan import LivePlanner
    from bubblecast.runtime.train_config import TrainConfig
    from bubblecast.runtime.trainer import Trainer, init_distributed

    job = json.loads((job_dir / "bench.json").read_text())
    init_distributed("gloo")
    torch.set_num_threads(1)
    names = list(job["runs"])
    trainers = {}
    for name in names:
        spec = job["runs"][name]
        config = TrainConfig.from_json(spec["config"])
        if spec.get("write"):  # recorded to a file (the offline prediction's input)
            config = replace(config, events_dir=str(job_dir / f"{name}-parts"))
        group = dist.new_group(backend="gloo") if config.replicas == 1 else None
        trainers[name] = Trainer(config, group=group, record=spec["record"])
        if spec.get("loader"):
            trainers[name].packed.planner = LivePlanner(trainers[name], "loader")
    sync = dist.new_group(backend="gloo")
    step_s: dict[str, list[float]] = {n: [] for n in names}
    plan_s: dict[str, list[float]] = {n: [] for n in names}
    for name in names:
        trainers[name].packed.plan = _timed(trainers[name].packed.plan, plan_s[name])
    order = random.Random(job["seed"])
    for _ in range(job["steps"]):
        for name in order.sample(names, len(names)):
            dist.barrier(group=sync)
            t0 = time.perf_counter()
            trainers[name].train_step()
            dist.barrier(group=sync)
            step_s[name].append(time.perf_counter() - t0)
    out = {}
    for name in names:
        t = trainers[name]
        planner = t.packed.planner
        out[name] = {"step_s": step_s[name], "plan_s": plan_s[name],
                     "losses": t.gather_losses(),
                     "counts": {str(k): v for k, v in t.packed.counts.items()},
                     "documents": [len(t.packed.loader.lengths(k)) for k in range(job["steps"])],
                     "decisions": planner.decisions if planner is not None else [],
                     "latency_s": [d.get("latency_s") for d in planner.decisions]
                     if planner is not None else []}
        if t.config.events_dir:
            t.close(str(job_dir / f"{name}.parquet"))
        else:
            t.packed.close()
    if dist.get_rank() == 0:
        (job_dir / "result.json").write_text(json.dumps(out, default=float))
    dist.barrier()
    dist.destroy_process_group()


def _timed(fn: Any, sink: list[float]) -> Any:
    """``fn`` appending its wall seconds per call to ``sink``."""
    def call(*args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            sink.append(time.perf_counter() - t0)
    return call


def run_interleaved(setting: str, scale: dict[str, int], seed: int, cost: str,
                    stretch: str | None) -> dict:
    """One launch of every trainer of ``setting``, each rank stretched by ``stretch`` (an
    ``--inject`` spec, or None); the raw per-trainer results and the offline prediction."""
    from bubblecast.runtime.launch import failure_message, launch

    slow = setting == "slow-replica"
    inject = slow_spec(scale["onset"]) if slow else stretch
    runs: dict[str, Any] = {}
    for name in (*POLICIES, "loader", "unrecorded", *(("healthy",) if slow else ())):
        planner = name if name in ("tokens", "balance") else "static"
        config = train_config(setting, scale["steps"], seed, f"{setting}-{name}",
                              stretch if name == "healthy" else inject)
        config = replace(config, planner=planner,
                         cost_model=cost if planner == "balance" else None)
        runs[name] = {"config": config.to_json(), "record": name != "unrecorded",
                      "write": name != "unrecorded",  # every recorded trainer alike
                      "loader": name == "loader"}
    ranks = SETTINGS[setting]["replicas"] * SETTINGS[setting]["stages"]
    with tempfile.TemporaryDirectory(prefix="bench-live-balance-") as tmp:
        job_dir = Path(tmp)
        (job_dir / "bench.json").write_text(json.dumps({"runs": runs, "steps": scale["steps"],
                                                        "seed": seed}))
        code = launch(job_dir, ranks, script=__file__, timeout=3600)
        if code != 0:
            sys.exit(f"benchmark failed: {failure_message(job_dir)}")
        from bubblecast.telemetry import read_events

        out = json.loads((job_dir / "result.json").read_text())
        static = read_events(job_dir / "static.parquet")  # read once, used twice
        from bubblecast.forecast.cost_modeldir import load_cost_model

        model = load_cost_model(cost)
        out["offline"] = offline_prediction(static, model)
        out["cost_noise"] = cost_noise(static, read_events(job_dir / "loader.parquet"), model)
        for name, spec in runs.items():
            events = static if name == "static" else \
                read_events(job_dir / f"{name}.parquet") if spec["write"] else None
            if events is not None:
                out[name]["windows"] = {**compute_windows(events, SETTINGS[setting]["stages"]),
                                        **op_pace(events, model)}
        return out


def offline_prediction(static: Any, model: Any) -> dict[str, dict[str, float | None]]:
    """What ``policy-eval`` predicts for the documents the static trainer recorded, timed
    against the run's own fit (no simulator truth: :mod:`bubblecast.policy.work_truth`),
    ``balance`` with the benchmark's cost model ``model`` (loaded once per launch):
    ``speedup``, each policy's over static, with ``bound`` (static over the step with every
    micro-batch at the step's mean cost: a
    reference, not a limit, since light end micro-batches beat it), ``floor`` (the
    critical-path floor) and ``optimum`` (the MILP's proven bound, at most
    :data:`OPTIMUM_S` seconds a step: no plan of these documents is faster); ``step_s``, each
    policy's predicted step seconds (compute and bubbles: the fit leaves transfers and the
    rest of a step out)."""
    from bubblecast.policy.policy_evaluation import EvalConfig, evaluate_events

    names = ["static", "tokens", "balance", "oracle"]
    result, _ = evaluate_events(static, names, EvalConfig(cost_model=model,
                                                          optimum_s=OPTIMUM_S))
    rows = result["policies"]
    speedup: dict[str, float | None] = {n: float(rows[n]["speedup_vs_static"]) for n in names}
    speedup["bound"] = float(rows["static"]["step_s"] / rows["static"]["bound_step_s"])
    floor = rows["static"].get("floor_step_s")
    speedup["floor"] = float(rows["static"]["step_s"] / floor) if floor else None
    optimum = rows["static"].get("optimum_step_s")
    speedup["optimum"] = float(rows["static"]["step_s"] / optimum) if optimum else None
    return {"speedup": speedup, "step_s": {n: float(rows[n]["step_s"]) for n in names}}


def cost_noise(static: Any, loader: Any, model: Any) -> dict[str, float]:
    """The cost model ``model``'s error on the static trainer's ops (``static``: its events)
    and the noise floor under any cost model's error: per compute op run by both ``static``
    and ``loader`` (same micro-batch, step and rank), the spread ``|a - b| / (a + b)`` (see
    the module doc)."""
    scored = model.score(static, "the static trainer's events")
    return {**op_spread(static, loader),
            "model_p50_rel_error": float(scored["p50_rel_error"]),
            "model_p90_rel_error": float(scored["p90_rel_error"])}


# -- figures -------------------------------------------------------------------------------
def split_bound(m: int, stages: int, factor: float) -> dict[str, Any]:
    """The best integer split of ``2 m`` micro-batches over a healthy and a ``factor``-slow
    replica when a replica takes ``speed x (M_r + P - 1)``: its recovery of the slowdown."""
    static = factor * (m + stages - 1)
    healthy = m + stages - 1
    best = min((max(factor * (k + stages - 1), (2 * m - k) + stages - 1), k)
               for k in range(1, 2 * m))
    return {"split": [best[1], 2 * m - best[1]],
            "recovery": (static - best[0]) / (static - healthy)}


def summarise_run(setting: str, raw: dict[str, Any], scale: dict[str, int]) -> dict[str, Any]:
    slow = setting == "slow-replica"
    lo = scale["onset"] + scale["settle"] if slow else scale["warm"]
    out: dict[str, Any] = {}
    raw = dict(raw)
    offline = raw.pop("offline")
    noise = raw.pop("cost_noise")
    ref = raw["static"]["losses"]
    for name, r in raw.items():
        losses = r["losses"]
        worst = max(abs(float(losses[k]) - float(ref[k])) / max(abs(float(ref[k])), 1e-12)
                    for k in ref)
        assert worst < LOSS_RTOL, f"{setting}/{name}: losses differ from static by {worst:.2e}"
        step = np.asarray(r["step_s"])[lo:]
        docs = np.asarray(r["documents"])[lo:]
        lat = [x for x in r["latency_s"] if x is not None]
        paired = step / np.asarray(raw["static"]["step_s"])[lo:]
        out[name] = {"samples_s": float(docs.sum() / step.sum()),
                     "step_s": float(step.mean()), "loss_max_rel_diff": worst,
                     "ratio_paired_median": float(1.0 / np.median(paired)),
                     "decision_ms": 1e3 * float(np.mean(lat)) if lat else None,
                     "plan_call_ms": 1e3 * float(np.mean(r["plan_s"][lo:])),
                     "fallbacks": sum(1 for d in r["decisions"] if d.get("fallback"))}
        if name == "balance":
            counts = np.array([r["counts"][str(k)] for k in range(len(r["step_s"]))])
            out[name]["mean_counts_after"] = counts[lo:].mean(axis=0).round(3).tolist()
            first = next((k for k in range(len(counts)) if counts[k][0] != counts[k][-1]), None)
            out[name]["first_uneven_step"] = first
    for name, r in raw.items():
        if "windows" in r:  # the compute window and the engine on the live ops, same steps
            out[name].update({k: float(np.mean(v[lo:])) for k, v in r["windows"].items()})
    base = out["static"]
    for r in out.values():
        r["ratio"] = r["samples_s"] / base["samples_s"]
        for key in ("window_s", "engine_s"):
            if key in r and key in base:
                r[key.replace("_s", "_ratio")] = base[key] / r[key]
        if "pace" in r and "pace" in base:
            r["pace_vs_static"] = r["pace"] / base["pace"]
        if r.get("solo_base"):  # per-step means: their ratios are ratios of sums
            r["solo_share"] = r["solo_base"] / (r["solo_base"] + r["overlap_base"])
            r["pace_solo"] = r["solo_s"] / r["solo_base"]
            r["pace_overlap"] = r["overlap_s"] / r["overlap_base"]
    out["per_step_s"] = {n: [round(float(x), 6) for x in raw[n]["step_s"]]
                         for n in ("static", "balance", *(("healthy",) if slow else ()))}
    out["offline_speedup"] = offline["speedup"]
    out["offline_step_s"] = offline["step_s"]
    out["cost_noise"] = noise
    predicted = offline["speedup"]["balance"] - 1.0
    out["gain_share_of_offline"] = (out["balance"]["ratio"] - 1.0) / predicted \
        if predicted > 0 else None
    # the same in seconds saved per step: the prediction's step is compute and bubbles only,
    # the live one also transfers and the rest, so its ratio is diluted
    out["saving_share_of_offline"] = {
        n: (base["step_s"] - out[n]["step_s"]) / saved if (saved := offline["step_s"][
            "static"] - offline["step_s"][n]) > 0 else None for n in ("tokens", "balance")}
    out["overhead_pct_planner"] = 100.0 * (out["loader"]["step_s"] / base["step_s"] - 1.0)
    out["overhead_pct_recording"] = 100.0 * (base["step_s"] / out["unrecorded"]["step_s"] - 1.0)
    # paired per step (interleaved steps share the machine's load): robust to load spikes
    out["overhead_pct_planner_paired_median"] = 100.0 * (
        1.0 / out["loader"]["ratio_paired_median"] - 1.0)
    # the A/B's own noise: standard error of the mean per-step log ratio, in percent
    log_ratio = np.log(np.asarray(raw["loader"]["step_s"])[lo:]
                       / np.asarray(raw["static"]["step_s"])[lo:])
    out["overhead_pct_planner_se"] = 100.0 * float(log_ratio.std(ddof=1)
                                                   / np.sqrt(len(log_ratio)))
    if slow:
        t_static, t_healthy = base["step_s"], out["healthy"]["step_s"]
        for name in ("tokens", "balance"):
            out[name]["recovery"] = (t_static - out[name]["step_s"]) / (t_static - t_healthy)
    return out


def mean_of(runs: list[dict[str, Any]], path: tuple[str, ...]) -> float | None:
    """Plain mean over ``runs`` of the value at ``path`` (runs without it, or None, skipped)."""
    vals = []
    for r in runs:
        for key in path:
            r = r.get(key) if isinstance(r, dict) else None
        vals.append(r)
    vals = [v for v in vals if v is not None]
    return float(np.mean(vals)) if vals else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--dilation", type=float, default=DOCUMENTS_DILATION,
                    help="stretch every rank's compute this many times in the documents "
                         "setting (an emulated device that much slower than this CPU; "
                         "default 1: not stretched)")
    ap.add_argument("--out", type=Path, default=None,
                    help="results JSON (default: results/live_balance.json, -quick with --quick)")
    args = ap.parse_args()
    scale = QUICK if args.quick else FULL
    from _results import run_header, write_json

    doc: dict[str, Any] = run_header("live_balance", models=MODELS, scale=scale,
                                     factor=FACTOR, dilation=DILATION,
                                     documents_dilation=args.dilation, runs=args.runs,
                                     settings={})
    with tempfile.TemporaryDirectory(prefix="bench-live-balance-cost-") as tmp:
        for setting in args.settings.split(","):
            print(f"{setting}: recording two static runs for the cost model ...",
                  file=sys.stderr, flush=True)
            stretch = dilation_spec(setting, args.dilation)
            cost, metrics = cost_model(setting, scale, Path(tmp), stretch)
            runs = []
            for k in range(args.runs):
                print(f"{setting}: interleaved run {k + 1}/{args.runs} ...", file=sys.stderr,
                      flush=True)
                runs.append(summarise_run(setting, run_interleaved(setting, scale, 100 + k,
                                                                   cost, stretch), scale))
            names = [n for n in runs[0] if isinstance(runs[0][n], dict)
                     and n not in ("offline_speedup", "offline_step_s", "per_step_s",
                                   "cost_noise", "saving_share_of_offline")]
            mean = {n: {key: mean_of(runs, (n, key)) for key in
                        ("samples_s", "ratio", "ratio_paired_median", "step_s", "recovery",
                         "decision_ms", "plan_call_ms", "window_s", "window_ratio",
                         "engine_s", "engine_ratio", "pace", "pace_vs_static",
                         "solo_share", "pace_solo", "pace_overlap")}
                    for n in names}
            entry = {"cost_model_heldout": metrics, "runs": runs, "mean": mean,
                     "overhead_pct_planner": float(np.mean([r["overhead_pct_planner"]
                                                           for r in runs])),
                     "overhead_pct_recording": float(np.mean([r["overhead_pct_recording"]
                                                             for r in runs])),
                     "overhead_pct_planner_per_run": [r["overhead_pct_planner"] for r in runs],
                     "overhead_pct_planner_se_per_run": [r["overhead_pct_planner_se"]
                                                         for r in runs],
                     "offline_speedup": {n: mean_of(runs, ("offline_speedup", n))
                                         for n in runs[0]["offline_speedup"]},
                     "cost_noise": {k: mean_of(runs, ("cost_noise", k))
                                    for k in runs[0]["cost_noise"]},
                     "offline_step_s": {n: mean_of(runs, ("offline_step_s", n))
                                        for n in runs[0]["offline_step_s"]},
                     "gain_share_of_offline": mean_of(runs, ("gain_share_of_offline",)),
                     "saving_share_of_offline": {
                         n: mean_of(runs, ("saving_share_of_offline", n))
                         for n in runs[0]["saving_share_of_offline"]},
                     "balance_ratio_per_run": [r["balance"]["ratio"] for r in runs]}
            if setting == "slow-replica":
                entry["bound"] = split_bound(SETTINGS[setting]["microbatches"],
                                             SETTINGS[setting]["stages"], FACTOR)
            doc["settings"][setting] = entry
            print(f"\n{setting} (mean of {args.runs}; cost model held-out p90 "
                  f"{metrics.get('p90_rel_error', float('nan')):.3f}, {metrics.get('learner')}; "
                  f"floor under any model's p90 on that run {metrics['noise']['p90_floor']:.3f} "
                  f"from {metrics['noise']['pairs']} ops run twice; fitted on that run itself "
                  f"{metrics['noise']['insample_p90']:.3f})")
            print(f"{'policy':<12}{'docs/s':>10}{'x static':>10}{'paired':>9}{'recovery':>10}"
                  f"{'decide ms':>11}{'plan call ms':>14}")
            for n in names:
                m = mean[n]
                rec = "-" if m["recovery"] is None else f"{m['recovery']:.2f}"
                dec = "-" if m["decision_ms"] is None else f"{m['decision_ms']:.2f}"
                print(f"{n:<12}{m['samples_s']:>10.1f}{m['ratio']:>10.3f}"
                      f"{m['ratio_paired_median']:>9.3f}{rec:>10}{dec:>11}"
                      f"{m['plan_call_ms']:>14.2f}")
            print(f"planner overhead {entry['overhead_pct_planner']:+.2f}% (loader plan vs "
                  f"static; per run " + ", ".join(
                      f"{v:+.2f}% (se {e:.2f})" for v, e in zip(
                          entry["overhead_pct_planner_per_run"],
                          entry["overhead_pct_planner_se_per_run"], strict=True))
                  + f"), recording {entry['overhead_pct_recording']:+.2f}%")
            off = entry["offline_speedup"]
            share = entry["gain_share_of_offline"]
            print("offline policy-eval on the static trainer's documents (mean): " + ", ".join(
                f"{n} {v:.3f}x" for n, v in off.items() if v is not None)
                + "; live balance gain / predicted: "
                + ("-" if share is None else f"{share:.2f}"))
            print("the gain, step by step (static over policy): " + "; ".join(
                f"{n}: predicted {off[n]:.3f}x, engine on the live ops "
                f"{mean[n]['engine_ratio'] or float('nan'):.3f}x, live compute window "
                f"{mean[n]['window_ratio'] or float('nan'):.3f}x, wall {mean[n]['ratio']:.3f}x"
                for n in ("tokens", "balance")))
            print("ops' pace per modelled second, against static's (same work, 1 = same "
                  "speed): " + ", ".join(f"{n} {mean[n]['pace_vs_static']:.3f}" for n in names
                                         if mean[n].get("pace_vs_static") is not None))
            print("ops with no other rank computing beside them: share of the modelled work, "
                  "pace (solo | beside another rank): " + ", ".join(
                      f"{n} {mean[n]['solo_share']:.3f}, {mean[n]['pace_solo']:.3f} | "
                      f"{mean[n]['pace_overlap']:.3f}" for n in names
                      if mean[n].get("solo_share") is not None))
            saved = entry["saving_share_of_offline"]
            print(f"predicted static step {entry['offline_step_s']['static'] * 1e3:.1f} ms "
                  "(compute and bubbles) against live "
                  f"{mean['static']['step_s'] * 1e3:.1f} ms; seconds saved live / predicted: "
                  + ", ".join(f"{n} {'-' if v is None else f'{v:.2f}'}"
                              for n, v in saved.items()))
            noise = entry["cost_noise"]
            print(f"cost model on the static trainer's ops: p90 {noise['model_p90_rel_error']:.3f}"
                  f"; any model's p90 is at least {noise['p90_floor']:.3f} (80th percentile of "
                  f"the static/loader spread on {noise['pairs']:.0f} identical ops)")
            print("balance x static per run: " + ", ".join(
                f"{v:.3f}" for v in entry["balance_ratio_per_run"]))
            if "bound" in entry:
                b = entry["bound"]
                print(f"bound: best integer split {b['split']} recovers {b['recovery']:.0%}")
    write_json(args.out or RESULTS / ("live_balance-quick.json" if args.quick
                                      else "live_balance.json"), doc)


if __name__ == "__main__":
    import os

    if "RANK" in os.environ and "LOCAL_RANK" in os.environ:
        worker(Path(sys.argv[1]))
        exit_process(0)  # no finalization: see bubblecast.runtime.shutdown
    else:
        main()
