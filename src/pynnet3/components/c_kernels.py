"""The compiled kernels of ``_kernels.c``, called through ctypes.

An LSTM step's nonlinearity is ~25 elementwise NumPy passes over the step's gates;
the compiled kernel makes one pass, each row's gates in registers: 150 -> 60 us for
384 rows of 128 cells (AVX-512), the largest non-GEMM cost of decoding an LSTM. A
log-softmax's five passes (max, shift, exp, sum, log) become one read of each row for
its maximum, one for its sum, one write.

The extension is optional. ``pip install`` compiles it where a C compiler is found
(setup.py); where it is missing, where the CPU has neither AVX-512 nor AVX2 with FMA,
or where ``PYNNET3_NO_C_KERNELS`` is set (to anything but empty or 0) when this module
is first used, every function here returns False (nothing done) and the caller runs
its NumPy code.

Numerics: the kernels' tanh and exp are approximations of their own (within 6 and
2 float32 ulps; NumPy's: ~1.4 and ~1), sums run in another order and multiply-adds
may be fused, so results differ from the NumPy path by float32 rounding, not more.
A NaN in gives NaN out, +-inf saturates like tanh. One non-finite difference: where
an LSTM peephole product ``w * c`` overflows float32 and the gate's input is an
infinity of the other sign, NumPy's inf - inf gives NaN but the fused multiply-add
(exact product) gives that infinity (a saturated gate, a finite result); reached only
by cell values near 1e38 with an infinite input, a network long diverged.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import os
from pathlib import Path

import numpy as np

_F32 = np.dtype(np.float32)
_SIZE = _F32.itemsize
_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
_UNLOADED = object()
_lib = _UNLOADED


def _library_path() -> Path | None:
    here = Path(__file__).parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = here / f"_kernels{suffix}"
        if path.is_file():
            return path
    return None


def _load():
    """(level name, {kernel: ctypes function}) or None."""
    if os.environ.get("PYNNET3_NO_C_KERNELS", "") not in ("", "0"):
        return None
    path = _library_path()
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(str(path))
        lib.pynnet3_cpu_level.restype = ctypes.c_int
        level = {2: "avx512", 1: "avx2"}.get(lib.pynnet3_cpu_level())
        if level is None:
            return None
        fns = {name: getattr(lib, f"pynnet3_{name}_{level}")
               for name in ("lstm_forward", "log_softmax", "tanh", "exp")}
    except (OSError, AttributeError):
        return None
    fns["lstm_forward"].argtypes = (_I64, _I64, _PTR, _I64, _PTR, _I64, ctypes.c_float,
                                    _PTR, _PTR, _I64)
    fns["log_softmax"].argtypes = (_I64, _I64, _PTR, _I64, _PTR, _I64)
    fns["tanh"].argtypes = fns["exp"].argtypes = (_I64, _PTR, _PTR)
    for fn in fns.values():
        fn.restype = None
    return level, fns


def _kernels():
    global _lib
    if _lib is _UNLOADED:
        _lib = _load()
    return _lib


def level() -> str | None:
    """The compiled kernels in use: "avx512", "avx2", or None (NumPy runs)."""
    lib = _kernels()
    return None if lib is None else lib[0]


def available() -> bool:
    return _kernels() is not None


def _rows_ok(a: np.ndarray, width: int) -> bool:
    """A float32 matrix of ``width`` contiguous columns per row (any row stride),
    its data aligned for float (C's float* may not point elsewhere)."""
    return (type(a) is np.ndarray and a.dtype == _F32 and a.ndim == 2
            and a.shape[1] == width and (a.strides[1] == _SIZE or width == 1)
            and a.strides[0] % _SIZE == 0 and a.flags.aligned)


def _out_ok(a: np.ndarray, width: int) -> bool:
    """:func:`_rows_ok` and writeable, its rows apart (no row stride shorter than a
    row, e.g. 0 from as_strided: rows written one after another would read or
    overwrite each other's results)."""
    return (_rows_ok(a, width) and a.flags.writeable
            and (a.shape[0] <= 1 or abs(a.strides[0]) >= width * _SIZE))


def lstm_call(x: np.ndarray, params: np.ndarray, c: int, out: np.ndarray,
              c_prev: np.ndarray | None = None, c_prev_scale: float = 1.0):
    """A call with no arguments that runs :func:`lstm_forward` on these arrays (the
    ctypes arguments made once), or None where the kernel does not apply."""
    lib = _kernels()
    if lib is None or c <= 0:
        return None
    rows = x.shape[0] if type(x) is np.ndarray and x.ndim == 2 else -1
    if c_prev is None and rows >= 0:
        c_prev = x[:, 4 * c:5 * c]
    if (rows < 0 or x.shape[1] < 5 * c or not _rows_ok(x[:, :5 * c], 5 * c)
            or not _out_ok(out, 2 * c) or out.shape[0] != rows
            or not _rows_ok(c_prev, c) or c_prev.shape[0] != rows
            or type(params) is not np.ndarray or params.dtype != _F32
            or params.shape != (3, c) or not params.flags.c_contiguous
            or not params.flags.aligned
            or np.may_share_memory(x, out) or np.may_share_memory(params, out)):
        return None
    if np.may_share_memory(c_prev, out) and not (
            c_prev.ctypes.data == out.ctypes.data and c_prev.strides == out.strides):
        return None  # (only a row's own output columns 0:c may be its c_prev)
    fn = lib[1]["lstm_forward"]
    args = (rows, c, x.ctypes.data, x.strides[0] // _SIZE, c_prev.ctypes.data,
            c_prev.strides[0] // _SIZE, float(c_prev_scale), params.ctypes.data,
            out.ctypes.data, out.strides[0] // _SIZE)
    keep = (x, c_prev, params, out)  # (the call holds raw pointers into these)

    def call(keep=keep):
        fn(*args)
    return call


def lstm_forward(x: np.ndarray, params: np.ndarray, c: int, out: np.ndarray,
                 c_prev: np.ndarray | None = None, c_prev_scale: float = 1.0) -> bool:
    """LstmNonlinearity's forward without dropout masks into ``out`` = [c_t, m_t]
    ([rows, 2c]): ``x`` [rows, >= 5c] holds the i, f, g, o parts (and c_prev in
    columns 4c:5c unless ``c_prev`` [rows, c] is given; it is multiplied by
    ``c_prev_scale``), ``params`` [3, c] the peephole weights. float32 only; ``out``
    must not overlap ``x``; ``c_prev`` may be ``out[:, :c]`` itself. False (nothing
    done) where the kernel is missing or does not apply."""
    call = lstm_call(x, params, c, out, c_prev, c_prev_scale)
    if call is None:
        return False
    call()
    return True


def log_softmax(x: np.ndarray, out: np.ndarray) -> bool:
    """``out = x - max - log(sum(exp(x - max)))`` per row of float32 matrices (``out``
    may be ``x`` itself, not a shifted view of it); a NaN in a row makes that row
    NaN, as in NumPy's path. False (nothing done) where the kernel is missing or
    does not apply."""
    lib = _kernels()
    if (lib is None or type(x) is not np.ndarray or x.ndim != 2
            or not _rows_ok(x, x.shape[1])
            or not _out_ok(out, x.shape[1]) or out.shape[0] != x.shape[0]):
        return False
    if np.may_share_memory(x, out) and not (
            x.ctypes.data == out.ctypes.data and x.strides == out.strides):
        return False
    lib[1]["log_softmax"](x.shape[0], x.shape[1], x.ctypes.data, x.strides[0] // _SIZE,
                          out.ctypes.data, out.strides[0] // _SIZE)
    return True


def _elementwise(name: str, x: np.ndarray, out: np.ndarray) -> bool:
    lib = _kernels()
    if (lib is None or type(x) is not np.ndarray or type(out) is not np.ndarray
            or x.dtype != _F32 or out.dtype != _F32 or x.shape != out.shape
            or not x.flags.c_contiguous or not out.flags.c_contiguous
            or not x.flags.aligned or not out.flags.aligned or not out.flags.writeable):
        return False
    if np.may_share_memory(x, out):
        return False  # (the C loops take restrict pointers: out apart from x)
    lib[1][name](x.size, x.ctypes.data, out.ctypes.data)
    return True


def tanh(x: np.ndarray, out: np.ndarray) -> bool:
    """The kernels' float32 tanh, elementwise over contiguous arrays (for tests and
    inspection; ``out`` apart from ``x``); False where it is unavailable or does not
    apply."""
    return _elementwise("tanh", x, out)


def exp(x: np.ndarray, out: np.ndarray) -> bool:
    """The kernels' float32 exp (meant for arguments <= 0, as log-softmax's),
    elementwise over contiguous arrays (for tests; ``out`` apart from ``x``); False
    where it is unavailable or does not apply."""
    return _elementwise("exp", x, out)
