"""The process's memory allocator: freed memory kept for reuse, not returned to the system.

PyTorch has no caching allocator on the CPU: every tensor is a ``malloc`` and every
freed one a ``free``. With glibc's defaults, large blocks are mapped afresh for each
allocation and the top of the heap is handed back to the system when freed, so each
training step faults in, and zero-fills, every page of its large tensors again. mtt
asks glibc to serve every block from the heap and to keep what is freed for the next
step instead (``mallopt``: no ``mmap`` blocks, a trim threshold of 1 GiB). Peak memory
is what the largest step needs, as before; only the time to get it back goes.

Nothing changes where the C library is not glibc, or where the user chose the
allocator's settings (any ``MALLOC_*`` tuning variable, or another allocator through
``LD_PRELOAD``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from collections.abc import Mapping

#: glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
#: freed memory at the top of the heap beyond this goes back to the system
TRIM_THRESHOLD = 1 << 30

_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_MAX_", "MALLOC_TOP_PAD_")


def keep_freed_memory(env: Mapping[str, str] | None = None) -> bool:
    """Set glibc's allocator to reuse freed memory; True if it was set."""
    env = os.environ if env is None else env
    if not sys.platform.startswith("linux") or any(name in env for name in _USER_SETTINGS):
        return False
    if env.get("LD_PRELOAD", "").strip():  # jemalloc, tcmalloc...: the user's choice of allocator
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others have no mallopt
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
