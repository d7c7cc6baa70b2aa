"""The fused nonlinearity blocks of recurrent layers: LSTM, GRU and output-gated GRU.

Each of these is the element-wise part of one recurrent step, fused into one
simple component (the matrix products live in the affine components around it):

* :class:`LstmNonlinearityComponent`: (i, f, c, o parts, c_{t-1}) -> (c_t, m_t),
  with diagonal "peephole" parameters w_ic, w_fc, w_oc.
* :class:`GruNonlinearityComponent`: (z_t, r_t, hpart_t, c_{t-1}, s_{t-1}) -> (h_t, c_t),
  parameter W^h [cell-dim, recurrent-dim].
* :class:`OutputGruNonlinearityComponent`: (z_t, hpart_t, c_{t-1}) -> (h_t, c_t),
  parameter w_h [cell-dim] (element-wise).

All three keep value/derivative statistics of their nonlinearities for
self-repair. On disk these are count-normalized averages; we keep the averages
exactly as read (so writing reproduces the file) and derive sums when needed.

Self-repair, as Kaldi does it:

* LSTM: always evaluated in backprop from the component's own stats, with
  count = 1 + count, so with zero stats (average 0 < threshold) it is ACTIVE: the
  gate pre-activation derivatives get ``-scale * (2 * sigmoid - 1)`` and the tanh
  inputs ``-scale * tanh``; these terms also flow into the peephole gradient.
* GRU / output-GRU: Kaldi repairs only in a random half of the minibatches and
  from the statistics accumulated into the gradient copy. That is neither
  deterministic nor visible with zero statistics, so it is not reproduced here
  (backprop is the plain derivative).

Kaldi accumulates the nonlinearity statistics of these components during backprop
into the component being updated; our backprop leaves the model untouched.
"""

from __future__ import annotations

import math

import numpy as np

from . import c_kernels
from .base import Flags, UpdatableComponent, register, require
from .fields import UPDATABLE_HEADER, Custom, Field, pair
from .preconditioning import (
    backprop_stats,
    precondition_matrix,
    precondition_product,
    precondition_rows,
    preconditioners,
)
from .xp import namespace


def _scaled(x, scale):
    """``x * scale``; ``x`` itself for a None scale (no dropout mask: saves one
    elementwise pass, and multiplying by 1 was exact anyway)."""
    return x if scale is None else x * scale


def _sigmoid_inplace(x: np.ndarray) -> None:
    """``x = 0.5 * tanh(0.5 * x) + 0.5`` in place (xp.sigmoid's floats)."""
    x *= 0.5
    np.tanh(x, out=x)
    x *= 0.5
    x += 0.5


def lstm_buffers(rows: int, c: int, dtype) -> tuple:
    """Work buffers of :func:`_lstm_forward_numpy` for ``rows`` rows of ``c`` cells."""
    return (np.empty((5, rows, c), dtype), np.empty((2, rows, c), dtype),
            np.empty((2, rows, c), dtype), np.empty((rows, c), dtype),
            np.empty((rows, c), dtype))


def _lstm_forward_numpy(x: np.ndarray, params: np.ndarray, c: int, out: np.ndarray,
                        buffers: tuple | None = None) -> None:
    """LstmNonlinearity's forward without dropout masks, NumPy, with the same float
    operations per element as the general form (so the same bits), in fewer and
    faster passes. The five column blocks of ``x`` are copied once into one
    contiguous [5, rows, C] buffer and ``c_t``, ``m_t`` made in a [2, rows, C] one,
    copied into ``out`` at the end: a pass over a column block of a wider matrix
    runs NumPy's inner loop once per row (~10-20 ns each, as much as the arithmetic
    of a 128-cell row), a pass over a contiguous block once. The input and forget
    gates are one [2, rows, C] block. ``buffers``: :func:`lstm_buffers` (made here
    when None)."""
    rows = x.shape[0]
    w = params if params.dtype == x.dtype else params.astype(x.dtype)
    parts, gates, result, o_t, t = buffers or lstm_buffers(rows, c, x.dtype)
    np.copyto(parts, x[:, :5 * c].reshape(rows, 5, c).transpose(1, 0, 2))
    c_part, o_part, c_prev = parts[2], parts[3], parts[4]
    np.multiply(w[0:2, None, :], c_prev[None], out=gates)  # w[k] * c_prev
    np.add(gates, parts[0:2], out=gates)  # + the gates' parts (i, f)
    _sigmoid_inplace(gates)
    c_t, m_t = result
    np.multiply(gates[1], c_prev, out=c_t)  # f_t * c_prev
    np.tanh(c_part, out=t)
    np.multiply(t, gates[0], out=t)  # i_t * tanh(c_part)
    np.add(c_t, t, out=c_t)
    np.multiply(w[2], c_t, out=o_t)
    np.add(o_t, o_part, out=o_t)
    _sigmoid_inplace(o_t)
    np.tanh(c_t, out=m_t)
    np.multiply(m_t, o_t, out=m_t)
    if out.strides[1] == out.itemsize:  # (then the reshape is a view of out)
        np.copyto(out.reshape(rows, 2, c), result.transpose(1, 0, 2))
    else:
        out[:, :c] = c_t
        out[:, c:] = m_t


def _shape(what: str, *dims):
    """Field check: the array has shape ``dims`` (ints, or functions of the component)."""
    def check(tag: str, value: np.ndarray, comp) -> str | None:
        want = tuple(d(comp) if callable(d) else d for d in dims)
        return None if value.shape == want else f"{tag} must be {what}"
    return check


def _cell_dim(comp) -> int:
    return comp.cell_dim


def _param(tag: str, attr: str, kind: str, check) -> Field:
    """A parameter or statistics array: NaN/inf refused, shape checked."""
    return Field(tag, attr, kind, finite=tag, check=check)


def _new_updatable(cls):
    obj = cls.__new__(cls)
    UpdatableComponent.__init__(obj)
    return obj


def _require_shape(r, cond: bool, message: str, pos: int) -> None:
    if not cond:
        raise r.error(message, pos=pos)


# ---------------------------------------------------------------------------------
@register
class LstmNonlinearityComponent(UpdatableComponent):
    """The sigmoid/tanh part of an LSTM step, with diagonal peephole weights.

    Input (5C [+3 dropout-mask columns]): i_part, f_part, c_part, o_part, c_{t-1}.
    Output (2C): c_t, m_t, where::

        i_t = sigmoid(i_part + w_ic * c_{t-1})
        f_t = sigmoid(f_part + w_fc * c_{t-1})
        c_t = f_t * f_scale * c_{t-1} + i_t * i_scale * tanh(c_part)
        o_t = sigmoid(o_part + w_oc * c_t)
        m_t = o_t * o_scale * tanh(c_t)

    (the scales are the 3 mask columns with use-dropout, else 1).
    Invariant: ``params`` is [3, C]; ``value_avg``/``deriv_avg`` are [5, C] (rows:
    i_t, f_t, tanh(c_part), o_t, tanh(c_t)); ``self_repair_config`` has 10 entries
    (5 thresholds then 5 scales); ``self_repair_prob`` has 5.
    """

    type_name = "LstmNonlinearityComponent"

    def __init__(self, cell_dim: int = 1, use_dropout: bool = False):
        super().__init__()
        self.use_dropout = use_dropout
        self.params_ = np.zeros((3, cell_dim), dtype=np.float32)
        self.value_avg = np.zeros((5, cell_dim), dtype=np.float32)
        self.deriv_avg = np.zeros((5, cell_dim), dtype=np.float32)
        self.self_repair_config = np.zeros(10, dtype=np.float32)
        self.self_repair_prob = np.zeros(5, dtype=np.float32)
        self.count = 0.0

    # -- structure ---------------------------------------------------------------
    @property
    def cell_dim(self) -> int:
        return self.params_.shape[1]

    @property
    def input_dim(self) -> int:
        return 5 * self.cell_dim + (3 if self.use_dropout else 0)

    @property
    def output_dim(self) -> int:
        return 2 * self.cell_dim

    def properties(self) -> Flags:
        return Flags.SIMPLE | Flags.UPDATABLE | Flags.BACKPROP_NEEDS_INPUT

    def info(self) -> str:
        return (super().info() + self.updatable_info()
                + f", cell-dim={self.cell_dim}, use-dropout={str(self.use_dropout).lower()}")

    # -- construction ------------------------------------------------------------------
    @classmethod
    def from_config(cls, cfg, rng: np.random.Generator) -> LstmNonlinearityComponent:
        cell_dim = cfg.get_int("cell-dim", required=True)
        param_stddev = cfg.get_float("param-stddev", 1.0)
        tanh_thr = cfg.get_float("tanh-self-repair-threshold", 0.2)
        sigmoid_thr = cfg.get_float("sigmoid-self-repair-threshold", 0.05)
        scale = cfg.get_float("self-repair-scale", 1.0e-05)
        use_dropout = cfg.get_bool("use-dropout", False)
        comp = cls(max(cell_dim, 1), use_dropout)
        comp.init_updatable_from_config(cfg)
        cfg.check_all_used()
        require(cell_dim > 0, cfg, "cell-dim must be > 0")
        require(param_stddev >= 0.0, cfg, "param-stddev must be >= 0")
        require(0.0 <= tanh_thr <= 1.0, cfg, "tanh-self-repair-threshold must be in [0, 1]")
        require(0.0 <= sigmoid_thr <= 0.25, cfg,
                "sigmoid-self-repair-threshold must be in [0, 0.25]")
        require(0.0 <= scale <= 0.1, cfg, "self-repair-scale must be in [0, 0.1]")
        comp.params_ = (param_stddev * rng.standard_normal((3, cell_dim))).astype(np.float32)
        # thresholds: sigmoid for i, f, o; tanh for c_part and c_t.
        comp.self_repair_config = np.array(
            [sigmoid_thr, sigmoid_thr, tanh_thr, sigmoid_thr, tanh_thr] + [scale] * 5,
            dtype=np.float32)
        return comp

    kaldi_fields = (
        UPDATABLE_HEADER,
        _param("<Params>", "params_", "matrix",
               lambda tag, p, c: None if p.shape[0] == 3 and p.shape[1] > 0
               else f"{tag} must have 3 rows"),
        _param("<ValueAvg>", "value_avg", "matrix", _shape("5 x cell-dim", 5, _cell_dim)),
        _param("<DerivAvg>", "deriv_avg", "matrix", _shape("5 x cell-dim", 5, _cell_dim)),
        _param("<SelfRepairConfig>", "self_repair_config", "vector",
               _shape("have 10 values", 10)),
        _param("<SelfRepairProb>", "self_repair_prob", "vector", _shape("have 5 values", 5)),
        # written only when true, like Kaldi
        Field("<UseDropout>", "use_dropout", "bool", default=False,
              write_if=lambda c: c.use_dropout),
        Field("<Count>", "count", "double"),
    )

    @classmethod
    def empty_for_read(cls) -> LstmNonlinearityComponent:
        return _new_updatable(cls)

    # -- parameters ------------------------------------------------------------------
    def params(self) -> dict[str, np.ndarray]:
        return {"params": self.params_}

    def export_gradient(self, grad: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"params_vectorized": grad["params"].reshape(-1)}  # (the backend's array)

    def zero_stats(self) -> None:
        self.value_avg[:] = 0
        self.deriv_avg[:] = 0
        self.self_repair_prob[:] = 0
        self.count = 0.0

    # -- math ------------------------------------------------------------------------
    def _split(self, x: np.ndarray):
        c = self.cell_dim
        parts = [x[:, k * c:(k + 1) * c] for k in range(5)]
        if self.use_dropout:
            scales = [x[:, 5 * c + k:5 * c + k + 1] for k in range(3)]
        else:
            scales = [None, None, None]  # (no mask: unscaled, see _scaled)
        return parts, scales

    def propagate(self, indexes, in_value, out_value):
        c = self.cell_dim
        if (not self.use_dropout and type(in_value) is np.ndarray
                and type(out_value) is np.ndarray and in_value.dtype == out_value.dtype
                and not np.may_share_memory(in_value, out_value)):
            if not c_kernels.lstm_forward(in_value, self.params_, c, out_value):
                _lstm_forward_numpy(in_value, self.params_, c, out_value)
            return None
        xp = namespace(in_value)
        w = xp.param(self.params_, like=in_value)
        (i_part, f_part, c_part, o_part, c_prev), (i_s, f_s, o_s) = self._split(in_value)
        i_t = xp.sigmoid(i_part + w[0] * c_prev)
        f_t = xp.sigmoid(f_part + w[1] * c_prev)
        c_t = _scaled(f_t, f_s) * c_prev + _scaled(i_t, i_s) * xp.tanh(c_part)
        o_t = xp.sigmoid(o_part + w[2] * c_t)
        m_t = _scaled(o_t, o_s) * xp.tanh(c_t)
        out_value[:, :c] = c_t
        out_value[:, c:] = m_t
        return None

    def _self_repair_scales(self, like):
        """[5, C] extra-term scales: the configured scale where the average
        derivative (sum / (1 + count), as Kaldi computes it) is below threshold;
        in ``like``'s dtype and device.

        Computed on the host from the statistics; the array handed to ``xp.param``
        is kept while its values stay the same, so a device keeps one copy of it
        (no upload, hence no wait for the device, per backprop)."""
        count = np.float32(1.0 + self.count)
        deriv_sum = self.deriv_avg.astype(np.float64) * self.count
        thr = self.self_repair_config[:5].astype(np.float64)[:, None]
        active = deriv_sum / np.float64(count) < thr
        scales = self.self_repair_config[5:].astype(np.float64)[:, None]
        sr = np.where(active, scales, 0.0)
        kept = self.__dict__.get("_sr_host")
        if kept is None or kept.shape != sr.shape or not np.array_equal(kept, sr):
            kept = self.__dict__["_sr_host"] = sr
        return namespace(like).param(kept, like=like)

    def _accumulate_stats(self, stats: dict, xp, values) -> None:
        """What Kaldi's BackpropLstmNonlinearity adds to the updated component:
        per cell, sums of i_t, f_t, tanh(c_part), o_t, tanh(c_t) and of their
        derivatives, the rows where self-repair was active, and the row count."""
        i_t, f_t, tanh_c_part, o_t, tanh_c_t = values
        rows = i_t.shape[0]
        sums = xp.stack([xp.sum(v, axis=0) for v in values])
        derivs = xp.stack([xp.sum(i_t * (1 - i_t), axis=0), xp.sum(f_t * (1 - f_t), axis=0),
                           xp.sum(1 - tanh_c_part * tanh_c_part, axis=0),
                           xp.sum(o_t * (1 - o_t), axis=0),
                           xp.sum(1 - tanh_c_t * tanh_c_t, axis=0)])
        count = np.float32(1.0 + self.count)
        active = (self.deriv_avg.astype(np.float64) * self.count / np.float64(count)
                  < self.self_repair_config[:5].astype(np.float64)[:, None])
        shape = (5, self.cell_dim)
        for key, value in (("value_sum", sums), ("deriv_sum", derivs)):
            stats.setdefault(key, np.zeros(shape))
            stats[key] += xp.to_numpy(value).astype(np.float64)
        stats.setdefault("self_repair_total", np.zeros(5))
        stats["self_repair_total"] += rows * active.sum(axis=1)
        stats["count"] = stats.get("count", 0.0) + rows

    def backprop(self, indexes, in_value, out_value, out_deriv, memo, grad, in_deriv) -> None:
        c = self.cell_dim
        xp = namespace(in_value)
        w = xp.param(self.params_, like=in_value)
        (i_part, f_part, c_part, o_part, c_prev), (i_s, f_s, o_s) = self._split(in_value)
        sr = self._self_repair_scales(in_value)  # rows: i_t, f_t, c_part, o_t, c_t
        i_t = xp.sigmoid(i_part + w[0] * c_prev)
        f_t = xp.sigmoid(f_part + w[1] * c_prev)
        tanh_c_part = xp.tanh(c_part)
        c_t = _scaled(f_t, f_s) * c_prev + _scaled(i_t, i_s) * tanh_c_part
        o_t = xp.sigmoid(o_part + w[2] * c_t)
        tanh_c_t = xp.tanh(c_t)

        dc_t_out = out_deriv[:, :c]
        dm_t = out_deriv[:, c:]
        dtanh_c_t = _scaled(o_t, o_s) * dm_t
        do_t = _scaled(tanh_c_t, o_s) * dm_t
        do_t_input = o_t * (1 - o_t) * do_t - (2 * o_t - 1) * sr[3]
        dc_t = ((1 - tanh_c_t * tanh_c_t) * dtanh_c_t + dc_t_out + do_t_input * w[2]
                - tanh_c_t * sr[4])
        dtanh_c_part = _scaled(i_t, i_s) * dc_t
        df_t = _scaled(dc_t, f_s) * c_prev
        df_t_input = df_t * f_t * (1 - f_t) - (2 * f_t - 1) * sr[1]
        di_t = _scaled(dc_t, i_s) * tanh_c_part
        di_t_input = di_t * i_t * (1 - i_t) - (2 * i_t - 1) * sr[0]

        if grad is not None and preconditioners(grad) is not None:
            # a trainer's natural gradient: Kaldi preconditions the 3 x C derivative
            precondition_matrix(grad, "params", xp.stack([
                xp.sum(c_prev * di_t_input, axis=0), xp.sum(c_prev * df_t_input, axis=0),
                xp.sum(c_t * do_t_input, axis=0)]), "params")
        elif grad is not None:
            g = grad["params"]
            g[0] += xp.astype(xp.sum(c_prev * di_t_input, axis=0), g.dtype)
            g[1] += xp.astype(xp.sum(c_prev * df_t_input, axis=0), g.dtype)
            g[2] += xp.astype(xp.sum(c_t * do_t_input, axis=0), g.dtype)
        stats = backprop_stats(grad)
        if stats is not None:  # a trainer's target: Kaldi accumulates these into it
            self._accumulate_stats(stats, xp, (i_t, f_t, tanh_c_part, o_t, tanh_c_t))

        if in_deriv is not None:
            dc_prev = w[0] * di_t_input + w[1] * df_t_input + _scaled(f_t, f_s) * dc_t
            dc_part = (1 - tanh_c_part * tanh_c_part) * dtanh_c_part - tanh_c_part * sr[2]
            in_deriv[:, 0:c] = di_t_input
            in_deriv[:, c:2 * c] = df_t_input
            in_deriv[:, 2 * c:3 * c] = dc_part
            in_deriv[:, 3 * c:4 * c] = do_t_input
            in_deriv[:, 4 * c:5 * c] = dc_prev
            if self.use_dropout:
                # Kaldi leaves the mask columns' derivative alone; masks are
                # constants, so zero is the right value.
                in_deriv[:, 5 * c:] = 0


# ---------------------------------------------------------------------------------
class _GruStatsMixin:
    """What the two GRU components share: the parameter ``w_h`` (its first dim is
    the cell dim; the output is ``(h_t, c_t)``, 2 cell dims), the flags, the
    output ``c_t = (1 - z_t) * h_t + z_t * c_{t-1}`` and its derivative, and the
    file layout: the dims before ``<w_h>`` (``<CellDim>``, and ``<RecurrentDim>``
    where ``has_recurrent_dim``) and the statistics and self-repair fields after
    it (``<ValueAvg> <DerivAvg> <SelfRepairTotal> <Count> <SelfRepairThreshold>
    <SelfRepairScale> <Alpha>``)."""

    def _init_stats(self, cell_dim: int) -> None:
        """Zero statistics and the default self-repair options."""
        self.value_avg = np.zeros(cell_dim, dtype=np.float32)
        self.deriv_avg = np.zeros(cell_dim, dtype=np.float32)
        self.self_repair_total = 0.0
        self.count = 0.0
        self.self_repair_threshold = 0.2
        self.self_repair_scale = 1.0e-05
        self.alpha = 4.0

    @property
    def cell_dim(self) -> int:
        return self.w_h.shape[0]

    @property
    def output_dim(self) -> int:
        return 2 * self.cell_dim

    def properties(self) -> Flags:
        return (Flags.SIMPLE | Flags.UPDATABLE | Flags.BACKPROP_NEEDS_INPUT
                | Flags.BACKPROP_NEEDS_OUTPUT | Flags.BACKPROP_ADDS)

    def params(self) -> dict[str, np.ndarray]:
        return {"w_h": self.w_h}

    def export_gradient(self, grad: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"params_vectorized": grad["w_h"].reshape(-1)}  # (the backend's array)

    @staticmethod
    def _write_h_c(out_value, c: int, h_t, z_t, c_t1) -> None:
        """The output ``(h_t, c_t)``, ``c_t = h_t - z_t * h_t + z_t * c_{t-1}``."""
        out_value[:, :c] = h_t
        out_value[:, c:] = h_t - z_t * h_t + z_t * c_t1

    @staticmethod
    def _output_derivs(out_value, out_deriv, c: int, z_t):
        """``(h_t, dc_t, dh_t)``: h_t (read from the output), c_t's output derivative
        and h_t's total derivative: its own output derivative (normally zero;
        included anyway) plus ``(1 - z_t) * dc_t``."""
        c_t_deriv = out_deriv[:, c:]
        return out_value[:, :c], c_t_deriv, out_deriv[:, :c] + c_t_deriv - c_t_deriv * z_t

    _STATS_FIELDS = (
        _param("<ValueAvg>", "value_avg", "vector", _shape("have cell-dim values", _cell_dim)),
        _param("<DerivAvg>", "deriv_avg", "vector", _shape("have cell-dim values", _cell_dim)),
        Field("<SelfRepairTotal>", "self_repair_total", "double"),
        Field("<Count>", "count", "double"),
        Field("<SelfRepairThreshold>", "self_repair_threshold", "float"),
        Field("<SelfRepairScale>", "self_repair_scale", "float"),
        Field("<Alpha>", "alpha", "float"),
    )

    @classmethod
    def empty_for_read(cls):
        return _new_updatable(cls)

    def _read_dims(self, r) -> None:
        """<CellDim> [<RecurrentDim>]: kept until <w_h> (which they describe) is read."""
        pos = r.pos
        cell_dim = r.read_tagged("<CellDim>", "int")
        if self.has_recurrent_dim:
            recurrent_dim = r.read_tagged("<RecurrentDim>", "int")
            _require_shape(r, 0 < recurrent_dim <= cell_dim,
                           "need 0 < <RecurrentDim> <= <CellDim>", pos)
            self._file_w_h_shape = (cell_dim, recurrent_dim)
        else:
            _require_shape(r, cell_dim > 0, "<CellDim> must be > 0", pos)
            self._file_w_h_shape = (cell_dim,)

    def _write_dims(self, w) -> None:
        w.write_tagged("<CellDim>", "int", self.cell_dim)
        if self.has_recurrent_dim:
            w.write_tagged("<RecurrentDim>", "int", self.recurrent_dim)

    @staticmethod
    def _w_h_matches_dims(tag: str, w_h: np.ndarray, comp) -> str | None:
        if w_h.shape == comp.__dict__.pop("_file_w_h_shape"):
            return None
        return f"{tag} must be " + ("cell-dim x recurrent-dim" if comp.has_recurrent_dim
                                    else "have cell-dim values")

    def zero_stats(self) -> None:
        self.value_avg[:] = 0
        self.deriv_avg[:] = 0
        self.self_repair_total = 0.0
        self.count = 0.0


@register
class GruNonlinearityComponent(_GruStatsMixin, UpdatableComponent):
    """The nonlinear part of a (projected) GRU step.

    Input: z_t [C], r_t [R], hpart_t [C], c_{t-1} [C], s_{t-1} [R]; when R == C
    (plain GRU) c_{t-1} and s_{t-1} are the same C columns, so the input is 4C.
    Output: h_t = tanh(hpart_t + W^h (s_{t-1} * r_t)) and
    c_t = (1 - z_t) * h_t + z_t * c_{t-1}. ``w_h`` is [C, R].
    h_t is an output only so backprop can use it (BACKPROP_NEEDS_OUTPUT).
    """

    type_name = "GruNonlinearityComponent"

    def __init__(self, cell_dim: int = 1, recurrent_dim: int | None = None):
        super().__init__()
        r = cell_dim if recurrent_dim is None else recurrent_dim
        self.w_h = np.zeros((cell_dim, r), dtype=np.float32)
        self._init_stats(cell_dim)
        self.rank_in = 20
        self.rank_out = 80
        self.update_period = 4

    @property
    def recurrent_dim(self) -> int:
        return self.w_h.shape[1]

    @property
    def input_dim(self) -> int:
        c, r = self.cell_dim, self.recurrent_dim
        return 4 * c if r == c else 3 * c + 2 * r

    def info(self) -> str:
        return (super().info() + self.updatable_info()
                + f", cell-dim={self.cell_dim}, recurrent-dim={self.recurrent_dim}")

    @classmethod
    def from_config(cls, cfg, rng: np.random.Generator) -> GruNonlinearityComponent:
        cell_dim = cfg.get_int("cell-dim", required=True)
        require(cell_dim > 0, cfg, "cell-dim > 0 is required")
        recurrent_dim = cfg.get_int("recurrent-dim", -1)
        thr = cfg.get_float("self-repair-threshold", 0.2)
        scale = cfg.get_float("self-repair-scale", 1.0e-05)
        param_stddev = cfg.get_float("param-stddev", 1.0 / math.sqrt(cell_dim))
        alpha = cfg.get_float("alpha", 4.0)
        rank_in = cfg.get_int("rank-in", 20)
        rank_out = cfg.get_int("rank-out", 80)
        update_period = cfg.get_int("update-period", 4)
        if recurrent_dim < 0:
            recurrent_dim = cell_dim
        require(0 < recurrent_dim <= cell_dim, cfg,
                "invalid recurrent-dim: need 0 < recurrent-dim <= cell-dim")
        require(thr >= 0.0 and scale >= 0.0, cfg,
                "self-repair-threshold and self-repair-scale must be >= 0")
        comp = cls(cell_dim, recurrent_dim)
        comp.init_updatable_from_config(cfg)
        cfg.check_all_used()
        comp.w_h = (param_stddev * rng.standard_normal((cell_dim, recurrent_dim))
                    ).astype(np.float32)
        comp.self_repair_threshold, comp.self_repair_scale = thr, scale
        comp.alpha, comp.rank_in, comp.rank_out = alpha, rank_in, rank_out
        comp.update_period = update_period
        return comp

    has_recurrent_dim = True
    kaldi_fields = (
        UPDATABLE_HEADER,
        Custom("_read_dims", "_write_dims"),
        _param("<w_h>", "w_h", "matrix", _GruStatsMixin._w_h_matches_dims),
        *_GruStatsMixin._STATS_FIELDS,
        *pair("<RankInOut>", "rank", "int"),
        Field("<UpdatePeriod>", "update_period", "int"),
    )

    def _split(self, x: np.ndarray):
        c, r = self.cell_dim, self.recurrent_dim
        z_t = x[:, :c]
        r_t = x[:, c:c + r]
        hpart_t = x[:, c + r:2 * c + r]
        c_t1 = x[:, 2 * c + r:3 * c + r]
        s_t1 = x[:, x.shape[1] - r:]  # same columns as c_t1 when r == c
        return z_t, r_t, hpart_t, c_t1, s_t1

    def propagate(self, indexes, in_value, out_value):
        c = self.cell_dim
        xp = namespace(in_value)
        w_h = xp.param(self.w_h, like=in_value)
        z_t, r_t, hpart_t, c_t1, s_t1 = self._split(in_value)
        self._write_h_c(out_value, c, xp.tanh(hpart_t + (r_t * s_t1) @ w_h.T), z_t, c_t1)
        return None

    def backprop(self, indexes, in_value, out_value, out_deriv, memo, grad, in_deriv) -> None:
        c = self.cell_dim
        xp = namespace(in_value)
        w_h = xp.param(self.w_h, like=in_value)
        z_t, r_t, hpart_t, c_t1, s_t1 = self._split(in_value)
        h_t, c_t_deriv, h_t_deriv = self._output_derivs(out_value, out_deriv, c, z_t)
        if in_deriv is not None:
            z_d, r_d, hpart_d, c_t1_d, s_t1_d = self._split(in_deriv)
            z_d += c_t_deriv * c_t1 - c_t_deriv * h_t
            c_t1_d += c_t_deriv * z_t
        h_t_deriv = h_t_deriv * (1 - h_t * h_t)  # derivative w.r.t. the tanh input
        if grad is not None and not precondition_product(grad, "w_h", None, r_t * s_t1,
                                                         h_t_deriv):  # (a trainer's NG)
            g = grad["w_h"]
            g += xp.astype(h_t_deriv.T @ (r_t * s_t1), g.dtype)
        if in_deriv is not None:
            hpart_d += h_t_deriv
            sdotr_deriv = h_t_deriv @ w_h
            r_d += sdotr_deriv * s_t1
            # for a plain GRU s_t1_d is c_t1_d again: both terms add up there.
            s_t1_d += sdotr_deriv * r_t


@register
class OutputGruNonlinearityComponent(_GruStatsMixin, UpdatableComponent):
    """The nonlinear part of an output-gated GRU step.

    Input: z_t, hpart_t, c_{t-1} (each C). Output: h_t = tanh(hpart_t + w_h * c_{t-1})
    (element-wise w_h [C]) and c_t = (1 - z_t) * h_t + z_t * c_{t-1}.
    """

    type_name = "OutputGruNonlinearityComponent"

    def __init__(self, cell_dim: int = 1):
        super().__init__()
        self.w_h = np.zeros(cell_dim, dtype=np.float32)
        self._init_stats(cell_dim)
        self.rank = 8
        self.update_period = 10

    @property
    def input_dim(self) -> int:
        return 3 * self.cell_dim

    def info(self) -> str:
        return super().info() + self.updatable_info() + f", cell-dim={self.cell_dim}"

    @classmethod
    def from_config(cls, cfg, rng: np.random.Generator) -> OutputGruNonlinearityComponent:
        cell_dim = cfg.get_int("cell-dim", required=True)
        require(cell_dim > 0, cfg, "cell-dim > 0 is required")
        thr = cfg.get_float("self-repair-threshold", 0.2)
        scale = cfg.get_float("self-repair-scale", 1.0e-05)
        param_mean = cfg.get_float("param-mean", 0.0)
        param_stddev = cfg.get_float("param-stddev", 1.0)
        alpha = cfg.get_float("alpha", 4.0)
        rank = cfg.get_int("rank", 8)
        update_period = cfg.get_int("update-period", 10)
        require(thr >= 0.0 and scale >= 0.0, cfg,
                "self-repair-threshold and self-repair-scale must be >= 0")
        comp = cls(cell_dim)
        comp.init_updatable_from_config(cfg)
        cfg.check_all_used()
        comp.w_h = (param_stddev * rng.standard_normal(cell_dim) + param_mean).astype(np.float32)
        comp.self_repair_threshold, comp.self_repair_scale = thr, scale
        comp.alpha, comp.rank, comp.update_period = alpha, rank, update_period
        return comp

    has_recurrent_dim = False
    kaldi_fields = (
        UPDATABLE_HEADER,
        Custom("_read_dims", "_write_dims"),
        _param("<w_h>", "w_h", "vector", _GruStatsMixin._w_h_matches_dims),
        *_GruStatsMixin._STATS_FIELDS,
        Field("<Rank>", "rank", "int"),
        Field("<UpdatePeriod>", "update_period", "int"),
    )

    def propagate(self, indexes, in_value, out_value):
        c = self.cell_dim
        xp = namespace(in_value)
        w_h = xp.param(self.w_h, like=in_value)
        z_t, hpart_t, c_t1 = in_value[:, :c], in_value[:, c:2 * c], in_value[:, 2 * c:]
        self._write_h_c(out_value, c, xp.tanh(c_t1 * w_h + hpart_t), z_t, c_t1)
        return None

    def backprop(self, indexes, in_value, out_value, out_deriv, memo, grad, in_deriv) -> None:
        c = self.cell_dim
        xp = namespace(in_value)
        w_h = xp.param(self.w_h, like=in_value)
        z_t, c_t1 = in_value[:, :c], in_value[:, 2 * c:]
        h_t, c_t_deriv, h_t_deriv = self._output_derivs(out_value, out_deriv, c, z_t)
        if in_deriv is not None:
            in_deriv[:, :c] += c_t_deriv * c_t1 - c_t_deriv * h_t
            in_deriv[:, 2 * c:] += c_t_deriv * z_t
        h_t_deriv = h_t_deriv * (1 - h_t * h_t)
        if grad is not None and preconditioners(grad) is not None:  # a trainer's NG
            precondition_rows(grad, "w_h", h_t_deriv * c_t1)
        elif grad is not None:
            g = grad["w_h"]
            g += xp.astype(xp.sum(h_t_deriv * c_t1, axis=0), g.dtype)
        if in_deriv is not None:
            in_deriv[:, c:2 * c] += h_t_deriv
            in_deriv[:, 2 * c:] += h_t_deriv * w_h
