"""Per-component-type forward functions in standard torch ops.

A registry ``type name -> function(g, name, comp, pre, x, rows_out) -> node``: ``g``
is the :class:`~pynnet3.export.graph.GraphBuilder`, ``name`` the component's name
(parameters are keyed by it, so nodes that share a component share parameters),
``comp`` the component, ``pre`` its precomputed indexes for this propagate (None
for simple components), ``x`` the input node ``[N, rows_in, input_dim]``. The
function returns ``[N, rows_out, output_dim]``: the value the component's own
``propagate`` computes for each sequence (for PROPAGATE_ADDS components, the
amount it adds). The math mirrors the NumPy implementation in
``pynnet3.components`` (Kaldi's), written with torch functions that ONNX and
``torch.compile`` both know.

Row-mixing components (TDNN, statistics) read rows through the constant tables
in ``pre``; the tables hold one sequence's rows, and the leading N dimension
carries the batch.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
from torch import fx

from ..errors import ExportError

OpFn = Callable[..., fx.Node]
OPS: dict[str, OpFn] = {}


def register(*type_names: str):
    def deco(fn: OpFn) -> OpFn:
        for t in type_names:
            OPS[t] = fn
        return fn
    return deco


def propagate_op(g, node: str, name: str, comp, pre, x: fx.Node, rows_out: int) -> fx.Node:
    """The exported propagate of component-node ``node`` (component ``name``)."""
    fn = OPS.get(comp.type_name)
    if fn is None:
        raise ExportError(f"node {node!r}: component {name!r} of type {comp.type_name} has "
                          "no standard-op export")
    # (to_torch puts its copy in test mode; this guards other users of the translator)
    if getattr(comp, "test_mode", True) is False and comp.type_name in _NEEDS_TEST_MODE:
        raise ExportError(f"node {node!r}: component {name!r} ({comp.type_name}) is in "
                          "training mode; export computes test mode (set it first)")
    try:
        return fn(g, name, comp, pre, x, rows_out)
    except ExportError as e:  # (a CompositeComponent's part: say which node holds it)
        if str(e).startswith("node "):
            raise
        raise ExportError(f"node {node!r}: {e}") from None


_NEEDS_TEST_MODE = {"BatchNormComponent", "DropoutComponent", "DropoutMaskComponent",
                    "GeneralDropoutComponent", "SpecAugmentTimeMaskComponent"}


def _call(g, fn, *args, **kwargs):
    return g.call(fn, *args, **kwargs)


# -- affine family -------------------------------------------------------------------------

@register("AffineComponent", "NaturalGradientAffineComponent", "FixedAffineComponent")
def _affine(g, name, comp, pre, x, rows_out):
    w = g.param(name, "linear_params", comp.linear_params)
    b = g.param(name, "bias_params", comp.bias_params)
    return _call(g, F.linear, x, w, b)


@register("LinearComponent")
def _linear(g, name, comp, pre, x, rows_out):
    return _call(g, F.linear, x, g.param(name, "params", comp.params_))


@register("RepeatedAffineComponent", "NaturalGradientRepeatedAffineComponent")
def _repeated_affine(g, name, comp, pre, x, rows_out):
    w = g.param(name, "linear_params", comp.linear_params)
    b = g.param(name, "bias_params", comp.bias_params)
    block_in = comp.linear_params.shape[1]
    k = comp.input_dim // block_in
    xb = _call(g, torch.unflatten, x, -1, (k, block_in))
    return _call(g, torch.flatten, _call(g, F.linear, xb, w, b), -2)


@register("BlockAffineComponent")
def _block_affine(g, name, comp, pre, x, rows_out):
    k = comp.num_blocks
    w = np.asarray(comp.linear_params, np.float32)  # [out, in / k]
    out_b, in_b = w.shape[0] // k, w.shape[1]
    wp = g.param(name, "linear_params", w)
    w3 = _call(g, torch.reshape, wp, (k, out_b, in_b))
    xb = _call(g, torch.unflatten, x, -1, (k, in_b))  # [N, R, k, in_b]
    y = _call(g, torch.einsum, "nrki,koi->nrko", xb, w3)
    return _call(g, operator.add, _call(g, torch.flatten, y, -2),
                 g.param(name, "bias_params", comp.bias_params))


# -- nonlinearities -------------------------------------------------------------------------

@register("RectifiedLinearComponent")
def _relu(g, name, comp, pre, x, rows_out):
    return _call(g, torch.relu, x)


@register("SigmoidComponent")
def _sigmoid(g, name, comp, pre, x, rows_out):
    return _call(g, torch.sigmoid, x)


@register("TanhComponent")
def _tanh(g, name, comp, pre, x, rows_out):
    return _call(g, torch.tanh, x)


@register("SoftmaxComponent")
def _softmax(g, name, comp, pre, x, rows_out):
    return _call(g, torch.clamp_min, _call(g, torch.softmax, x, -1), 1.0e-20)


@register("LogSoftmaxComponent")
def _log_softmax(g, name, comp, pre, x, rows_out):
    return _call(g, torch.log_softmax, x, -1)


@register("NormalizeComponent")
def _normalize(g, name, comp, pre, x, rows_out):
    d = comp.block_dim
    k = comp.dim // d
    xb = _call(g, torch.unflatten, x, -1, (k, d)) if k > 1 else x
    sq = _call(g, torch.sum, _call(g, operator.mul, xb, xb), -1, keepdim=True)
    # (as the NumPy component: 1 / sqrt(max(x.x / (D rms^2), 2^-66)))
    ms = _call(g, torch.clamp_min, _call(g, operator.truediv, sq,
                                         float(d * comp.target_rms * comp.target_rms)),
               2.0 ** -66)
    f = _call(g, torch.reciprocal, _call(g, torch.sqrt, ms))
    y = _call(g, operator.mul, xb, f)
    if comp.add_log_stddev:
        log_col = _call(g, operator.sub, math.log(comp.target_rms), _call(g, torch.log, f))
        y = _call(g, torch.cat, [y, log_col], -1)
    return _call(g, torch.flatten, y, -2) if k > 1 else y


@register("PnormComponent")
def _pnorm(g, name, comp, pre, x, rows_out):
    k = comp.output_dim
    xb = _call(g, torch.unflatten, x, -1, (k, comp.input_dim // k))
    return _call(g, torch.sqrt, _call(g, torch.sum, _call(g, operator.mul, xb, xb), -1))


# -- BatchNorm, dropout and identities (test mode) ----------------------------------------

@register("BatchNormComponent")
def _batchnorm(g, name, comp, pre, x, rows_out):
    scale, offset = comp.test_transform()
    k = comp.dim // comp.block_dim
    scale, offset = np.tile(scale, k), np.tile(offset, k)
    return _call(g, torch.addcmul, g.const(offset, hint="bn_offset"), x,
                 g.const(scale, hint="bn_scale"))


@register("NoOpComponent", "ClipGradientComponent")
def _identity(g, name, comp, pre, x, rows_out):
    return x


@register("BackpropTruncationComponent")
def _backprop_truncation(g, name, comp, pre, x, rows_out):
    rows = getattr(pre, "in_rows", None)
    y = x if rows is None else g.rows(x, rows, len(rows))
    return g.scale(y, comp.scale)


@register("GeneralDropoutComponent", "SpecAugmentTimeMaskComponent")
def _row_identity(g, name, comp, pre, x, rows_out):
    gather = None if pre is None else pre.gather
    return x if gather is None else g.rows(x, gather, len(gather))


@register("DropoutComponent")
def _dropout(g, name, comp, pre, x, rows_out):
    return g.scale(x, 1.0 - comp.dropout_proportion)


@register("DropoutMaskComponent")
def _dropout_mask(g, name, comp, pre, x, rows_out):
    p = comp.dropout_proportion
    value = 1.0 if (p == 0.0 or comp.continuous) else 1.0 - p
    return g.full(rows_out, comp.output_dim, value)


# -- scales and offsets ----------------------------------------------------------------------

@register("FixedScaleComponent")
def _fixed_scale(g, name, comp, pre, x, rows_out):
    return _call(g, operator.mul, x, g.const(comp.scales, hint="scales"))


@register("FixedBiasComponent")
def _fixed_bias(g, name, comp, pre, x, rows_out):
    return _call(g, operator.add, x, g.const(comp.bias, hint="bias"))


@register("PerElementScaleComponent", "NaturalGradientPerElementScaleComponent")
def _per_element_scale(g, name, comp, pre, x, rows_out):
    return _call(g, operator.mul, x, g.param(name, "scales", comp.scales))


@register("PerElementOffsetComponent")
def _per_element_offset(g, name, comp, pre, x, rows_out):
    reps = comp.dim // comp.offsets.shape[0]
    off = g.param(name, "offsets", comp.offsets)
    if reps > 1:
        off = _call(g, torch.tile, off, (reps,))
    return _call(g, operator.add, x, off)


@register("ScaleAndOffsetComponent")
def _scale_and_offset(g, name, comp, pre, x, rows_out):
    block = comp.scales.shape[0]
    k = comp.dim // block
    xb = _call(g, torch.unflatten, x, -1, (k, block)) if k > 1 else x
    y = _call(g, torch.addcmul, g.param(name, "offsets", comp.offsets), xb,
              g.param(name, "scales", comp._nonzero_scales(comp.scales)))  # noqa: SLF001
    return _call(g, torch.flatten, y, -2) if k > 1 else y


@register("ConstantFunctionComponent", "ConstantComponent")
def _constant(g, name, comp, pre, x, rows_out):
    out = g.param(name, "output", comp.output)
    return _call(g, operator.add, g.zeros(rows_out, len(comp.output)), out)


# -- column maps ------------------------------------------------------------------------------

@register("SumGroupComponent")
def _sum_group(g, name, comp, pre, x, rows_out):
    sizes = np.asarray(comp.sizes)
    w = np.zeros((len(sizes), int(sizes.sum())), np.float32)
    w[np.repeat(np.arange(len(sizes)), sizes), np.arange(int(sizes.sum()))] = 1.0
    return _call(g, F.linear, x, g.const(w, hint="sumgroup"))


@register("SumBlockComponent")
def _sum_block(g, name, comp, pre, x, rows_out):
    k = comp.input_dim // comp.output_dim
    xb = _call(g, torch.unflatten, x, -1, (k, comp.output_dim))
    return g.scale(_call(g, torch.sum, xb, -2), comp.scale)


@register("ElementwiseProductComponent")
def _elementwise_product(g, name, comp, pre, x, rows_out):
    k = comp.input_dim // comp.output_dim
    xb = _call(g, torch.unflatten, x, -1, (k, comp.output_dim))
    return _call(g, torch.prod, xb, -2)


@register("PermuteComponent")
def _permute(g, name, comp, pre, x, rows_out):
    return _call(g, torch.index_select, x, -1, g.const(comp.column_map, hint="perm"))


# -- recurrences ----------------------------------------------------------------------------------

@register("LstmNonlinearityComponent")
def _lstm(g, name, comp, pre, x, rows_out):
    c = comp.cell_dim
    w = g.param(name, "params", comp.params_)
    part = [g.cols(x, k * c, (k + 1) * c, comp.input_dim) for k in range(5)]
    i_part, f_part, c_part, o_part, c_prev = part
    if comp.use_dropout:
        i_s, f_s, o_s = (g.cols(x, 5 * c + k, 5 * c + k + 1, comp.input_dim) for k in range(3))
    w0, w1, w2 = (_call(g, operator.getitem, w, k) for k in range(3))
    mul, add = operator.mul, operator.add
    i_t = _call(g, torch.sigmoid, _call(g, add, i_part, _call(g, mul, w0, c_prev)))
    f_t = _call(g, torch.sigmoid, _call(g, add, f_part, _call(g, mul, w1, c_prev)))
    if comp.use_dropout:
        i_t, f_t = _call(g, mul, i_t, i_s), _call(g, mul, f_t, f_s)
    c_t = _call(g, add, _call(g, mul, f_t, c_prev),
                _call(g, mul, i_t, _call(g, torch.tanh, c_part)))
    o_t = _call(g, torch.sigmoid, _call(g, add, o_part, _call(g, mul, w2, c_t)))
    if comp.use_dropout:
        o_t = _call(g, mul, o_t, o_s)
    m_t = _call(g, mul, o_t, _call(g, torch.tanh, c_t))
    return _call(g, torch.cat, [c_t, m_t], -1)


@register("GruNonlinearityComponent")
def _gru(g, name, comp, pre, x, rows_out):
    c, r, d = comp.cell_dim, comp.recurrent_dim, comp.input_dim
    z_t, r_t = g.cols(x, 0, c, d), g.cols(x, c, c + r, d)
    hpart, c_t1 = g.cols(x, c + r, 2 * c + r, d), g.cols(x, 2 * c + r, 3 * c + r, d)
    s_t1 = g.cols(x, d - r, d, d)
    w_h = g.param(name, "w_h", comp.w_h)
    h_t = _call(g, torch.tanh, _call(g, operator.add, hpart, _call(
        g, F.linear, _call(g, operator.mul, r_t, s_t1), w_h)))
    return _call(g, torch.cat, [h_t, _gru_out(g, h_t, z_t, c_t1)], -1)


@register("OutputGruNonlinearityComponent")
def _output_gru(g, name, comp, pre, x, rows_out):
    c, d = comp.cell_dim, comp.input_dim
    z_t, hpart, c_t1 = g.cols(x, 0, c, d), g.cols(x, c, 2 * c, d), g.cols(x, 2 * c, 3 * c, d)
    w_h = g.param(name, "w_h", comp.w_h)
    h_t = _call(g, torch.tanh, _call(g, torch.addcmul, hpart, c_t1, w_h))
    return _call(g, torch.cat, [h_t, _gru_out(g, h_t, z_t, c_t1)], -1)


def _gru_out(g, h_t, z_t, c_t1):
    """h - z h + z c_{t-1}, in that order (the NumPy component's float ops)."""
    mul = operator.mul
    return _call(g, operator.add, _call(g, operator.sub, h_t, _call(g, mul, z_t, h_t)),
                 _call(g, mul, z_t, c_t1))


# -- composite ----------------------------------------------------------------------------------

@register("CompositeComponent")
def _composite(g, name, comp, pre, x, rows_out):
    """Sub-components in turn (sub-component i's parameters are ``name#i``, as in
    the runtime's gradients); one that adds, adds into zeros: its value."""
    for i, sub in enumerate(comp.components):
        fn = OPS.get(sub.type_name)
        if fn is None:
            raise ExportError(f"component {name!r}: sub-component {i} of type "
                              f"{sub.type_name} has no standard-op export")
        x = fn(g, f"{name}#{i}", sub, None, x, rows_out)
    return x


from . import ops_time  # noqa: E402,F401  (registers the row-mixing components)


@register("AffineReluComponent")
def _affine_relu(g, name, comp, pre, x, rows_out):
    """The network optimizer's fused kernel: its linear layer, then max with the floor."""
    fn = OPS.get(comp.linear.type_name)
    if fn is None:
        raise ExportError(f"component {name!r}: its linear part {comp.linear.type_name} has "
                          "no standard-op export")
    y = fn(g, name, comp.linear, pre, x, rows_out)
    if not comp.floor.any():
        return _call(g, torch.relu, y)
    return _call(g, torch.maximum, y, g.param(name, "floor", comp.floor))
