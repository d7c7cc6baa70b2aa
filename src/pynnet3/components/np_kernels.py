"""Faster NumPy forms of a few elementwise passes, with the same floats.

NumPy's inner loops are fast for contiguous operands of the same shape, and much
slower in two cases the training step hits on every layer (one BLAS thread, NumPy
2.4, AVX-512 host; an N = 128 train shape's 5120 x 160 float32 matrix):

* ``np.maximum(x, 0.0)``: the SIMD loop takes two arrays, a scalar operand goes
  through a slow path: 0.24 ms, against 0.08 ms with an array of zeros.
  :func:`relu` views ``x`` as rows of 8192 elements beside one cached row of
  zeros (small, so it stays in cache: a whole-matrix array of zeros, even one
  never written, is read from memory as NumPy maps large arrays to huge pages,
  and a training step then found it slower than the scalar form).
* a row vector broadcast over the rows (``x - mean``, ``x * scale``): one inner
  loop call per row of ``cols`` elements, 0.12 ms against 0.05 ms for two whole
  arrays. :func:`rowwise` views ``T`` rows at a time as one long row and the
  vector tiled ``T`` times beside it (each element still meets its own column's
  value, in the same operation: the same floats).

Both apply to NumPy arrays only; the callers keep their plain form for other
arrays (``xp.is_numpy``), and tests check bit-equality with the plain form.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

_ZEROS: dict[np.dtype, np.ndarray] = {}

# Elements of one tiled row in :func:`rowwise` and :func:`relu`: a few thousand keep
# the tiled vector (or the zeros) in L1 while each inner-loop call is long.
_TILE_ELEMENTS = 8192


def zeros_row(n: int, dtype) -> np.ndarray:
    """A read-only array of ``n <= 8192`` zeros of ``dtype`` (a view of a cached,
    cache-sized one: it stays in L1/L2 while a pass streams past it)."""
    dtype = np.dtype(dtype)
    buf = _ZEROS.get(dtype)
    if buf is None:
        buf = np.zeros(_TILE_ELEMENTS, dtype)
        buf.flags.writeable = False
        _ZEROS[dtype] = buf
    return buf[:n]


def relu(x: np.ndarray, out: np.ndarray) -> None:
    """``np.maximum(x, 0.0, out=out)`` (``out`` may be ``x``), the same floats
    (NaN and signed zeros included: ``x`` stays the first operand), against rows
    of zeros instead of a scalar: contiguous arrays as rows of 8192 elements, other
    2-D ones row by row."""
    relu_bound(x, out)()


def relu_bound(x: np.ndarray, out: np.ndarray) -> Callable[[], object]:
    """:func:`relu` for these very arrays, as a call with no arguments that repeats
    it (the views made once)."""
    k = _TILE_ELEMENTS
    maximum = np.maximum
    if (type(x) is np.ndarray and type(out) is np.ndarray and x.dtype == out.dtype
            and x.shape == out.shape and x.flags.c_contiguous and out.flags.c_contiguous
            and x.size >= 2 * k):
        fx, fo = x.reshape(-1), out.reshape(-1)
        full = x.size - x.size % k
        zeros = zeros_row(k, x.dtype)
        a, b = fx[:full].reshape(-1, k), fo[:full].reshape(-1, k)
        if full == x.size:
            return lambda: maximum(a, zeros, out=b)
        c, d, z = fx[full:], fo[full:], zeros[:x.size - full]
        return lambda: (maximum(a, zeros, out=b), maximum(c, z, out=d))
    if x.ndim == 2 and x.shape[1] <= k and x.dtype == out.dtype:
        zeros = zeros_row(x.shape[1], x.dtype)
        return lambda: maximum(x, zeros, out=out)
    return lambda: maximum(x, 0.0, out=out)


def _tiled_ok(x: np.ndarray, v: np.ndarray, out: np.ndarray) -> bool:
    return (type(x) is np.ndarray and type(out) is np.ndarray and type(v) is np.ndarray
            and x.ndim == 2 and v.ndim == 1 and v.shape[0] == x.shape[1]
            and out.shape == x.shape and x.dtype == v.dtype == out.dtype
            and x.flags.c_contiguous and out.flags.c_contiguous)


def rowwise(op, x: np.ndarray, v: np.ndarray, out: np.ndarray) -> None:
    """``op(x, v, out=out)`` for a row vector ``v`` broadcast over the rows of the
    2-D ``x`` (``op`` an elementwise binary ufunc; ``out`` may be ``x``). The same
    operation on the same pairs of elements: the same floats."""
    rows, cols = x.shape
    t = _TILE_ELEMENTS // cols if cols else 0
    if t < 2 or rows < 2 * t or not _tiled_ok(x, v, out):
        op(x, v, out=out)
        return
    full = rows - rows % t
    op(x[:full].reshape(-1, t * cols), np.tile(v, t), out=out[:full].reshape(-1, t * cols))
    if full < rows:
        op(x[full:], v, out=out[full:])
