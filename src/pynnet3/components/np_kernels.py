"""Faster NumPy forms of a few elementwise passes, with the same floats.

NumPy's inner loops are fast for contiguous operands of the same shape, and much
slower in two cases the training step hits on every layer (one BLAS thread, NumPy
2.4, AVX-512 host; an N = 128 train shape's 5120 x 160 float32 matrix):

* ``np.maximum(x, 0.0)``: the SIMD loop takes two arrays, a scalar operand goes
  through a slow path: 0.24 ms, against 0.08 ms with an array of zeros.
  :func:`relu` passes a read-only array of zeros (a view of one cached buffer
  that is never written, so its pages are the kernel's shared zero page: reading
  it costs no memory traffic).
* a row vector broadcast over the rows (``x - mean``, ``x * scale``): one inner
  loop call per row of ``cols`` elements, 0.12 ms against 0.05 ms for two whole
  arrays. :func:`rowwise` views ``T`` rows at a time as one long row and the
  vector tiled ``T`` times beside it (each element still meets its own column's
  value, in the same operation: the same floats).

Both apply to NumPy arrays only; the callers keep their plain form for other
arrays (``xp.is_numpy``), and tests check bit-equality with the plain form.
"""

from __future__ import annotations

import numpy as np

_ZEROS: dict[np.dtype, np.ndarray] = {}

# Elements of one tiled row in :func:`rowwise`: a few thousand keep the tiled
# vector in L1 while each inner-loop call is long.
_TILE_ELEMENTS = 8192


def zeros_view(shape: tuple, dtype) -> np.ndarray:
    """A read-only C-contiguous array of zeros of ``shape`` and ``dtype``: a view
    of a cached buffer (grown as needed) that nothing ever writes."""
    dtype = np.dtype(dtype)
    n = 1
    for s in shape:
        n *= int(s)
    buf = _ZEROS.get(dtype)
    if buf is None or buf.size < n:
        buf = np.zeros(max(n, 1 << 16), dtype)  # (calloc: untouched pages read as zero)
        buf.flags.writeable = False
        _ZEROS[dtype] = buf
    return buf[:n].reshape(shape)


def relu(x: np.ndarray, out: np.ndarray) -> None:
    """``np.maximum(x, 0.0, out=out)`` (``out`` may be ``x``), the same floats
    (NaN and signed zeros included: ``x`` stays the first operand)."""
    np.maximum(x, zeros_view(x.shape, x.dtype), out=out)


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
