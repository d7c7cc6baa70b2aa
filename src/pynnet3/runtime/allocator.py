"""Process-wide tuning of the C allocator for compile-heavy workloads.

Compiling and expanding computations makes many short-lived numpy temporaries of
100 KB - 1 MB (index arrays of 20k+ rows). glibc serves blocks above its mmap
threshold with fresh ``mmap`` calls and returns freed heap tops to the system
past its trim threshold, so each such temporary is page-faulted in again: on a
128-sequence shortcut compile that is up to a third of the time. Raising both
thresholds keeps the memory in the process. This changes the whole process's
allocator, so a library never does it on import: applications opt in (the
``pynnet3`` console script does; so can ``benchmarks/compile_scaling.py
--tune-malloc``), or set ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_``
in the environment.
"""

from __future__ import annotations

import ctypes
import sys

_M_TRIM_THRESHOLD = -1  # mallopt parameter numbers (malloc.h)
_M_MMAP_THRESHOLD = -3


def tune_malloc(mmap_threshold: int = 32 << 20, trim_threshold: int = 256 << 20) -> bool:
    """Raise glibc's mmap and trim thresholds (bytes); True when applied (Linux with
    glibc), False elsewhere. Memory freed by the process is then reused by it
    rather than returned to the system (at most ``trim_threshold`` kept free)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, int(mmap_threshold))) and \
        bool(mallopt(_M_TRIM_THRESHOLD, int(trim_threshold)))
