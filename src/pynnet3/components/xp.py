"""The array namespace components compute with: one code path for NumPy and torch.

Components receive the backend's arrays (NumPy arrays from the NumPy backend,
torch tensors from the torch backend, on any device) and write their math ONCE
against a namespace of NumPy-named functions taken from those arrays::

    from .xp import namespace

    def propagate(self, indexes, in_value, out_value):
        xp = namespace(in_value)
        xp.maximum(in_value, 0.0, out=out_value)

``namespace(x)`` returns :mod:`pynnet3.components.xp_numpy` for NumPy arrays (its
functions ARE NumPy's: the NumPy path costs nothing more) and
:mod:`pynnet3.components.xp_torch` for torch tensors (torch is imported only then).
Both modules export the same names; :data:`NAMES` lists them and a test checks it.

The contract (what component math may use)
-------------------------------------------
* On arrays directly: the operators (``+ - * / ** @``, unary ``-``, comparisons,
  in-place ``+= -= *= /=``), ``a[...] = b`` and slice assignment, basic indexing
  (ints, slices, ``None``) and row indexing with an index from ``xp.index``,
  ``.shape``, ``.ndim``, ``.T`` (2-D), ``.reshape(...)``, and ``.dtype`` only to
  compare with another array's dtype or to pass to an ``xp`` function.
* Everything else goes through ``xp``. In particular never call on an array
  ``.astype`` (``xp.astype``), ``.sum/.max/.min/.mean/.cumsum`` (``xp.sum``,
  ``xp.amax`` ...: torch's ``.max(dim)`` returns indices too), ``.copy()``
  (``xp.copy``), ``.dtype.type(v)``, ``.flags``, ``np.add.at`` (``xp.add_at``),
  ``np.take`` (``xp.take``), ``np.may_share_memory`` / ``np.shares_memory``
  (``xp.may_share_memory`` / ``xp.shares_memory``).
* Functions: elementwise ``exp log log1p tanh sqrt abs square sign negative
  reciprocal rint maximum minimum add subtract multiply divide clip`` (all take ``out=``,
  which may be one of the inputs, and Python scalars where NumPy does), ``sigmoid(x)``
  (the logistic function, one op on torch; NumPy: ``0.5 * tanh(0.5 x) + 0.5``),
  ``where(cond, a, b)``, reductions ``sum amax amin mean prod cumsum any all``
  (``axis``, ``keepdims``; ``sum``/``cumsum`` take ``dtype``, ``cumsum`` ``out``),
  ``tile(x, reps)``,
  ``add_reduceat(x, starts, axis)`` (NumPy's ``np.add.reduceat``), ``matmul(a, b, out=None)``,
  ``einsum``, ``gemm_acc(c, a, b, alpha=1.0)`` (``c += alpha * a @ b`` in place, no
  temporary), ``concatenate stack`` (``axis``), ``take(src, rows, out=None)``
  (row gather), ``add_at(dst, rows, src)`` (``dst[rows] += src``, repeated rows
  accumulate), ``may_share_memory``, ``shares_memory`` (exact), ``copy``,
  ``astype(x, dtype)`` (no copy when already that dtype).
* Creating arrays: ``zeros(shape, like=x, dtype=None)``, ``empty``, ``full(shape,
  value, like=x)``, ``zeros_like``, ``empty_like``, ``ones_like``; they land on
  ``like``'s device with ``like``'s dtype unless ``dtype`` is given. Dtypes:
  ``xp.float32``, ``xp.float64``, ``xp.int64``, ``xp.bool_`` or an array's
  ``.dtype``; NumPy dtypes are accepted by the torch functions too.
* Data that lives on the host (components keep NumPy arrays):
    - ``xp.param(self.linear_params, like=x)``: a parameter in ``x``'s dtype and
      device. NumPy: ``astype(copy=False)``. Torch CPU: shares the NumPy memory
      (float32) or casts; other devices: a cached device copy, re-checked against
      the host array once per run (:func:`new_run`), so in-place updates of the
      NumPy parameters between runs are always seen.
    - ``xp.index(table, like=x)``: an integer index table built at compile time
      (``precompute_indexes``), as int64 on ``x``'s device, converted once and
      cached while the table lives. Tables must not be modified after compilation.
    - ``xp.asarray(host_array_or_scalar, like=x, dtype=None)``: small host values
      (e.g. a self-repair row computed from statistics), uploaded on every call.
    - ``xp.to_numpy(x)``: back to the host. On a GPU this waits for the device:
      not on the forward or backward path.
* Statistics and counters a run adds to (NumPy float64 arrays and numbers in the
  component): declare them with ``device_stats.stats_attribute(name)`` and add with
  ``device_stats.add(self, name, xp.sum(...))``; on a GPU the sums stay there until
  the attribute is read, and ``device_stats.on_device`` gives math that reads them
  (self-repair) their total on the device (components/device_stats.py).
* Scalars: Python floats. NumPy >= 2 converts a Python float to the array's dtype
  (NEP 50), which gives the same floats as ``x.dtype.type(v)``; round with
  :func:`f32` where Kaldi rounds a constant to float32 first. Where constants are
  combined with each other in the array's precision (``dt.type(a) * dt.type(b)``),
  do it on the host: ``ft = xp.scalar_type(x); c = float(ft(a) * ft(b))`` (NumPy
  scalar types for both namespaces; never mix NumPy scalars into torch math).
* Gradients (``grad[name]``) are arrays of the same backend: add into them with
  ``+=`` or ``xp.gemm_acc``.
* Avoid on the propagate/backprop path anything that makes the host wait for a
  GPU: boolean-mask indexing, ``float(t)``, ``if t.any():``, ``xp.to_numpy``.
  Compute data-dependent index sets at compile time instead.
* ``xp.is_numpy`` is True for the NumPy namespace. Branch on it only for speed
  tricks with no torch counterpart (never for different math).
* ``xp.launch_bound(x)``: True where every operation on ``x`` costs a kernel launch
  (a GPU): there a loop over windows or blocks should become one larger operation
  (same math, another summation order); False for NumPy arrays and CPU tensors.
"""

from __future__ import annotations

import numpy as np

from . import xp_numpy

# The names both namespaces provide (the contract above; tests check both).
NAMES = (
    "is_numpy", "launch_bound", "float32", "float64", "int64", "bool_",
    "exp", "log", "log1p", "tanh", "sqrt", "abs", "square", "sign", "negative",
    "reciprocal", "rint", "sigmoid", "maximum", "minimum", "add", "subtract", "multiply",
    "divide", "clip",
    "where", "sum", "amax", "amin", "mean", "cumsum", "prod", "any", "all", "tile",
    "add_reduceat", "scalar_type", "matmul", "einsum", "gemm_acc",
    "concatenate", "stack", "take", "add_at", "may_share_memory", "shares_memory", "copy",
    "astype",
    "zeros", "empty", "full", "zeros_like", "empty_like", "ones_like",
    "param", "index", "asarray", "to_numpy", "isfinite",
)


def f32(x: float) -> float:
    """The value a C++ ``BaseFloat`` (float32) holds, as a Python float."""
    return float(np.float32(x))


_BY_TYPE: dict[type, object] = {}  # array types seen -> their namespace


def namespace(x):
    """The array namespace for ``x`` (a NumPy array or a torch tensor)."""
    if type(x) is np.ndarray:  # the hot path: one type check
        return xp_numpy
    ns = _BY_TYPE.get(type(x))
    if ns is not None:  # (torch tensors: one dict lookup)
        return ns
    if isinstance(x, list):  # input given as column blocks
        return namespace(x[0])
    if isinstance(x, np.ndarray):
        ns = xp_numpy
    elif type(x).__module__.startswith("torch"):
        from . import xp_torch

        ns = xp_torch
    else:
        raise TypeError(f"no array namespace for {type(x).__name__}")
    _BY_TYPE[type(x)] = ns
    return ns


def new_run() -> None:
    """Start a new run: cached device copies of parameters are checked against
    their host arrays again on first use (the runtime calls this per run)."""
    import sys

    mod = sys.modules.get(__name__.rsplit(".", 1)[0] + ".xp_torch")
    if mod is not None:
        mod.new_run()


__all__ = ["namespace", "new_run", "f32", "NAMES"]
