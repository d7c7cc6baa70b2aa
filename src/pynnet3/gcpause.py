"""Pausing Python's cyclic garbage collector while compiling or optimizing.

Compiling allocates many small objects (steps, commands, submatrices, access
records) and makes no cycles worth collecting, while each collection those
allocations trigger walks the whole heap (the network, every cached
computation). Pauses nest and may overlap across threads: the collector is
turned back on when the last pause ends, and only if it was on when the first
began (a caller's own ``gc.disable()`` is left alone).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_depth = 0
_was_enabled = False


@contextmanager
def gc_paused() -> Iterator[None]:
    """Run the block with the cyclic collector off (see the module doc)."""
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()
