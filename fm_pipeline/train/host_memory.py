"""Keep the host memory a training step frees for the next step (glibc malloc).

A CPU step allocates and frees the same tens of MB of activations and gradients every time.
glibc hands free memory at the top of its heap back to the kernel once it exceeds the trim
threshold, which by default follows the process's history (twice the largest mmapped block
freed so far) and whether the top is free depends on where long-lived objects happen to sit.
When it trims, the next step faults every page back in: on the benchmark's small model 6,250
page faults, ~7 ms of a 0.43 s step, in the trainer but not in a plain loop that happened to
lay its heap out differently. Fixed thresholds make it the same in every process: blocks up
to 32 MiB (glibc's own cap for its dynamic threshold) come from the heap, and the heap keeps
up to 1 GiB of free top (memory the process already reached at its peak).

    keep_freed_host_memory()   # once per training process; a no-op without glibc

Settings a user made (GLIBC_TUNABLES malloc tunables, MALLOC_*_ variables) are left alone.
"""

from __future__ import annotations

import ctypes
import logging
import os

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc <malloc.h>
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 1 << 30


def malloc_tuned_by_user() -> bool:
    """Whether the environment already sets glibc malloc parameters."""
    return ("glibc.malloc." in os.environ.get("GLIBC_TUNABLES", "")
            or any(k in os.environ for k in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_",
                                             "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")))


def keep_freed_host_memory() -> bool:
    """Fix glibc's mmap and trim thresholds for this process; True if they were set."""
    if malloc_tuned_by_user():
        return False
    try:
        process = ctypes.CDLL(None)
    except OSError:
        return False
    # glibc only: musl's and macOS's allocators have no such thresholds.
    if not (hasattr(process, "gnu_get_libc_version") and hasattr(process, "mallopt")):
        return False
    mallopt = process.mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # The mmap threshold first: setting either one turns glibc's dynamic threshold off.
    ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD,
                                                                    TRIM_THRESHOLD) == 1
    if not ok:
        log.warning("mallopt refused the malloc thresholds; freed host memory may be returned "
                    "to the kernel between steps (page faults each step)")
    return ok
