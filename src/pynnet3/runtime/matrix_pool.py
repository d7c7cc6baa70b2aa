"""A bounded pool of freed matrix buffers, reused by later allocations.

Why: a training step allocates and frees tens of matrices of a few MB each, and
glibc serves such blocks with fresh ``mmap`` pages, so every new matrix is
page-faulted in again (the kernel zeroes each 4 KB page on first touch): at the
realistic train shapes that was 10-20 % of a step. A buffer kept here and
cleared with a memset on reuse costs a fraction of that. Only the computer's own
matrices come here (never arrays a user or a component may still hold: see
:meth:`MatrixPool.put`), and at most ``limit_bytes`` are kept, least recently
used shapes evicted first.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict

import numpy as np

DEFAULT_LIMIT_BYTES = 256 << 20


def _count_after_pop(matrices: dict, key) -> int:
    """References to ``matrices[key]`` once popped into a local (the same code
    shape as :meth:`MatrixPool.release`; calibrates what 'held by nobody else'
    reads as on this interpreter)."""
    mat = matrices.pop(key, None)
    return sys.getrefcount(mat)


_SOLE = _count_after_pop({0: np.empty((2, 2), np.float32)}, 0)


class MatrixPool:
    """Free buffers by ``(rows, cols, dtype)``; thread-safe."""

    def __init__(self, limit_bytes: int = DEFAULT_LIMIT_BYTES):
        self.limit_bytes = int(limit_bytes)
        self._free: OrderedDict[tuple, list[np.ndarray]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def held_bytes(self) -> int:
        return self._bytes

    def take(self, rows: int, cols: int, dtype) -> np.ndarray | None:
        """A pooled ``[rows, cols]`` buffer of ``dtype`` (contents undefined), or None."""
        key = (rows, cols, np.dtype(dtype))
        with self._lock:
            bufs = self._free.get(key)
            if not bufs:
                return None
            arr = bufs.pop()
            if not bufs:
                del self._free[key]
            self._bytes -= arr.nbytes
            return arr

    def release(self, matrices: dict, key) -> None:
        """Pop ``matrices[key]`` and keep its buffer, if the dict held the only
        reference (no view of it, no memo, no user array shares it) and it is a
        plain C-contiguous array that owns its data."""
        mat = matrices.pop(key, None)
        if sys.getrefcount(mat) != _SOLE or type(mat) is not np.ndarray:
            return
        if mat.base is not None or not mat.flags.c_contiguous or mat.ndim != 2:
            return
        self.put(mat)

    def put(self, arr: np.ndarray) -> None:
        if arr.nbytes == 0 or arr.nbytes > self.limit_bytes:
            return
        key = (arr.shape[0], arr.shape[1], arr.dtype)
        with self._lock:
            self._free.setdefault(key, []).append(arr)
            self._free.move_to_end(key)
            self._bytes += arr.nbytes
            while self._bytes > self.limit_bytes:  # evict least recently released shapes
                old_key, bufs = next(iter(self._free.items()))
                self._bytes -= bufs.pop(0).nbytes
                if not bufs:
                    del self._free[old_key]

    def clear(self) -> None:
        with self._lock:
            self._free.clear()
            self._bytes = 0


POOL = MatrixPool()


def set_pool_limit(limit_bytes: int) -> None:
    """At most ``limit_bytes`` of freed matrices kept for reuse (0: none)."""
    POOL.limit_bytes = int(limit_bytes)
    if POOL.held_bytes > POOL.limit_bytes:
        POOL.clear()
