"""The hook through which a training update preconditions a component's gradient.

Kaldi's natural-gradient components precondition inside their ``Update``: they
pass (copies of) the rows they are about to multiply (the input with a column of
ones for the bias, the output derivative, or per-frame parameter derivatives)
through their ``OnlineNaturalGradient`` objects and scale the product by the
returned factors. Here a component's ``backprop`` still adds into its ``grad``
dict; when that dict carries preconditioners (attribute ``preconditioners``: a
mapping slot name -> object with ``precondition(x) -> (x_hat, scale)``, put
there by a trainer), the helpers below add the preconditioned gradient instead
of the plain one and return True. A plain dict (``pynnet3.run``, gradient
checks) carries none: the helpers return False and the component adds the plain
gradient as before. Components never import the trainer: this is duck typing.

Slots: ``"in"`` / ``"out"`` for the two sides of a matrix product
(``preconditioner_in_`` / ``preconditioner_out_``), ``"params"`` for a
component with one preconditioner over its per-frame derivatives, ``"scale"`` /
``"offset"`` for ScaleAndOffset; a CompositeComponent's target maps sub-component
positions to their own slots.

The same target may carry ``backprop_stats``: a dict where a component adds what
Kaldi's Backprop accumulates into the component being updated (LstmNonlinearity's
value/derivative sums and row count), for the trainer to add to the model.

The rows stay in their backend (NumPy, or torch on its device): the preconditioner
keeps its state there and brings only R x R matrices to the host, as Kaldi's GPU
code does.
"""

from __future__ import annotations

import numpy as np

from .blas import gemm_acc
from .xp import namespace


class PreconditionedGrad(dict):
    """A gradient dict that carries preconditioners (what a trainer hands a
    component's backprop; a CompositeComponent hands each sub-component its own)."""

    def __init__(self, arrays=(), preconditioners: dict | None = None,
                 backprop_stats: dict | None = None):
        super().__init__(arrays)
        self.preconditioners = preconditioners
        # where a component adds the statistics Kaldi's Backprop accumulates into the
        # component being updated (LstmNonlinearity: value/derivative sums, count)
        self.backprop_stats = backprop_stats


def preconditioners(grad) -> dict | None:
    """The preconditioners ``grad`` carries (None for a plain dict or no grad)."""
    return getattr(grad, "preconditioners", None) or None


def backprop_stats(grad) -> dict | None:
    """The dict a trainer collects backprop statistics in (None: not collected)."""
    return getattr(grad, "backprop_stats", None)


def _add(g, value) -> None:
    """``g += value`` for gradient and value arrays of any backend."""
    if type(g) is np.ndarray:
        if type(value) is not np.ndarray:
            value = namespace(value).to_numpy(value)
        g += value.reshape(g.shape).astype(g.dtype, copy=False)
    else:
        g += namespace(g).asarray(value, like=g).reshape(tuple(g.shape))


def _augmented(in_value, bias: bool):
    """A new float32 matrix of the input's backend: the input (an array or a list of
    column blocks), with a column of ones appended when ``bias`` (the
    preconditioner may overwrite it)."""
    blocks = in_value if isinstance(in_value, list) else [in_value]
    cols = sum(b.shape[1] for b in blocks)
    shape = (blocks[0].shape[0], cols + int(bias))
    if type(blocks[0]) is np.ndarray:
        out = np.empty(shape, np.float32)
    else:
        out = namespace(blocks[0]).empty(shape, like=blocks[0], dtype=np.float32)
    col = 0
    for blk in blocks:
        out[:, col:col + blk.shape[1]] = blk
        col += blk.shape[1]
    if bias:
        out[:, cols] = 1.0
    return out


def precondition_product(grad, weight_key: str, bias_key: str | None, in_value,
                         out_deriv: np.ndarray) -> bool:
    """Kaldi's natural-gradient update of ``W`` (and bias ``b``) in ``y = x W^T + b``:
    ``x`` with a column of ones appended (when there is a bias) goes through slot
    ``"in"``, ``out_deriv`` through ``"out"``; then ``grad[weight] += s * dy^T x`` and
    ``grad[bias] += s * dy^T ones_hat`` with ``s`` the product of the two scales.
    ``in_value`` may be a list of column blocks. False (nothing added) without
    preconditioners."""
    pre = preconditioners(grad)
    if pre is None:
        return False
    if _implicit_ok(pre, grad, weight_key, bias_key, in_value, out_deriv):
        _precondition_product_implicit(pre, grad, weight_key, bias_key, in_value, out_deriv)
        return True
    x_hat, in_scale = pre["in"].precondition(_augmented(in_value, bias_key is not None),
                                             overwrite=True)
    dy_hat, out_scale = pre["out"].precondition(out_deriv)
    scale = in_scale * out_scale
    g = grad[weight_key]
    cols = g.shape[1]
    if type(g) is np.ndarray and g.dtype == np.float32:
        gemm_acc(g, dy_hat.T, x_hat[:, :cols], scale)
    else:
        _add(g, scale * (dy_hat.T @ x_hat[:, :cols]))
    if bias_key is not None:
        _add(grad[bias_key], scale * (dy_hat.T @ x_hat[:, cols]))
    return True


def _implicit_ok(pre, grad, weight_key, bias_key, in_value, out_deriv) -> bool:
    """Whether the product can take :func:`_precondition_product_implicit`: NumPy
    float32 arrays throughout and preconditioners that offer ``precondition_implicit``."""
    blocks = in_value if isinstance(in_value, list) else [in_value]
    arrays = [grad[weight_key], out_deriv, *blocks]
    if bias_key is not None:
        arrays.append(grad[bias_key])
    return (all(type(a) is np.ndarray and a.dtype == np.float32 and a.ndim == 2
                for a in arrays[:2] + blocks) and
            (bias_key is None or type(arrays[-1]) is np.ndarray) and
            hasattr(pre["in"], "precondition_implicit") and
            hasattr(pre["out"], "precondition_implicit"))


def _precondition_product_implicit(pre, grad, weight_key, bias_key, in_value,
                                   out_deriv) -> None:
    """:func:`precondition_product` with the products reordered (NumPy): with
    ``X_hat = X (I - W_in^T W_in)`` and ``dY_hat = dY (I - W_out^T W_out)``,
    ``dY_hat^T X_hat = (I - W_out^T W_out) (dY^T X) (I - W_in^T W_in)``: the
    N-row products are ``dY^T X`` (the plain gradient's) and each side's ``H = X W^T``
    (and ``J = H^T X`` when its estimate updates), instead of also forming both
    ``X_hat`` and ``dY_hat`` (2 N D R flops each); the rest is O x D x R."""
    blocks = in_value if isinstance(in_value, list) else [in_value]
    bias = bias_key is not None
    x_hat, w_in, in_scale = pre["in"].precondition_implicit(blocks, bias)
    dy_hat, w_out, out_scale = pre["out"].precondition_implicit([out_deriv])
    left = out_deriv if dy_hat is None else dy_hat
    g = grad[weight_key]
    rows, cols = g.shape
    prod = np.zeros((rows, cols + int(bias)), np.float32)   # dY^T [X | 1] (or the hats)
    if x_hat is not None:
        gemm_acc(prod, left.T, x_hat)
    else:
        col = 0
        for blk in blocks:
            gemm_acc(prod[:, col:col + blk.shape[1]], left.T, blk)
            col += blk.shape[1]
        if bias:
            prod[:, cols] = left.sum(axis=0)
    # (float32 as the products: the rounding is of the size of dY^T X's own)
    if w_in is not None:
        gemm_acc(prod, prod @ w_in.T, w_in, -1.0)
    if w_out is not None:
        gemm_acc(prod, w_out.T, w_out @ prod, -1.0)
    scale = np.float32(in_scale * out_scale)
    g += scale * prod[:, :cols]
    if bias:
        _add(grad[bias_key], scale * prod[:, cols])


def precondition_rows(grad, key: str, per_frame: np.ndarray, slot: str = "params") -> bool:
    """Kaldi's update from per-frame derivatives (one row per frame, the parameter
    gradient is their column sum): the rows go through ``slot`` and
    ``grad[key] += scale * sum_rows(rows_hat)`` (reshaped like ``grad[key]``).
    False (nothing added) without that preconditioner."""
    pre = preconditioners(grad)
    if pre is None or slot not in pre:
        return False
    rows_hat, scale = pre[slot].precondition(per_frame)
    _add(grad[key], scale * namespace(rows_hat).sum(rows_hat, axis=0))
    return True


def precondition_matrix(grad, keys, deriv: np.ndarray, slot: str = "in") -> bool:
    """Kaldi's update that preconditions a parameter-shaped derivative ``deriv``
    itself (its rows are the directions, e.g. NaturalGradientRepeatedAffine's
    ``[linear | bias]``): ``deriv_hat * scale`` is added to ``grad[keys]``, or with
    two keys its leading columns to the matrix ``grad[keys[0]]`` and its last
    column to the vector ``grad[keys[1]]``. False without that preconditioner."""
    pre = preconditioners(grad)
    if pre is None or slot not in pre:
        return False
    d_hat, scale = pre[slot].precondition(deriv)
    d_hat = scale * d_hat
    if isinstance(keys, str):
        _add(grad[keys], d_hat)
        return True
    cols = grad[keys[0]].shape[1]
    _add(grad[keys[0]], d_hat[:, :cols])
    _add(grad[keys[1]], d_hat[:, cols])
    return True


def precondition_two_sided(grad, keys, deriv: np.ndarray) -> bool:
    """Kaldi's TimeHeightConvolution update: the ``[linear | bias]`` derivative's rows
    go through slot ``"in"``, then its columns (rows of the transpose) through
    ``"out"``; ``grad[keys[0]]`` / ``grad[keys[1]]`` get the leading columns / the last
    column times both scales. False without preconditioners."""
    pre = preconditioners(grad)
    if pre is None:
        return False
    d_hat, scale_in = pre["in"].precondition(deriv)
    d_hat_t, scale_out = pre["out"].precondition(d_hat.T)
    d_hat = (scale_in * scale_out) * d_hat_t.T
    cols = grad[keys[0]].shape[1]
    _add(grad[keys[0]], d_hat[:, :cols])
    _add(grad[keys[1]], d_hat[:, cols])
    return True


__all__ = ["PreconditionedGrad", "backprop_stats", "preconditioners", "precondition_product",
           "precondition_rows", "precondition_matrix", "precondition_two_sided"]
