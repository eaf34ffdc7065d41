"""GPU check of device-true timing: run it on a machine with one CUDA device (< 3 minutes).

(0) **NVML's thermal limits** (seconds): what the device reports as its slowdown temperature
    and its thermal margin (or why a call failed), and one reading of the recorder's NVML
    sampler with the warning it gives where the slowdown temperature comes from the margin.

(i) Times one known kernel (a chain of square matmuls) several ways and compares them with raw
    CUDA events around it: the recorder's device timing (event pairs on the current stream,
    resolved in a batch), ``perf_counter`` around a ``synchronize`` on both sides, and the
    recorder's host timing (``perf_counter`` around the call, without a synchronize: launch
    time, what the recorder measured on CUDA before device timing). It also checks an
    emulated 2x slowdown on the device (``--inject`` path: calibrated spin kernels on the
    stream): recorded F should be twice the raw-event time.
(ii) Trains a short 4-stage interleaved pipeline on this one device (a one-rank process group,
    ``ScheduleInterleaved1F1B`` with four virtual stages) under ``bubblecast.record`` and
    ``torch.profiler`` at once, imports the Kineto trace with the bubblecast importer (device
    timing: kernel spans) and compares its per-op durations with the recorder's.

(iii) The packed GPT on the device (``device_check_packed.py``): its cost against the
    micro-batch's documents, the learned cost model's error on a held-out recorded run beside
    the floor run-to-run noise puts under it, and the NVML device metrics the recorder sampled
    with the covariate features ``dataset --covariates auto`` builds from them.

    python benchmarks/device_check.py [--size 4096] [--reps 30] [--out PATH]
    python benchmarks/device_check.py --cpu     # dry run of the same code on CPU (no JSON)

Prints a table and writes benchmarks/results/device_check.json (after every section: a run
cut short keeps what it measured; a failed section is kept as its error and the check exits
1). Without a CUDA device it exits with a message and writes nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "device_check.json"
SECTIONS = ("nvml", "kernel", "pipeline", "packed")


def _stage_of(fn: Any) -> Any:
    """An object shaped like a PipelineStage whose forward runs ``fn``."""

    class KernelStage:
        def forward_one_chunk(self, mb: int, *a: Any, **k: Any) -> Any:
            return fn()

        backward_one_chunk = backward_weight_one_chunk = forward_one_chunk

    return KernelStage()


def _recorder_ms(fn: Any, reps: int, device: Any, *, timer: Any = None,
                 inject: str | None = None) -> list[float]:
    """F durations (ms) of ``reps`` calls of ``fn`` as the recorder records them."""
    from bubblecast.runtime.inject import parse_inject
    from bubblecast.runtime.rank_recorder import Recorder
    from bubblecast.telemetry.schema import RunMeta

    rec = Recorder(run_id="check", rank=0, stage=0, origin_wall=0.0, meta_fn=RunMeta,
                   timer=timer, device=str(device), flush_every=10**9,
                   injections=parse_inject(inject))
    stage = _stage_of(fn)
    rec.attach([stage], {0: {}})
    for step in range(reps):
        rec.begin_step(step, 0)
        stage.forward_one_chunk(0)
        rec.end_step()
    frame = rec.frame()
    return list(1e3 * frame.loc[frame["op"] == "F", "duration_s"].to_numpy())


def nvml_check(index: int) -> dict[str, Any]:
    """Section (0): NVML's thermal limits of GPU ``index`` and one row of the recorder's
    sampler (``available`` False, with the reason, without nvidia-ml-py or a driver)."""
    import warnings

    from bubblecast.runtime.sampler import nvml_reader, nvml_thermal

    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    except Exception as exc:  # noqa: BLE001 - reported in the JSON
        return {"available": False, "reason": f"{type(exc).__name__}: {exc}"}
    out: dict[str, Any] = {"available": True, "name": str(pynvml.nvmlDeviceGetName(handle)),
                           "driver": str(pynvml.nvmlSystemGetDriverVersion()),
                           "limits": nvml_thermal(pynvml, handle)}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        read = nvml_reader(index)
        out["sampler_row"] = read() if read is not None else None
    out["sampler_warnings"] = [str(w.message) for w in caught]
    return out


def kernel_check(device: Any, size: int, reps: int, chain: int) -> dict[str, Any]:
    """(i): one kernel timed several ways; medians in ms and ratios to raw CUDA events."""
    import torch
    from _device import dtype_for

    cuda = device.type == "cuda"
    dtype = dtype_for(device)
    x = torch.randn(size, size, device=device, dtype=dtype) / size**0.5

    def kernel() -> Any:
        y = x
        for _ in range(chain):
            y = y @ x
        return y

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    for _ in range(5):
        kernel()
    sync()
    ways: dict[str, list[float]] = {}
    if cuda:
        from bubblecast.runtime.device_timing import EventTimer

        raw = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            kernel()
            b.record()
            b.synchronize()
            raw.append(a.elapsed_time(b))
        ways["raw CUDA events"] = raw
        ways["recorder, device timing"] = _recorder_ms(kernel, reps, device,
                                                       timer=EventTimer.for_device(device))
    sync_ms = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        kernel()
        sync()
        sync_ms.append(1e3 * (time.perf_counter() - t0))
    ways["perf_counter + synchronize"] = sync_ms
    ways["recorder, host timing (no sync)"] = _recorder_ms(kernel, reps, device)
    sync()
    if cuda:
        ways["recorder, device, 2x injected"] = _recorder_ms(
            kernel, reps, device, timer=EventTimer.for_device(device), inject="rank=0,factor=2")
    ref_name = "raw CUDA events" if cuda else "perf_counter + synchronize"
    ref = statistics.median(ways[ref_name])
    return {"kernel": f"{chain} x matmul {size}x{size} {str(dtype).split('.')[-1]}",
            "reps": reps, "reference": ref_name,
            "ways": {k: {"median_ms": statistics.median(v), "min_ms": min(v),
                         "max_ms": max(v), "ratio_to_reference": statistics.median(v) / ref}
                     for k, v in ways.items()}}


def _pipeline(device: Any, hidden: int, layers: int) -> tuple[Any, Any, Any, Any]:
    """A ``layers``-layer MLP as four virtual stages of one rank; schedule, optimizer."""
    import torch
    from _device import dtype_for
    from torch.distributed.pipelining import PipelineStage, ScheduleInterleaved1F1B

    torch.manual_seed(0)
    dtype = dtype_for(device)
    blocks = [torch.nn.Sequential(torch.nn.Linear(hidden, hidden), torch.nn.GELU())
              .to(device=device, dtype=dtype) for _ in range(layers)]
    per = layers // 4
    stages = [PipelineStage(torch.nn.Sequential(*blocks[v * per:(v + 1) * per]), v, 4, device)
              for v in range(4)]
    schedule = ScheduleInterleaved1F1B(stages, 8, loss_fn=torch.nn.functional.mse_loss)
    opt = torch.optim.SGD([p for b in blocks for p in b.parameters()], lr=1e-3)
    return stages, schedule, opt, dtype


def pipeline_check(device: Any, hidden: int, layers: int, steps: int, tmp: Path
                   ) -> dict[str, Any]:
    """(ii): record and profile the same steps; compare the recorder with the importer."""
    import torch
    from _device import one_rank_group

    import bubblecast

    with one_rank_group(device, tmp / "store"):
        stages, schedule, opt, dtype = _pipeline(device, hidden, layers)
        x = torch.randn(64, hidden, device=device, dtype=dtype)
        y = torch.randn(64, hidden, device=device, dtype=dtype)
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        trace_dir = tmp / "trace"
        trace_dir.mkdir()
        prof = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(wait=2, warmup=0, active=steps - 2, repeat=1),
            on_trace_ready=lambda p: p.export_chrome_trace(str(trace_dir / "rank0.json")))
        with bubblecast.record(schedule, out=tmp / "telemetry", run_id="check",
                               optimizer=opt) as rec, prof:
            for _ in range(steps):
                schedule.step(x, target=y)
                opt.step()
                opt.zero_grad()
                prof.step()
        recorded = bubblecast.read_events(rec.events_dir)
        imported = bubblecast.load_events(trace_dir, format="kineto")
    rec_meta, imp_meta = next(iter(recorded.runs.values())), next(iter(imported.runs.values()))
    rf = recorded.frame.loc[recorded.frame["step"] >= 2]  # the profiled steps
    ops = {}
    for op in ("F", "B"):
        a = rf.loc[rf["op"] == op, "duration_s"]
        b = imported.frame.loc[imported.frame["op"] == op, "duration_s"]
        if len(a) and len(b):
            ops[op] = {"recorder_median_ms": 1e3 * float(a.median()), "recorded_ops": len(a),
                       "kineto_median_ms": 1e3 * float(b.median()), "kineto_ops": len(b),
                       "ratio": float(a.median() / b.median())}
    return {"model": f"{layers} x (Linear {hidden} + GELU) {str(dtype).split('.')[-1]}, "
                     f"4 virtual stages, 8 microbatches of 8",
            "steps": steps, "recorder_timing": rec_meta.extra.get("timing"),
            "kineto_timing": imp_meta.extra.get("timing"),
            "kineto_schedule": imp_meta.schedule, "ops": ops}


def _print_kernel(kernel: dict[str, Any]) -> None:
    print(f"(i) {kernel['kernel']}, {kernel['reps']} reps; reference: {kernel['reference']}")
    print(f"  {'way':<34} {'median ms':>10} {'min':>8} {'max':>8} {'x ref':>7}")
    for name, w in kernel["ways"].items():
        print(f"  {name:<34} {w['median_ms']:>10.3f} {w['min_ms']:>8.3f} {w['max_ms']:>8.3f} "
              f"{w['ratio_to_reference']:>7.3f}")


def _print_pipeline(pipe: dict[str, Any]) -> None:
    print(f"(ii) {pipe['model']}, {pipe['steps']} steps: recorder timing "
          f"{pipe['recorder_timing']}, Kineto import timing {pipe['kineto_timing']} "
          f"(schedule {pipe['kineto_schedule']})")
    print(f"  {'op':<4} {'recorder ms':>12} {'n':>5} {'kineto ms':>10} {'n':>5} {'ratio':>7}")
    for op, o in pipe["ops"].items():
        print(f"  {op:<4} {o['recorder_median_ms']:>12.3f} {o['recorded_ops']:>5} "
              f"{o['kineto_median_ms']:>10.3f} {o['kineto_ops']:>5} {o['ratio']:>7.3f}")


def _section(results: dict[str, Any], name: str, fn: Any, write: Any) -> None:
    """Run one section into ``results[name]``; a failure is kept as its ``error`` (beside what
    the section kept before failing), printed, and makes the check exit 1 at the end (the
    other sections still run)."""
    try:
        results[name] = fn()
    except Exception as exc:  # noqa: BLE001 - reported, never swallowed
        import traceback

        traceback.print_exc()
        results[name] = {**results.get(name, {}), "error": f"{type(exc).__name__}: {exc}"}
    write()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--chain", type=int, default=4)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--packed-steps", type=int, default=40,
                    help="steps of each recorded packed-GPT run in (iii)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="results JSON (written after "
                    "every section, so a run cut short keeps what it measured)")
    ap.add_argument("--sections", default=",".join(SECTIONS),
                    help="comma-separated sections to run (default: all four)")
    ap.add_argument("--cpu", action="store_true", help="dry run on CPU (no device, no JSON)")
    args = ap.parse_args()
    wanted = [s.strip() for s in args.sections.split(",") if s.strip()]
    if unknown := sorted(set(wanted) - set(SECTIONS)):
        ap.error(f"--sections: unknown {', '.join(unknown)} (choose from {', '.join(SECTIONS)})")
    import torch

    if not args.cpu and not torch.cuda.is_available():
        sys.exit("device_check: no CUDA device here (torch.cuda.is_available() is False); "
                 "nothing measured, nothing written. Run it on a machine with an NVIDIA GPU "
                 "(or pass --cpu for a dry run of the code on CPU).")
    device = torch.device("cpu") if args.cpu else torch.device("cuda", 0)
    if args.cpu:
        args.size, args.hidden = min(args.size, 256), min(args.hidden, 256)
        args.packed_steps = min(args.packed_steps, 26)
        torch.set_num_threads(1)
    here = Path(__file__).resolve().parent
    sys.path.insert(0, str(here))
    from _device import progress
    from _results import run_header, write_json
    from device_check_packed import packed_check, print_packed

    doc: dict[str, Any] = run_header(
        "device_check", script="device_check.py",
        device="cpu (dry run)" if args.cpu else torch.cuda.get_device_name(device),
        torch=torch.__version__, cuda=torch.version.cuda)

    def write() -> None:
        if not args.cpu:
            write_json(args.out, doc)

    runs = {"nvml": lambda: nvml_check(0 if args.cpu else device.index or 0),
            "kernel": lambda: kernel_check(device, args.size, args.reps, args.chain),
            "pipeline": lambda: pipeline_check(device, args.hidden, args.layers, args.steps,
                                               Path(tmp)),
            "packed": lambda: packed_check(device, args.packed_steps, max(3, args.reps // 3),
                                           Path(tmp), keep=keep_packed)}

    def keep_packed(partial: dict[str, Any]) -> None:
        doc["packed"] = {**partial, "complete": False}
        write()

    with tempfile.TemporaryDirectory() as tmp:
        for name in wanted:
            progress(f"section {name}")
            _section(doc, name, runs[name], write)
    failed = [k for k in wanted if "error" in doc[k]]
    if "nvml" in wanted and "error" not in doc["nvml"]:
        print(f"(0) NVML: {doc['nvml']}")
    if "kernel" in wanted and "error" not in doc["kernel"]:
        _print_kernel(doc["kernel"])
    if "pipeline" in wanted and "error" not in doc["pipeline"]:
        _print_pipeline(doc["pipeline"])
    if "packed" in wanted and "error" not in doc["packed"]:
        print_packed(doc["packed"])
    if failed:
        sys.exit(f"device_check: section(s) {', '.join(failed)} failed (errors above and in "
                 "the JSON)")

if __name__ == "__main__":
    main()
