"""``C += alpha * A @ B`` in one BLAS call, as Kaldi's ``AddMatMat(..., beta=1)``.

NumPy's matmul has no accumulate form: ``c += a @ b`` writes the product to a
temporary (fresh pages for a few-MB derivative), then reads it back to add. The
backprops of the affine, linear and TDNN layers do this for every input derivative
and weight gradient. :func:`gemm_acc` calls the ``sgemm``/``dgemm`` of the OpenBLAS
that NumPy itself links (its ILP64 ``scipy_cblas_*gemm64_`` symbols) with
``beta = 1``, straight on the arrays' memory (any row or column stride), and falls
back to the NumPy expression where that library or layout is not available (or when
``PYNNET3_NO_DIRECT_BLAS`` is set in the environment at import).

Numerics: BLAS adds the products into C per panel of the inner dimension. With
C = 0 beforehand, or an inner dimension within one panel (OpenBLAS's GEMM_Q: a few
hundred), the floats are those of ``c += a @ b``; otherwise the additions into C
are ordered differently (Kaldi's order), a difference of float32 rounding.
:func:`column_block_path` says when a product's column blocks, sent to different
places, keep its floats.
"""

from __future__ import annotations

import ctypes
import glob
import os
from collections.abc import Callable

import numpy as np

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112


def _library():
    """NumPy's bundled OpenBLAS (a ctypes library), or None."""
    libdir = os.path.join(os.path.dirname(os.path.dirname(np.__file__)), "numpy.libs")
    for path in sorted(glob.glob(os.path.join(libdir, "libscipy_openblas64_*"))):
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


def _load():
    """{dtype: gemm function} from NumPy's bundled OpenBLAS, or {}."""
    lib = _library()
    if lib is not None:
        try:
            fns = {np.dtype(np.float32): (lib.scipy_cblas_sgemm64_, ctypes.c_float),
                   np.dtype(np.float64): (lib.scipy_cblas_dgemm64_, ctypes.c_double)}
        except AttributeError:
            return {}
        out = {}
        for dt, (fn, real) in fns.items():
            i64, ptr, enum = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
            fn.argtypes = (enum, enum, enum, i64, i64, i64, real, ptr, i64, ptr, i64, real,
                           ptr, i64)
            fn.restype = None
            out[dt] = fn
        return out
    return {}


_GEMM = {} if os.environ.get("PYNNET3_NO_DIRECT_BLAS") else _load()
# Below this many result entries the NumPy expression is used: its temporary is
# small, and the direct call costs ~5 us more than matmul (ctypes, layout checks).
MIN_DIRECT_ENTRIES = 16384


def _layout(x: np.ndarray):
    """``(transposed, leading dim)`` of a 2-D array as BLAS sees it (row-major, or
    a transposed view of a row-major array), or None."""
    it = x.itemsize
    r, c = x.shape
    s0, s1 = x.strides
    if (s1 == it or c == 1) and (r == 1 or (s0 % it == 0 and s0 // it >= max(1, c))):
        return False, (max(1, c) if r == 1 else s0 // it)
    if (s0 == it or r == 1) and (c == 1 or (s1 % it == 0 and s1 // it >= max(1, r))):
        return True, (max(1, r) if c == 1 else s1 // it)
    return None


def _call(c: np.ndarray, a: np.ndarray, b: np.ndarray, alpha: float):
    """How ``c += alpha * (a @ b)`` runs (non-empty 2-D arrays of matching shapes):
    ``(fn, args)`` of the direct BLAS call, or ``(None, (c, a, b))``: the NumPy
    expression on these operands (transposed where c is column-major)."""
    m, n = c.shape
    k = a.shape[1]
    fn = _GEMM.get(c.dtype) if m * n >= MIN_DIRECT_ENTRIES else None
    lay_c = _layout(c) if fn is not None else None
    if lay_c is not None and lay_c[0]:  # column-major c: c.T += b.T @ a.T
        c, a, b, (m, n) = c.T, b.T, a.T, (n, m)
        lay_c = _layout(c)
    lay_a = _layout(a) if lay_c is not None else None
    lay_b = _layout(b) if lay_a is not None else None
    if (lay_b is None or lay_c[0] or a.dtype != c.dtype or b.dtype != c.dtype
            or not (c.flags.writeable and c.flags.aligned and a.flags.aligned
                    and b.flags.aligned)
            or np.may_share_memory(c, a) or np.may_share_memory(c, b)):
        return None, (c, a, b)
    return fn, (_ROW_MAJOR, _TRANS if lay_a[0] else _NO_TRANS,
                _TRANS if lay_b[0] else _NO_TRANS, m, n, k, alpha, a.ctypes.data,
                lay_a[1], b.ctypes.data, lay_b[1], 1.0, c.ctypes.data, lay_c[1])


def _empty_product(c: np.ndarray, a: np.ndarray, b: np.ndarray) -> bool:
    """Check the shapes of ``c += a @ b``; True when there is nothing to add."""
    m, n = c.shape
    k = a.shape[1]
    if a.shape[0] != m or b.shape != (k, n):
        raise ValueError(f"gemm_acc: shapes {c.shape} += {a.shape} @ {b.shape}")
    return m == 0 or n == 0 or k == 0


def gemm_acc(c: np.ndarray, a: np.ndarray, b: np.ndarray, alpha: float = 1.0) -> None:
    """``c += alpha * (a @ b)`` for 2-D arrays (views of any strides), in place."""
    if _empty_product(c, a, b):
        return
    fn, args = _call(c, a, b, alpha)
    if fn is not None:
        fn(*args)
        return
    c, a, b = args
    prod = a @ b
    if alpha != 1.0:
        prod *= alpha
    c += prod


def gemm_acc_bound(c: np.ndarray, a: np.ndarray, b: np.ndarray) -> Callable[[], None]:
    """``gemm_acc(c, a, b)`` for these very arrays, as a call with no arguments that
    repeats it (the same floats): the layout checks done once, and the direct BLAS
    call's arguments made once. The arrays are kept alive by the call; it is for
    buffers and parameters that stay where they are (runtime/arena.py)."""
    if _empty_product(c, a, b):
        return _nothing
    fn, args = _call(c, a, b, 1.0)
    if fn is None:
        c0, a0, b0 = args

        def fallback():
            c0.__iadd__(a0 @ b0)
        return fallback

    def direct():
        fn(*args)
    direct.keep = (c, a, b)  # (the memory the pointers name)
    return direct


def _nothing() -> None:
    return None


def _load_geadd():
    """{dtype: geadd function} (OpenBLAS's ``C = alpha * A + beta * C`` extension),
    or {}."""
    lib = _library() if _GEMM else None
    out = {}
    for dt, name, real in ((np.float32, "scipy_cblas_sgeadd64_", ctypes.c_float),
                           (np.float64, "scipy_cblas_dgeadd64_", ctypes.c_double)):
        fn = getattr(lib, name, None) if lib is not None else None
        if fn is None:
            return {}
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        fn.argtypes = (ctypes.c_int, i64, i64, real, ptr, i64, real, ptr, i64)
        fn.restype = None
        out[np.dtype(dt)] = fn
    return out


_GEADD = _load_geadd()


def _geadd_exact(dtype) -> bool:
    """Whether this library's ``?geadd`` with alpha = 1 gives the floats of the two
    NumPy passes (``c *= beta; c += a``: the product rounded before the sum). Its
    kernels differ by CPU; one that fused the multiply-add would round once, so
    each process checks once per dtype, on random data, before using it."""
    known = _EXACT.get(dtype)
    if known is None:
        rng = np.random.default_rng(0)
        c = rng.standard_normal((128, 257)).astype(dtype)
        a = rng.standard_normal((128, 257)).astype(dtype)
        want = c * 0.66 + a  # (0.66 in c's dtype, as the call takes it)
        _GEADD[dtype](_ROW_MAJOR, 128, 257, 1.0, a.ctypes.data, 257, 0.66, c.ctypes.data, 257)
        known = _EXACT[dtype] = bool(np.array_equal(c, want))
    return known


_EXACT: dict = {}


def scale_add(c: np.ndarray, a: np.ndarray, beta: float) -> bool:
    """``c = beta * c + a`` in one pass over both (OpenBLAS ``?geadd``), for 2-D
    row-major views of one dtype and shape that do not overlap; False (nothing
    done) where it does not apply. The same floats as ``c *= beta; c += a``
    (:func:`_geadd_exact` makes sure), reading ``c`` once where those two passes
    read it twice and write it twice. Not for ``beta == 0``: ``?geadd`` then writes
    ``a`` without reading ``c`` (an inf or NaN there would vanish, where
    ``c *= 0`` keeps a NaN)."""
    fn = _GEADD.get(c.dtype)
    if (fn is None or beta == 0.0 or a.dtype != c.dtype or a.shape != c.shape
            or c.size < MIN_DIRECT_ENTRIES or not _geadd_exact(c.dtype)):
        return False
    lay_c, lay_a = _layout(c), _layout(a)
    if (lay_c is None or lay_a is None or lay_c[0] or lay_a[0]
            or not (c.flags.writeable and c.flags.aligned and a.flags.aligned)
            or np.may_share_memory(c, a)):
        return False
    fn(_ROW_MAJOR, c.shape[0], c.shape[1], 1.0, a.ctypes.data, lay_a[1], beta,
       c.ctypes.data, lay_c[1])
    return True


#: multiply-adds of the smallest block product that takes a GEMM of its own
BLOCK_GEMM_MIN = 1 << 21


def column_block_path(rows: int, inner: int, widths: list[int]) -> str:
    """How ``(rows x inner) @ (inner x sum(widths))`` is made column block by column
    block, each block added to its own place (``components.affine.add_input_deriv``):

    * ``"whole"``: small blocks (below :data:`BLOCK_GEMM_MIN` multiply-adds, or too
      few entries for the direct call), or no direct BLAS call: the whole product,
      then its columns added. The floats of the whole product, on any BLAS, where a
      GEMM per block would pay its call for little work;
    * ``"direct"``: one :func:`gemm_acc` per block straight into place (beta = 1, no
      product matrix). Equal to the whole product added to float rounding: exactly
      equal where BLAS sums each entry over the inner dimension in one panel and
      whatever the column's position (OpenBLAS's SkylakeX float32 kernels, the
      development host's, up to an inner dimension of 448), within rounding
      elsewhere (its AVX2 kernels, float64 blocks of a width not a multiple of 8,
      an inner dimension summed in panels)."""
    narrowest = min(widths)
    if (not available() or narrowest * rows < MIN_DIRECT_ENTRIES
            or narrowest * rows * inner < BLOCK_GEMM_MIN):
        return "whole"
    return "direct"


def column_block_temporary(rows: int, inner: int, widths: list[int]) -> int:
    """Entries of the temporary :func:`column_block_path`'s way holds at most."""
    return rows * sum(widths) if column_block_path(rows, inner, widths) == "whole" else 0


def set_num_threads(n: int) -> bool:
    """Have NumPy's OpenBLAS use ``n`` threads from now on (what
    ``OPENBLAS_NUM_THREADS`` says at start-up); False where that library or its
    call is not there (another BLAS: its own variables decide)."""
    lib = _library()
    fn = getattr(lib, "scipy_openblas_set_num_threads64_", None) if lib is not None else None
    if fn is None or n < 1:
        return False
    fn.argtypes, fn.restype = (ctypes.c_int,), None
    fn(int(n))
    return True


def num_threads() -> int | None:
    """The threads NumPy's OpenBLAS uses now, or None where it cannot be asked."""
    lib = _library()
    fn = getattr(lib, "scipy_openblas_get_num_threads64_", None) if lib is not None else None
    if fn is None:
        return None
    fn.argtypes, fn.restype = (), ctypes.c_int
    return int(fn())


def available() -> bool:
    """Whether :func:`gemm_acc` calls BLAS directly (else it is the NumPy expression)."""
    return bool(_GEMM)
