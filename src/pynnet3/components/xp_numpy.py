"""The NumPy array namespace (see :mod:`pynnet3.components.xp` for the contract).

The elementwise functions and reductions are NumPy's own objects, so component
math written against ``xp`` runs exactly the NumPy code it always ran.
"""

from __future__ import annotations

import numpy as np
from numpy import (  # noqa: F401 - re-exported as the namespace
    abs,
    add,
    all,
    amax,
    amin,
    any,
    clip,
    concatenate,
    cumsum,
    divide,
    einsum,
    exp,
    float32,
    float64,
    int64,
    isfinite,
    log,
    log1p,
    matmul,
    maximum,
    may_share_memory,
    mean,
    minimum,
    multiply,
    negative,
    prod,
    reciprocal,
    rint,
    shares_memory,
    sign,
    sqrt,
    square,
    stack,
    subtract,
    sum,
    tanh,
    tile,
    where,
)

from .blas import gemm_acc  # noqa: F401 - c += alpha * a @ b, one BLAS call

is_numpy = True
bool_ = np.bool_
zeros_like = np.zeros_like
empty_like = np.empty_like
ones_like = np.ones_like


def launch_bound(x: np.ndarray) -> bool:
    """False: a NumPy operation costs no kernel launch (see xp.py)."""
    return False


def sigmoid(x: np.ndarray) -> np.ndarray:
    """The logistic function in its tanh form: no overflow warnings for large |x|,
    the value of 1 / (1 + exp(-x))."""
    return 0.5 * np.tanh(0.5 * x) + 0.5


def copy(x: np.ndarray) -> np.ndarray:
    return x.copy()


def astype(x: np.ndarray, dtype) -> np.ndarray:
    return x.astype(dtype, copy=False)


def zeros(shape, like: np.ndarray, dtype=None) -> np.ndarray:
    return np.zeros(shape, dtype=like.dtype if dtype is None else dtype)


def empty(shape, like: np.ndarray, dtype=None) -> np.ndarray:
    return np.empty(shape, dtype=like.dtype if dtype is None else dtype)


def full(shape, value, like: np.ndarray, dtype=None) -> np.ndarray:
    return np.full(shape, value, dtype=like.dtype if dtype is None else dtype)


def take(src: np.ndarray, rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``src[rows]`` (rows of a 2-D array, or entries of a 1-D one), into ``out``."""
    return np.take(src, rows, axis=0, out=out)


def add_at(dst: np.ndarray, rows: np.ndarray, src) -> None:
    """``dst[rows] += src`` where repeated rows accumulate."""
    np.add.at(dst, rows, src)


def scalar_type(x: np.ndarray):
    """The NumPy scalar type of ``x``'s dtype: ``float(scalar_type(x)(v))`` is ``v``
    rounded as ``x.dtype.type(v)`` rounds it, as a Python float (exact)."""
    return x.dtype.type


def add_reduceat(x: np.ndarray, starts: np.ndarray, axis: int = 1) -> np.ndarray:
    """Sums of the groups of consecutive columns starting at ``starts`` (NumPy's
    ``np.add.reduceat``; ``starts`` increasing, groups non-empty)."""
    return np.add.reduceat(x, starts, axis=axis)


def param(a: np.ndarray, like: np.ndarray) -> np.ndarray:
    """A parameter array in ``like``'s dtype (no copy when it already is)."""
    return a.astype(like.dtype, copy=False)


def index(table: np.ndarray, like: np.ndarray) -> np.ndarray:
    """A compile-time index table, as the namespace's index array (itself)."""
    return table


def asarray(a, like: np.ndarray, dtype=None) -> np.ndarray:
    """Host data as an array of ``like``'s kind (``like``'s dtype unless given)."""
    return np.asarray(a, dtype=like.dtype if dtype is None else dtype)


def to_numpy(x: np.ndarray) -> np.ndarray:
    return x


def new_run() -> None:
    """Nothing to refresh: NumPy parameters are used as they are."""
