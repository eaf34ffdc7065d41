"""A gloo rank keeps freed host memory for reuse: no page faults for tensors that change size."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest

from bubblecast.runtime import host_allocator
from bubblecast.runtime.host_allocator import ENV, keep_freed_memory
from tests.helpers import free_port

# In a fresh interpreter: a gloo process group of one rank through init_distributed (which
# sets the allocator), then 15 "steps", each holding 8 tensors of 5-30 MiB at once (as a
# pipeline stage holds its micro-batches' activations) and freeing them, three times. For the
# last pass it prints the pages its tensors touch, the process's minor page faults, and the
# main heap's size (glibc's ``mallinfo2().arena``) before it and at each step, held and freed.
_PROBE = textwrap.dedent("""
    import ctypes, json, resource
    import torch
    from bubblecast.runtime.trainer import init_distributed
    init_distributed("gloo")
    torch.set_num_threads(1)  # as the trainers run
    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
            "fordblks", "keepcost")]
    mallinfo2 = ctypes.CDLL(None).mallinfo2
    mallinfo2.restype = MallInfo2
    heap = []
    def step(k):
        held = [torch.ones((5 + (7 * (k + j)) % 26) << 18) for j in range(8)]
        heap.append(mallinfo2().arena)
        return sum(t.numel() * 4 // 4096 for t in held)
    for k in range(30):  # the heap grows towards its peak
        step(k % 15)
    heap.clear()
    heap.append(mallinfo2().arena)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    pages = 0
    for k in range(15):
        pages += step(k)
        heap.append(mallinfo2().arena)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    print(json.dumps({"pages": pages, "faults": faults, "heap": heap}))
""")


def _probe() -> dict:
    """The probe's record, run as one gloo rank with the allocator as it sets it."""
    env = {k: v for k, v in os.environ.items() if k != ENV}
    env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()))
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True,
                         text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux")
def test_gloo_rank_reuses_freed_memory() -> None:
    # The heap is never given back, so a page is faulted in again only where the heap grows
    # (fragmentation: a step's tensors find no free block big enough). Of 20 probes, 18 neither
    # grew nor faulted in the last pass and 2 grew 16 and 23 MiB and faulted exactly those
    # pages; a CI run faulted 11,776 (2.1% of the pages), which the earlier assertion (under 1%)
    # failed. With glibc's own adaptive thresholds (BUBBLECAST_HOST_MALLOC=system) 12 of 20
    # probes trimmed the heap and faulted 17k-527k pages, 8 did neither, so that case is not
    # asserted.
    rec = _probe()
    heap, pages = rec["heap"], rec["pages"]
    assert pages > 400_000, rec
    assert heap == sorted(heap), f"the heap shrank: {heap}"
    grown = (heap[-1] - heap[0]) // 4096
    assert grown < 0.1 * pages, rec
    assert rec["faults"] <= grown + 512, rec  # 2 MiB for the rest of the process


def test_opt_out_by_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "system")
    assert keep_freed_memory() == f"{ENV}=system: the host allocator keeps its settings"


def test_no_mallopt_is_logged_not_raised(monkeypatch: pytest.MonkeyPatch,
                                         caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr(host_allocator.ctypes.util, "find_library",
                        lambda name: "libdoes-not-exist.so.0")
    with caplog.at_level(logging.INFO, logger=host_allocator.__name__):
        reason = keep_freed_memory()
    assert reason is not None and "not glibc" in reason
    assert any("not glibc" in r.getMessage() for r in caplog.records)
