"""glibc's heap for an inference process: activations freed by one call stay mapped for the next.

An inference allocates and frees the same activation buffers every call, many of them megabytes (a pi0 edge
prefix MLP's 534 x 2048 float32 is 4.4 MB). With glibc's defaults the heap's free top is handed back to the
system once it passes the trim threshold (dynamic: twice the largest buffer freed so far), and a buffer over
the mmap threshold is a fresh mapping: either way the next call touches fresh pages, one fault per 4 KiB. On
an AMX Xeon the edge pi0 took 38,000 minor faults per int8 inference at one thread and a full-size SmolVLA
165,000; without them the chunks took 0.87x and 0.82x the time (bench/results/heap_faults.json, inferences on a
worker thread as the node runs them).

`keep_freed_heap` raises both thresholds once per process, so the steady state reuses its pages: buffers up to
32 MiB come from the heap, and its free top is kept up to 512 MiB. It also keeps every thread on the one main
heap (one arena): a worker thread's own arena grows in 64 MiB heaps that glibc unmaps whenever one empties, and
an inference on a thread (the node's) whose working set outgrows one (a full-size SmolVLA's) faulted 69,500 times
a chunk with the thresholds raised, 143 on the main heap (scratch, int8, 2 threads). What stays resident is
the largest working set one inference had. Larger blocks (weights) are still their own mappings, returned
when freed, and a load's freed float weights are returned explicitly (`return_freed_memory`, glibc's
malloc_trim, which ignores the thresholds). Where the user tuned glibc's allocator through the environment
(MALLOC_*_ variables or GLIBC_TUNABLES), their settings stand; OMNI_ROS_KEEP_FREED_HEAP=0 leaves glibc's
defaults (a process short of memory, or an A/B measurement). Elsewhere than glibc, nothing changes.
"""

from __future__ import annotations

import ctypes
import logging
import os
from typing import Any

logger = logging.getLogger("omni_ros.heap")

# mallopt's parameter numbers (glibc malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
# 32 MiB is the largest mmap threshold glibc's own dynamic adjustment reaches on a 64-bit system.
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 512 << 20
_ENV = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_", "MALLOC_ARENA_MAX")

_kept: bool | None = None  # None until asked: the outcome is the process's, decided once


def _libc_function(name: str) -> Any:
    """A C function of this process (a ctypes function pointer), or None."""
    # The process's own symbols: no library search (ctypes.util.find_library runs ldconfig in a subprocess).
    return getattr(ctypes.CDLL(None), name, None)


def user_tuned() -> bool:
    """Whether the environment already sets glibc's allocator thresholds (those settings are the user's)."""
    return any(name in os.environ for name in _ENV) or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", "")


def keep_freed_heap() -> bool:
    """Raise glibc's trim and mmap thresholds for this process (once); returns whether they are ours now."""
    global _kept
    if _kept is None:
        mallopt = _libc_function("mallopt")
        if mallopt is None or user_tuned() or os.environ.get("OMNI_ROS_KEEP_FREED_HEAP", "1") == "0":
            _kept = False
        else:
            # mallopt returns 1 on success; setting either threshold turns glibc's dynamic adjustment off. The
            # arena limit holds for threads that allocate first after it: omni_ros sets it at import.
            settings = ((_M_MMAP_THRESHOLD, MMAP_THRESHOLD), (_M_TRIM_THRESHOLD, TRIM_THRESHOLD), (_M_ARENA_MAX, 1))
            _kept = all(bool(mallopt(name, value)) for name, value in settings)
        logger.debug("heap: freed pages %s", "kept for reuse" if _kept else "left to the allocator's defaults")
    return _kept


def return_freed_memory() -> None:
    """Give the heap's free pages back to the system (glibc's malloc_trim; elsewhere nothing). Making a
    precision's replacement layers frees a float32 temporary per layer, each under the mmap threshold, and the
    int8 results between them kept the freed heap resident: 560 MB of a full-size X-VLA's int8 load (scratch,
    RssAnon)."""
    trim = _libc_function("malloc_trim")
    if trim is not None:
        trim(0)
