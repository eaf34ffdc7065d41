"""Kineto GPU timing: F/B/W on the device clock, one clock per run, refusals of public GPU traces.

``fixtures/kineto-gpu/interleaved`` holds real torch CPU traces of a 2-rank interleaved 1F1B
pipeline with Kineto GPU events added (launches, kernels on two streams, correlation ids,
``ac2g`` flows, per-stream ``gpu_user_annotation`` copies; see its README). Variants here remove
one source of device time at a time. ``data/hta-gpu-traces`` are real GPU traces from
HolisticTraceAnalysis without ``PP:`` labels.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bubblecast.cli import main
from bubblecast.telemetry.importers import load_events
from tests.conftest import HTA_TRACES

GPU = Path(__file__).parent / "fixtures" / "kineto-gpu" / "interleaved"
KEY = ["step", "rank", "chunk", "microbatch", "op"]
DEVICE_CATS = {"kernel", "cuda_runtime", "ac2g", "gpu_user_annotation"}


def _derive(tmp: Path, edit: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]) -> Path:
    out = tmp / "interleaved"
    out.mkdir()
    for file in sorted(GPU.iterdir()):
        trace = json.loads(gzip.decompress(file.read_bytes()))
        trace["traceEvents"] = edit(trace["traceEvents"])
        (out / file.name.removesuffix(".gz")).write_text(json.dumps(trace))
    return out


def _compute(path: Path):
    events = load_events(path, "kineto")
    return events, events.compute().set_index(KEY).sort_index()


@pytest.fixture(scope="module")
def device():
    return _compute(GPU)


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """The original CPU traces: every GPU event removed."""
    path = _derive(tmp_path_factory.mktemp("host"),
                   lambda evs: [e for e in evs if e.get("cat") not in DEVICE_CATS])
    return _compute(path)


def _kernel_spans(file: Path) -> dict[tuple[str, float], tuple[float, float]]:
    """Independent reference: (label, host start) -> first kernel start, last kernel end of
    the kernels whose launch lies inside each compute PP: range."""
    evs = json.loads(gzip.decompress(file.read_bytes()))["traceEvents"]
    kernels = {e["args"]["correlation"]: e for e in evs if e.get("cat") == "kernel"}
    launches = [e for e in evs if e.get("cat") == "cuda_runtime"]
    out = {}
    for r in evs:
        name = str(r.get("name", ""))
        if r.get("cat") != "user_annotation" or not name.startswith("PP:") or \
                name.rstrip("0123456789")[-1] not in "FBW" or "SEND" in name or "RECV" in name:
            continue
        ks = [kernels[la["args"]["correlation"]] for la in launches
              if r["ts"] <= la["ts"] <= r["ts"] + r["dur"]]
        if ks:
            out[(name, r["ts"])] = (min(k["ts"] for k in ks), max(k["ts"] + k["dur"] for k in ks))
    return out


def test_compute_ops_take_the_span_of_the_kernels_they_launched(device, host):
    events, comp = device
    _, host_comp = host
    assert events.runs["interleaved"].extra["timing"] == "device"
    assert len(comp) == len(host_comp) > 0 and (comp.index == host_comp.index).all()
    spans = _kernel_spans(GPU / "rank0.json.gz")
    expected = sorted(e - s for s, e in spans.values())
    got = sorted(events.compute().query("rank == 0")["duration_s"] * 1e6)
    assert np.allclose(got, expected, atol=1e-3)
    assert not np.allclose(comp["duration_s"], host_comp["duration_s"])
    assert (comp["wait_s"] == 0).all()
    # communication ops stay on the host clock they were measured on
    send = events.frame.loc[events.frame["op"] == "SEND_F", "duration_s"].to_numpy()
    assert np.allclose(send, host[0].frame.loc[host[0].frame["op"] == "SEND_F", "duration_s"])


def _strip_corr(evs):
    for e in evs:
        if e.get("cat") == "kernel":
            e["args"].pop("correlation")
    return evs


@pytest.mark.parametrize("edit", [
    _strip_corr,  # kernels reached through the ac2g flows
    lambda evs: [e for e in evs if e.get("cat") not in ("kernel", "cuda_runtime", "ac2g")],
    lambda evs: [dict(e, args={k: v for k, v in e["args"].items() if k != "External id"})
                 if e.get("cat") == "gpu_user_annotation" else e
                 for e in evs if e.get("cat") not in ("kernel", "cuda_runtime", "ac2g")],
], ids=["flows", "annotations-by-external-id", "annotations-per-stream"])
def test_every_device_source_gives_the_same_times(edit, device, tmp_path):
    events, comp = _compute(_derive(tmp_path, edit))
    assert events.runs["interleaved"].extra["timing"] == "device"
    assert np.allclose(comp["duration_s"], device[1]["duration_s"], atol=1e-9)
    assert np.allclose(comp["start_s"], device[1]["start_s"], atol=1e-9)


def _drop_one_b_copy_on_stream_13(evs):
    evs = [e for e in evs if e.get("cat") not in ("kernel", "cuda_runtime", "ac2g")]
    for e in evs:
        if e.get("cat") == "gpu_user_annotation":
            e["args"].pop("External id")
    victim = next(i for i, e in enumerate(evs) if e.get("cat") == "gpu_user_annotation"
                  and e["tid"] == 13)
    return evs[:victim] + evs[victim + 1:]


def _drop_kernels_of_one_forward(evs):
    first_f = next(e for e in evs if e.get("cat") == "user_annotation"
                   and str(e["name"]).startswith("PP:") and str(e["name"])[-2] == "F")
    lo, hi = first_f["ts"], first_f["ts"] + first_f["dur"]
    corr = {e["args"]["correlation"] for e in evs
            if e.get("cat") == "cuda_runtime" and lo <= e["ts"] <= hi}
    return [e for e in evs if not (
        (e.get("cat") in ("kernel", "cuda_runtime") and e["args"].get("correlation") in corr)
        or (e.get("cat") == "ac2g" and e.get("id") in corr)
        or (e.get("cat") == "gpu_user_annotation" and e["args"]["External id"]
            == first_f["args"]["External id"]))]


@pytest.mark.parametrize(("edit", "words"), [
    (_drop_one_b_copy_on_stream_13, "compute ops have no device time"),
    (_drop_kernels_of_one_forward, "1 of "),
    (lambda evs: [dict(e, args={}) if e.get("cat") == "kernel" else e for e in evs
                  if e.get("cat") not in ("ac2g", "gpu_user_annotation")],
     "GPU kernels but no F/B/W range could be tied"),
], ids=["stream-copies-unpairable", "one-op-without-kernels", "kernels-only"])
def test_one_clock_per_run_host_for_all_when_any_op_lacks_device_time(edit, words, host,
                                                                       tmp_path, capsys):
    events, comp = _compute(_derive(tmp_path, edit))
    meta = events.runs["interleaved"]
    assert meta.extra["timing"] == "host" and words in meta.extra["timing_note"]
    assert np.allclose(comp["duration_s"], host[1]["duration_s"])
    err = capsys.readouterr().err
    assert err.startswith("bubblecast: warning:") and words in err and err.count("\n") == 1


def test_inspect_and_whatif_say_device_timing(capsys):
    assert main(["inspect", str(GPU), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["timing"], out["granularity"]) == ("device", "op")
    assert main(["whatif", str(GPU), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["timing"] == "device"


@pytest.mark.parametrize("name", ["simple_add", "event_sync_multi_stream", "sampled_rank-0"])
def test_public_gpu_traces_without_pp_labels_are_refused_in_one_line(name, capsys):
    path = HTA_TRACES / f"{name}.json.gz"
    assert main(["inspect", str(path), "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert str(path) in captured.err and "'PP:' labels" in captured.err


def test_missing_pp_labels_is_named_before_a_missing_rank(tmp_path, capsys):
    trace = json.loads(gzip.decompress((HTA_TRACES / "simple_add.json.gz").read_bytes()))
    trace.pop("distributedInfo")
    path = tmp_path / "trace-1699-42.json"  # two numbers: no rank in the name either
    path.write_text(json.dumps(trace))
    assert main(["inspect", str(path), "--format", "kineto"]) == 2
    err = capsys.readouterr().err
    assert "'PP:' labels" in err and "rank" not in err.split("labels")[0]
