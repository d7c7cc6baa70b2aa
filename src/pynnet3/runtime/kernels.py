"""Forward kernels bound to fixed arrays: a component's propagate with its Python
work done once.

An :class:`~pynnet3.runtime.arena.Arena` runs one computation on the same buffers
run after run, so a PROPAGATE reads and writes the same views every time. For the
components decoding spends its time in, :func:`bind_propagate` makes the
propagate's calls once (the column blocks and weight slices a TDNN layer
multiplies, the BLAS arguments of an accumulating GEMM, the views an LSTM step
reads) and returns a call with no arguments that repeats them: the same NumPy and
BLAS calls in the same order as the component's own forward-only code, hence the
same floats.

A bound call returns False, having done nothing, when the component's parameter
arrays are no longer the ones it was bound to (replaced, not written in place);
the arena then runs the ordinary op. Binders are registered per exact class
(:func:`register_kernel`), so a subclass with math of its own is never bound by
its parent's binder; users may register binders of their own.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..components import c_kernels, np_kernels
from ..components.affine import AffineComponent, LinearComponent, NaturalGradientAffineComponent
from ..components.blas import available as blas_direct
from ..components.blas import gemm_acc_bound
from ..components.fused import AffineReluComponent, BlockAffineReluComponent
from ..components.recurrent import LstmNonlinearityComponent, _lstm_forward_numpy, lstm_buffers
from ..components.tdnn import OffsetGather, TdnnComponent

Kernel = Callable[[], bool]
#: binder of each component class: ``binder(comp, precomputed, in_value,
#: out_value, overwrite) -> Kernel | None``
KERNELS: dict[type, Callable] = {}


def register_kernel(*classes: type) -> Callable[[Callable], Callable]:
    """Decorator: the binder of ``classes`` (exact classes, not their subclasses)."""
    def deco(fn):
        for cls in classes:
            KERNELS[cls] = fn
        return fn
    return deco


def bind_propagate(comp, precomputed, in_value: np.ndarray, out_value: np.ndarray,
                   overwrite: bool) -> Kernel | None:
    """``comp``'s forward-only propagate from ``in_value`` into ``out_value`` (with
    ``overwrite``: into an output of undefined contents, as ``propagate_overwrite``),
    bound; None where its class has no binder or the binder declines."""
    binder = KERNELS.get(type(comp))
    if binder is None or type(in_value) is not np.ndarray \
            or type(out_value) is not np.ndarray:
        return None
    return binder(comp, precomputed, in_value, out_value, overwrite)


def _same_dtype(*arrays) -> bool:
    return all(a is not None and a.dtype == arrays[0].dtype for a in arrays)


@register_kernel(TdnnComponent)
def _tdnn(comp, pre, iv, ov, overwrite):
    """TdnnComponent.propagate / propagate_overwrite where the offsets' input rows
    are row windows (``starts``): one product per time offset."""
    w, b, use_bias = comp.linear_params, comp.bias_params, comp.use_bias
    if not isinstance(pre, OffsetGather) or not _same_dtype(iv, ov, w):
        return None
    if use_bias and (not blas_direct() or not _same_dtype(ov, b)):
        return None
    n = pre.num_out
    calls = []
    if pre.starts is not None:
        blocks = [iv[s:s + n] for s in pre.starts]
    elif pre.complete:  # (one gather of every offset's rows, as TdnnComponent._spliced)
        rows = pre.spliced_rows
        gathered = np.empty((len(rows), iv.shape[1]), dtype=iv.dtype)
        calls.append(lambda: np.take(iv, rows, axis=0, out=gathered))
        blocks = [gathered.reshape(n, -1)]
    else:
        return None
    if len(blocks) == 1:
        weights = [w.T]
    else:
        col, weights = 0, []
        for blk in blocks:
            weights.append(w[:, col:col + blk.shape[1]].T)
            col += blk.shape[1]
    if use_bias:  # (bias_first, then every offset's product added by BLAS)
        calls.append(lambda: np.copyto(ov, b))
    elif overwrite:  # (the first offset's product written, the others added)
        blk0, w0 = blocks[0], weights[0]
        calls.append(lambda: np.matmul(blk0, w0, out=ov))
        blocks, weights = blocks[1:], weights[1:]
    calls += [gemm_acc_bound(ov, blk, wt) for blk, wt in zip(blocks, weights, strict=True)]
    return _checked(calls, comp, linear_params=w, bias_params=b, use_bias=use_bias)


@register_kernel(AffineComponent, NaturalGradientAffineComponent)
def _affine(comp, pre, iv, ov, overwrite):
    """AffineComponent's forward-only propagate: the bias, then the product added
    by BLAS."""
    w, b = comp.linear_params, comp.bias_params
    if overwrite or not blas_direct() or not _same_dtype(iv, ov, w, b):
        return None
    calls = [lambda: np.copyto(ov, b), gemm_acc_bound(ov, iv, w.T)]
    return _checked(calls, comp, linear_params=w, bias_params=b)


@register_kernel(LinearComponent)
def _linear(comp, pre, iv, ov, overwrite):
    """LinearComponent: the product added (PROPAGATE_ADDS), or written."""
    w = comp.params_
    if not _same_dtype(iv, ov, w):
        return None
    wt = w.T
    call = (lambda: np.matmul(iv, wt, out=ov)) if overwrite else gemm_acc_bound(ov, iv, wt)
    return _checked([call], comp, params_=w)


@register_kernel(AffineReluComponent, BlockAffineReluComponent)
def _affine_relu(comp, pre, iv, ov, overwrite):
    """The fused affine + ReLU: its linear layer's kernel, then the floor."""
    if overwrite:
        return None
    return _then_floor(comp, bind_propagate(comp.linear, pre, iv, ov, False), ov)


def _then_floor(comp, inner: Kernel | None, out: np.ndarray) -> Kernel | None:
    """The fused affine + ReLU's kernel: ``inner`` (its linear layer's, bound), then
    the floor on ``out``, while the layer and the floor are the bound ones."""
    linear, floor = comp.linear, comp.floor
    relu = _floor(comp, out)
    if inner is None or relu is None:
        return None

    def run() -> bool:
        if comp.linear is not linear or comp.floor is not floor or not inner():
            return False
        relu()
        return True
    return run


def _floor(comp, out: np.ndarray):
    """The fused affine + ReLU's floor on ``out`` (AffineReluComponent._apply_floor),
    bound; None where its dtype differs."""
    if comp._zero_floor:
        return np_kernels.relu_bound(out, out)
    floor = comp.floor
    if not _same_dtype(out, floor):
        return None
    return lambda: np.maximum(out, floor, out=out)


@register_kernel(LstmNonlinearityComponent)
def _lstm(comp, pre, x, out, overwrite):
    """LstmNonlinearity without dropout masks: the compiled kernel (c_kernels) with
    its arguments made once, else recurrent._lstm_forward_numpy on work buffers made
    once."""
    w = comp.params_
    if (overwrite or comp.use_dropout or not _same_dtype(x, out, w)
            or np.may_share_memory(x, out) or out.shape[1] != 2 * comp.cell_dim):
        return None
    c = comp.cell_dim
    compiled = c_kernels.lstm_call(x, w, c, out)
    buffers = lstm_buffers(x.shape[0], c, x.dtype) if compiled is None else None

    def run() -> bool:
        if comp.params_ is not w or comp.use_dropout:
            return False
        if compiled is not None:
            compiled()
        else:
            _lstm_forward_numpy(x, w, c, out, buffers)
        return True
    return run


def bind_row_block(comp, in_value: np.ndarray, block: tuple[int, int], src: np.ndarray,
                   table: np.ndarray, alpha: float, out_value: np.ndarray) -> Kernel | None:
    """``comp.propagate_row_block(...)`` (see AffineComponent.propagate_row_block:
    columns ``block`` of the input are ``alpha * src[table]``) for these arrays,
    bound, for AffineComponent / NaturalGradientAffineComponent and the fused
    affine + ReLU over one; None otherwise."""
    if type(comp) in (AffineReluComponent, BlockAffineReluComponent):
        return _then_floor(comp, bind_row_block(comp.linear, in_value, block, src, table,
                                                alpha, out_value), out_value)
    if type(comp) not in (AffineComponent, NaturalGradientAffineComponent):
        return None
    w, b, out = comp.linear_params, comp.bias_params, out_value
    if (not _same_dtype(out, in_value, src, w) or (b is not None and not _same_dtype(out, b))
            or type(in_value) is not np.ndarray or type(src) is not np.ndarray):
        return None
    from .numpy_backend import NumpyBackend, _all_rows, _grid_views

    c0, c1 = block
    parts = [(lo, hi) for lo, hi in ((0, c0), (c1, in_value.shape[1])) if hi > lo]
    # (recurrent row_block_product's calls, on buffers made here)
    small = np.empty((src.shape[0], w.shape[0]), dtype=out.dtype)
    src3, wblk, small3 = src[:, None, :], w[:, c0:c1].T, small.reshape(src.shape[0], 1, -1)
    calls = [lambda: np.matmul(src3, wblk, out=small3)]
    if alpha != 1.0:
        a = out.dtype.type(alpha)
        calls.append(lambda: np.multiply(small, a, out=small))
    if b is not None:
        calls.append(lambda: np.add(small, b, out=small))
    if not parts:
        calls.append(lambda: np.take(small, table, axis=0, out=out, mode="clip"))
        return _checked(calls, comp, linear_params=w, bias_params=b)
    (lo, hi), rest = parts[0], parts[1:]
    x0, w0 = in_value[:, lo:hi], w[:, lo:hi].T
    calls.append(lambda: np.matmul(x0, w0, out=out))
    calls += [gemm_acc_bound(out, in_value[:, lo:hi], w[:, lo:hi].T) for lo, hi in rest]
    grid = _grid_views(out, small, table) if _all_rows(table, small) else None
    if grid is not None:  # (NumpyBackend.add_rows: the table's rows as a strided view)
        dv, sv = grid
        calls.append(lambda: np.add(dv, sv, out=dv))
    else:
        calls.append(lambda: NumpyBackend.add_rows(None, out, small, table, 1.0))
    return _checked(calls, comp, linear_params=w, bias_params=b)


def _checked(calls: list, comp, **expected) -> Kernel:
    """A kernel running ``calls`` while each named attribute of ``comp`` is still
    the object it was bound with."""
    items = tuple(expected.items())
    if len(calls) == 1:
        (call,) = calls

        def run_one() -> bool:
            for name, value in items:
                if getattr(comp, name) is not value:
                    return False
            call()
            return True
        return run_one

    def run() -> bool:
        for name, value in items:
            if getattr(comp, name) is not value:
                return False
        for call in calls:
            call()
        return True
    return run
