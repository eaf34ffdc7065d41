"""A CPU rank's host allocator: keep freed memory for reuse, as a GPU's caching allocator does.

glibc's malloc serves a large block with its own ``mmap`` and unmaps it on ``free``; its
threshold for "large" rises with the blocks freed, up to 32 MiB, but a run whose tensors change
size from one micro-batch to the next keeps meeting blocks above it, and the kernel faults in
and zeroes each one's pages again on first touch. On the packed GPT the size follows the
documents (per-document attention allocates ``heads x length^2`` scores), so the extra cost
depends on the plan: a micro-batch of long documents faults more than the loader's mixed
packing. On a GPU the CUDA caching allocator keeps freed blocks, so this is a CPU-only cost
in every CPU measurement of a plan (figures on the results page).

:func:`keep_freed_memory` sets glibc's mmap threshold to its largest value (blocks up to 32
MiB come from the heap, reused) and its trim threshold to the largest ``int`` (the heap is not
given back): the process keeps its peak memory, as a GPU rank does. Applied by
:func:`bubblecast.runtime.trainer.init_distributed` on gloo (CPU) ranks;
``BUBBLECAST_HOST_MALLOC=system`` leaves the allocator as it is.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger(__name__)

#: ``mallopt`` parameters (``<malloc.h>``).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
#: glibc's largest mmap threshold on 64-bit hosts (``DEFAULT_MMAP_THRESHOLD_MAX``).
MMAP_THRESHOLD_MAX = 32 << 20
#: The trim threshold: the largest C ``int`` (the heap's top is never returned).
TRIM_THRESHOLD = (1 << 31) - 1
#: Environment variable: ``system`` leaves the host allocator's settings as they are.
ENV = "BUBBLECAST_HOST_MALLOC"


def keep_freed_memory() -> str | None:
    """Make this process's glibc malloc keep freed blocks up to 32 MiB for reuse (see the
    module doc). None when applied; else why not (``BUBBLECAST_HOST_MALLOC=system``, not
    glibc, ``mallopt`` refused), which is also logged: nothing here stops a run."""
    if os.environ.get(ENV, "").strip().lower() == "system":
        return f"{ENV}=system: the host allocator keeps its settings"
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, TypeError, AttributeError):
        reason = f"the C library ({name}) has no mallopt (not glibc): freed host memory may " \
                 "go back to the OS, and CPU ops whose tensors change size page-fault it back"
        log.info("bubblecast host allocator: %s", reason)
        return reason
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if not (mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX) and
            mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        reason = "mallopt refused the mmap or trim threshold: the host allocator keeps its " \
                 "settings"
        log.warning("bubblecast host allocator: %s", reason)
        return reason
    return None
