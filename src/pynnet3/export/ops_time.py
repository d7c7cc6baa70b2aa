"""Exported forwards of the components that mix rows (frames): TDNN, time-height
convolution, statistics extraction and pooling.

Their precomputed indexes (one sequence's rows) become constant tables: row
gathers (``index_select`` on dim 1, zero rows through a 0/1 mask) and window-sum
matrices (``matmul`` with a constant 0/1 matrix ``[rows_out, rows_in]``, in float64
as the NumPy component sums). Registered into :data:`pynnet3.export.ops.OPS`.
"""

from __future__ import annotations

import operator

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812

from .ops import register


def _call(g, fn, *args, **kwargs):
    return g.call(fn, *args, **kwargs)


@register("TdnnComponent")
def _tdnn(g, name, comp, pre, x, rows_out):
    """bias + W [x(t + o_0) | x(t + o_1) | ...] (one gather per offset)."""
    rows_in = pre.num_in
    spliced = g.cat([g.gather_rows(x, src, rows_in) for src in pre.src], 2)
    w = g.param(name, "linear_params", comp.linear_params)
    b = g.param(name, "bias_params", comp.bias_params) if comp.use_bias else None
    return _call(g, F.linear, spliced, w, b)


@register("TimeHeightConvolutionComponent")
def _time_height_conv(g, name, comp, pre, x, rows_out):
    """Per kernel offset (t, h): the rows of time offset t (zero when absent) and the
    heights h_out * subsample + h (zero outside the image), side by side, then one
    linear map over (offsets x filters-in) per output pixel."""
    m = comp.model
    t_index = {t: k for k, t in enumerate(m.all_time_offsets)}
    h_out = np.arange(m.height_out) * m.height_subsample_out
    by_time = {}
    patches = []
    for t_off, h_off in m.offsets:
        k = t_index[t_off]
        if k not in by_time:
            rows = g.gather_rows(x, pre.src[k], pre.num_in)
            by_time[k] = _call(g, torch.unflatten, rows, -1, (m.height_in, m.num_filters_in))
        h_in = h_out + h_off
        inside = (h_in >= 0) & (h_in < m.height_in)
        y = _call(g, torch.index_select, by_time[k], 2,
                  g.const(np.where(inside, h_in, 0), hint="height"))
        if not inside.all():
            y = _call(g, operator.mul, y, g.const(inside.astype(np.float32)[:, None],
                                                  hint="hmask"))
        patches.append(y)  # [N, rows_out, height_out, filters_in]
    w = g.param(name, "linear_params", comp.linear_params)
    b = g.param(name, "bias_params", comp.bias_params)
    out = _call(g, F.linear, g.cat(patches, 3), w, b)
    return _call(g, torch.flatten, out, -2)


def window_matrix(pre) -> np.ndarray:
    """``W [rows_out, rows_in]`` with ``W[o, perm[j]] = 1`` for ``lo[o] <= j < hi[o]``
    (:class:`~pynnet3.components.statistics.RangeIndexes`)."""
    lo, hi = np.asarray(pre.lo, np.int64), np.asarray(pre.hi, np.int64)
    counts = np.maximum(hi - lo, 0)
    owner = np.repeat(np.arange(len(lo)), counts)
    # j runs over each window: lo[o] + 0, 1, ..., counts[o] - 1
    starts = np.repeat(lo - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts)
    j = starts + np.arange(int(counts.sum()))
    w = np.zeros((len(lo), pre.num_input_rows), np.float64)
    w[owner, np.asarray(pre.perm, np.int64)[j]] = 1.0
    return w


def _window_sums(g, pre, x):
    """Window sums of ``x``'s rows, summed in float64, then back to ``x``'s dtype."""
    s = g.row_matrix(x, window_matrix(pre), dtype=torch.float64)
    return g.method("type_as", s, x)


@register("StatisticsExtractionComponent")
def _stats_extraction(g, name, comp, pre, x, rows_out):
    """[count, sum x, (sum x^2)] per output window."""
    counts = g.const(np.asarray(pre.counts, np.float32)[:, None], hint="counts")
    count_col = _call(g, operator.add, g.zeros(rows_out, 1), counts)
    sq = _call(g, operator.mul, x, x) if comp.include_variance else None
    if pre.is_identity:
        parts = [count_col, x] + ([sq] if sq is not None else [])
    else:
        parts = [count_col, _window_sums(g, pre, x)]
        if sq is not None:
            parts.append(_window_sums(g, pre, sq))
    return g.cat(parts, 2)


@register("StatisticsPoolingComponent")
def _stats_pooling(g, name, comp, pre, x, rows_out):
    """[log(count) x num-log-count-features, mean, (stddev)] over each window."""
    sums = _window_sums(g, pre, x)
    d = comp.input_dim
    counts = g.cols(sums, 0, 1, d)
    stats = _call(g, operator.truediv, g.cols(sums, 1, d, d), counts)
    if comp.output_stddevs:
        f = comp.feature_dim
        mean = g.cols(stats, 0, f, d - 1)
        var = _call(g, operator.sub, g.cols(stats, f, d - 1, d - 1),
                    _call(g, operator.mul, mean, mean))
        std = _call(g, torch.sqrt, _call(g, torch.clamp_min, var, float(comp.variance_floor)))
        stats = g.cat([mean, std], 2)
    nlc = comp.num_log_count_features
    if nlc:
        log_count = _call(g, torch.log, counts)
        stats = g.cat([log_count] * nlc + [stats], 2)
    return stats


@register("DistributeComponent")
def _distribute(g, name, comp, pre, x, rows_out):
    """Output row o = block ``offsets[o] / output_dim`` of input row ``rows[o]``: the
    blocks laid out as rows, then one gather."""
    od = comp.output_dim
    k = comp.input_dim // od
    blocks = _call(g, torch.flatten, _call(g, torch.unflatten, x, -1, (k, od)), 1, 2)
    table = np.asarray(pre.rows, np.int64) * k + np.asarray(pre.offsets, np.int64) // od
    return g.rows(blocks, table, pre.num_input_rows * k)


@register("RestrictedAttentionComponent")
def _attention(g, name, comp, pre, x, rows_out):
    """Per head: softmax over the context of scale * q.k + the query's context part,
    the values weighted by it (and, with output-context, the weights)."""
    h, dh = comp.num_heads, comp.input_dim_per_head
    kd, vd, ctx = comp.key_dim, comp.value_dim, comp.context_dim
    rows = np.asarray(pre.context_rows, np.int64)  # num_input_rows = a zero row
    padded = g.cat([x, g.zeros(1, comp.input_dim)], 1)
    gathered = _call(g, torch.index_select, padded, 1, g.const(rows.reshape(-1), hint="att"))
    heads = _call(g, torch.reshape, gathered, (-1, len(rows), ctx, h, dh))  # [N, O, C, H, Dh]
    k_ctx = _call(g, operator.getitem, heads, (Ellipsis, slice(0, kd)))
    v_ctx = _call(g, operator.getitem, heads, (Ellipsis, slice(kd, kd + vd)))
    query = g.rows(x, rows[:, comp.num_left_inputs], pre.num_input_rows)
    query = _call(g, torch.reshape, query, (-1, len(rows), h, dh))  # [N, O, H, Dh]
    q_key = _call(g, operator.getitem, query, (Ellipsis, slice(kd + vd, 2 * kd + vd)))
    q_ctx = _call(g, operator.getitem, query, (Ellipsis, slice(2 * kd + vd, None)))
    b = _call(g, operator.add, g.scale(_call(g, torch.einsum, "nohk,nojhk->nohj", q_key,
                                             k_ctx), comp.key_scale), q_ctx)
    c = _call(g, torch.softmax, b, -1)  # [N, O, H, C]
    out = _call(g, torch.einsum, "nohj,nojhv->nohv", c, v_ctx)
    if comp.output_context:
        out = _call(g, torch.cat, [out, c], -1)
    return _call(g, torch.flatten, out, -2)


@register("ConvolutionComponent")
def _convolution(g, name, comp, pre, x, rows_out):
    """Kaldi's (older) ConvolutionComponent: the patch columns gathered, then one
    linear map per patch."""
    column_map, _ = comp._patch_map()  # noqa: SLF001
    patches = _call(g, torch.index_select, x, -1, g.const(column_map, hint="patch"))
    patches = _call(g, torch.unflatten, patches, -1, (-1, comp.filter_dim))
    w = g.param(name, "filter_params", comp.filter_params)
    b = g.param(name, "bias_params", comp.bias_params)
    return _call(g, torch.flatten, _call(g, F.linear, patches, w, b), -2)


@register("MaxpoolingComponent")
def _maxpooling(g, name, comp, pre, x, rows_out):
    column_map, _ = comp._patch_map()  # noqa: SLF001
    patches = _call(g, torch.index_select, x, -1, g.const(column_map, hint="pool"))
    patches = _call(g, torch.unflatten, patches, -1, (comp.pool_size, -1))
    return _call(g, torch.clamp_min, _call(g, torch.amax, patches, -2), -1e20)
