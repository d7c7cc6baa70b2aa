"""Element-wise and per-row nonlinearities: Sigmoid, Tanh, RectifiedLinear, Softmax,
LogSoftmax (Kaldi's ``NonlinearComponent`` family), plus Normalize and Pnorm.

The ``NonlinearComponent`` family keeps activation statistics next to the math:

* ``value_sum`` / ``deriv_sum`` (float64, per dimension) with ``count``: sums of the
  output and of the nonlinearity's derivative over stored frames (``store_stats``);
* ``oderiv_sumsq`` with ``oderiv_count``: sum of squared output derivatives (stored
  during a training backprop);
* ``num_dims_self_repaired`` / ``num_dims_processed``: self-repair diagnostics.

Files hold the count-normalized averages (``<ValueAvg>``, ``<DerivAvg>``,
``<OderivRms>``); reading multiplies by the count again, writing divides, with
Kaldi's exact float/double conversions, so text -> memory -> text gives Kaldi's
bytes back.

Self-repair (Sigmoid, Tanh, RectifiedLinear) adds a small term to the input
derivative of dimensions whose average derivative is out of range. It needs stats
(``count > 0``), a nonzero ``self_repair_scale`` and a training backprop. Kaldi runs
it only when the backprop has a component "to update"; here that is signalled by
``grad is not None`` (then the component's own stats counters are updated, as Kaldi
does when the stats go to the model itself). Kaldi applies it at random on about
half of the minibatches and stores stats on about half (backprop stats: 3/4) of
them; with ``rng`` (a ``numpy.random.Generator``) set we do the same (the trainer
sets it for its steps: ``TrainerOptions.random_stats``), with ``rng = None``
(default) the repair and the stats storage always happen, which is deterministic
and is exactly Kaldi's math on the minibatches where it repairs.
"""

from __future__ import annotations

import numpy as np

from ..errors import ComputeError
from . import c_kernels, device_stats, np_kernels
from .base import (
    REDUCING_DIMS,
    Component,
    Flags,
    InOutComponent,
    SameDimComponent,
    register,
    require,
)
from .device_stats import stats_attribute
from .fields import Custom, Field, positive
from .xp import namespace

UNSET_THRESHOLD = -1000.0  # Kaldi's kUnsetThreshold
_REPAIR_PROBABILITY = 0.5


def f32(x: float) -> float:
    """The value a C++ ``BaseFloat`` (float32) holds, as a Python float."""
    return float(np.float32(x))


def read_double_vector(r) -> np.ndarray:
    """Read a Kaldi vector into float64, as ``Vector<double>::Read`` does.

    Text numbers are parsed as doubles (not rounded to float32 first), which matters
    for the count-normalized stats: Kaldi multiplies them by the count in double.
    """
    if r.binary:
        return r.read_vector().astype(np.float64)
    body, start = r._bracketed("vector")  # noqa: SLF001 - float64 parse of the body
    words = body.split()
    try:
        return np.array(words, dtype=np.float64)
    except ValueError:
        bad = next(w for w in words if not _is_number(w))
        raise r.error("bad number in vector", token=bad.decode(errors="replace"),
                      pos=start) from None


def _is_number(word: bytes) -> bool:
    try:
        float(word)
        return True
    except ValueError:
        return False


def _block_divides_dim(tag: str, value: int, comp) -> str | None:
    if value > 0 and comp.dim % value == 0:
        return None
    return f"{tag} must be positive and divide the input dim"


def _unset_or(attr: str):
    """write_if for a self-repair threshold: Kaldi writes it only when set."""
    return lambda comp: getattr(comp, attr) != f32(UNSET_THRESHOLD)


def _as_float_dtype(x: np.ndarray) -> np.dtype:
    return x.dtype if x.dtype in (np.float32, np.float64) else np.dtype(np.float32)


# ----------------------------------------------------------------------------------
class NonlinearComponent(SameDimComponent):
    """Kaldi's ``NonlinearComponent``: a simple ``dim -> dim`` nonlinearity with
    activation statistics and self-repair options (see the module docstring).

    Invariants: ``block_dim`` divides ``dim``; the stats vectors are empty or have
    ``dim`` entries; sums are kept unnormalized (count-weighted) in float64.
    Subclasses provide ``_forward`` / ``_diff`` and, where Kaldi has them,
    ``_stats_deriv`` (the derivative stored by ``store_stats``) and ``_repair``.

    On a GPU the sums a run adds stay on the device until read, and self-repair
    reads them there (components/device_stats.py): no command waits for the GPU.
    """

    value_sum = stats_attribute("value_sum")
    deriv_sum = stats_attribute("deriv_sum")
    oderiv_sumsq = stats_attribute("oderiv_sumsq")
    num_dims_self_repaired = stats_attribute("num_dims_self_repaired")

    def __init__(self, dim: int = 0, block_dim: int | None = None,
                 self_repair_lower_threshold: float = UNSET_THRESHOLD,
                 self_repair_upper_threshold: float = UNSET_THRESHOLD,
                 self_repair_scale: float = 0.0) -> None:
        self.dim = int(dim)
        self.block_dim = int(dim if block_dim is None else block_dim)
        self.value_sum = np.zeros(0, dtype=np.float64)
        self.deriv_sum = np.zeros(0, dtype=np.float64)
        self.count = 0.0
        self.oderiv_sumsq = np.zeros(0, dtype=np.float64)
        self.oderiv_count = 0.0
        self.num_dims_self_repaired = 0.0
        self.num_dims_processed = 0.0
        self.self_repair_lower_threshold = f32(self_repair_lower_threshold)
        self.self_repair_upper_threshold = f32(self_repair_upper_threshold)
        self.self_repair_scale = f32(self_repair_scale)
        # None: deterministic (always repair / always store); a Generator: Kaldi's draws.
        self.rng: np.random.Generator | None = None

    # -- structure -----------------------------------------------------------
    def properties(self) -> Flags:
        raise NotImplementedError

    def info(self) -> str:
        s = f"type={self.type_name}, dim={self.dim}"
        if self.block_dim != self.dim:
            s += f", block-dim={self.block_dim}"
        if self.self_repair_lower_threshold != f32(UNSET_THRESHOLD):
            s += f", self-repair-lower-threshold={self.self_repair_lower_threshold:g}"
        if self.self_repair_upper_threshold != f32(UNSET_THRESHOLD):
            s += f", self-repair-upper-threshold={self.self_repair_upper_threshold:g}"
        if self.self_repair_scale != 0.0:
            s += f", self-repair-scale={self.self_repair_scale:g}"
        if self.count > 0 and self.value_sum.size == self.dim:
            s += f", count={self.count:.3g}"
        return s

    # -- construction and files ------------------------------------------------
    @classmethod
    def from_config(cls, cfg, rng: np.random.Generator | None = None) -> NonlinearComponent:
        dim = cfg.get_int("dim", required=True)
        block_dim = cfg.get_int("block-dim", dim)
        lower = cfg.get_float("self-repair-lower-threshold", UNSET_THRESHOLD)
        upper = cfg.get_float("self-repair-upper-threshold", UNSET_THRESHOLD)
        scale = cfg.get_float("self-repair-scale", 0.0)
        cfg.check_all_used()
        require(dim > 0, cfg, f"dim must be positive, got dim={dim}")
        require(block_dim > 0 and dim % block_dim == 0, cfg,
                f"block-dim={block_dim} must be positive and divide dim={dim}")
        return cls(dim, block_dim, lower, upper, scale)

    kaldi_fields = (
        Field("<Dim>", "dim", "int", check=positive),
        Field("<BlockDim>", "block_dim", "int", default=lambda c: c.dim,
              write_if=lambda c: c.block_dim != c.dim, check=_block_divides_dim),
        Custom("_read_stats", "_write_stats"),
        Field("<NumDimsSelfRepaired>", "num_dims_self_repaired", "double", default=0.0),
        Field("<NumDimsProcessed>", "num_dims_processed", "double", default=0.0),
        Field("<SelfRepairLowerThreshold>", "self_repair_lower_threshold", "float",
              default=f32(UNSET_THRESHOLD), convert=f32,
              write_if=_unset_or("self_repair_lower_threshold")),
        Field("<SelfRepairUpperThreshold>", "self_repair_upper_threshold", "float",
              default=f32(UNSET_THRESHOLD), convert=f32,
              write_if=_unset_or("self_repair_upper_threshold")),
        Field("<SelfRepairScale>", "self_repair_scale", "float", default=0.0, convert=f32,
              write_if=lambda c: c.self_repair_scale != 0.0),
    )

    def _read_stats(self, r) -> None:
        """The activation statistics: averages in the file, count-weighted sums here."""
        value_avg = self._read_stats_vector(r, "<ValueAvg>")
        deriv_avg = self._read_stats_vector(r, "<DerivAvg>")
        self.count = r.read_tagged("<Count>", "float")
        oderiv_rms = np.zeros(0, dtype=np.float64)
        self.oderiv_count = 0.0
        if r.peek_token() == "<OderivRms>":
            oderiv_rms = self._read_stats_vector(r, "<OderivRms>")
            self.oderiv_count = r.read_tagged("<OderivCount>", "float")
        # Kaldi keeps sums in memory: average * count, in double.
        self.value_sum = value_avg * self.count
        self.deriv_sum = deriv_avg * self.count
        self.oderiv_sumsq = (oderiv_rms ** 2) * self.oderiv_count

    def _read_stats_vector(self, r, tag: str) -> np.ndarray:
        r.expect_token(tag)
        pos = r.pos
        v = read_double_vector(r)
        if v.size not in (0, self.dim):
            raise r.error(f"{tag} has dimension {v.size}, expected 0 or {self.dim}",
                          pos=pos)
        return v

    def _write_stats(self, w) -> None:
        # Kaldi: Vector<float> temp(sum); temp.Scale(1.0 / count) -- float math.
        w.write_tagged("<ValueAvg>", "vector", _normalized(self.value_sum, self.count))
        w.write_tagged("<DerivAvg>", "vector", _normalized(self.deriv_sum, self.count))
        w.write_tagged("<Count>", "double", self.count)
        rms = np.maximum(_normalized(self.oderiv_sumsq, self.oderiv_count), np.float32(0))
        # std::pow(float, float) computes in double, then rounds to float.
        rms = np.sqrt(rms.astype(np.float64)).astype(np.float32)
        w.write_tagged("<OderivRms>", "vector", rms)
        w.write_tagged("<OderivCount>", "double", self.oderiv_count)

    # -- math --------------------------------------------------------------------
    def _forward(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _diff(self, out_value: np.ndarray, out_deriv: np.ndarray) -> np.ndarray:
        """The plain input derivative (no self-repair)."""
        raise NotImplementedError

    def _stats_deriv(self, out_value: np.ndarray) -> np.ndarray | None:
        """The nonlinearity's derivative as a function of its output, for the stats."""
        return None

    def _repair(self, out_value: np.ndarray, in_deriv: np.ndarray) -> None:
        """Add the self-repair term to ``in_deriv`` (in place); default: none."""

    def propagate(self, indexes, in_value: np.ndarray, out_value: np.ndarray):
        out_value[...] = self._forward(in_value)
        return None

    def backprop(self, indexes, in_value, out_value, out_deriv, memo, grad,
                 in_deriv) -> None:
        if in_deriv is None:
            return
        d = self._diff(out_value, out_deriv)
        if grad is not None:  # Kaldi's "to_update != NULL": training backprop
            self._repair(out_value, d)
            self.store_backprop_stats(out_deriv)
        in_deriv[...] = d

    # -- statistics -------------------------------------------------------------
    def _skip(self, n: int, have: bool) -> bool:
        """Kaldi's ``RandInt(0, n-1) == 0 && have``: skip storing this minibatch."""
        return self.rng is not None and have and int(self.rng.integers(0, n)) == 0

    def store_stats(self, in_value, out_value, memo) -> None:
        """Sigmoid/Tanh/RectifiedLinear: value and derivative sums (Kaldi stores
        them on about every other minibatch, always on the first)."""
        if self._skip(2, self.count != 0):
            return
        self._store_stats_internal(out_value, self._stats_deriv(out_value))

    def _store_stats_internal(self, out_value: np.ndarray, deriv: np.ndarray | None) -> None:
        # (sizes from the stored arrays: pending device sums never change them)
        if self._value_sum.size != self.dim:
            self.value_sum = np.zeros(self.dim, dtype=np.float64)
            self.count = 0.0
        if deriv is not None and self._deriv_sum.size != self.dim:
            self.deriv_sum = np.zeros(self.dim, dtype=np.float64)
            self.count = 0.0
            self.value_sum = np.zeros(self.dim, dtype=np.float64)
        self.count += out_value.shape[0]
        # Kaldi sums the rows in float (CuVector<BaseFloat>), then adds into double.
        xp = namespace(out_value)
        device_stats.add(self, "value_sum", xp.sum(out_value, axis=0, dtype=out_value.dtype))
        if deriv is not None:
            device_stats.add(self, "deriv_sum", xp.sum(deriv, axis=0, dtype=deriv.dtype))

    def store_backprop_stats(self, out_deriv: np.ndarray) -> None:
        """Accumulate the squared output derivative (Kaldi's StoreBackpropStats)."""
        if self._skip(4, self.oderiv_count != 0):
            return
        if self._oderiv_sumsq.size != self.dim:
            self.oderiv_sumsq = np.zeros(self.dim, dtype=np.float64)
            self.oderiv_count = 0.0
        xp = namespace(out_deriv)
        # (einsum: the column sums of squares with no temporary, 2.5x faster)
        device_stats.add(self, "oderiv_sumsq", xp.einsum("ij,ij->j", out_deriv, out_deriv))
        self.oderiv_count += out_deriv.shape[0]

    def zero_stats(self) -> None:
        (self.__dict__.get("_pending_stats") or {}).clear()  # (nothing to fold in)
        self._value_sum[:] = 0.0
        self._deriv_sum[:] = 0.0
        self._oderiv_sumsq[:] = 0.0
        self.count = 0.0
        self.oderiv_count = 0.0
        self.num_dims_self_repaired = 0.0
        self.num_dims_processed = 0.0

    def _repair_draw_fails(self) -> bool:
        """Kaldi's ``RandUniform() > repair_probability`` (never, when deterministic)."""
        return self.rng is not None and float(self.rng.random()) > _REPAIR_PROBABILITY

    def _problem_dims(self, default_lower: float, like):
        """Sigmoid/Tanh self-repair: 1.0 for dimensions whose deriv-sum is below
        the lower threshold times the count (float32, like Kaldi), as an array of
        ``like``'s kind, or None when no repair happens this time. Also updates the
        repair diagnostics."""
        self.num_dims_processed += self.dim
        if (self.self_repair_scale == 0.0 or self.count == 0.0
                or self._deriv_sum.size != self.dim or self._repair_draw_fails()):
            return None
        if self.self_repair_upper_threshold != f32(UNSET_THRESHOLD):
            raise ComputeError(f"{self.type_name}: do not set self-repair-upper-threshold "
                               "for sigmoid/tanh components, it does nothing")
        lower = self.self_repair_lower_threshold
        lower = f32((default_lower if lower == f32(UNSET_THRESHOLD) else lower) * self.count)
        xp = namespace(like)
        deriv = device_stats.on_device(self, "deriv_sum", like)
        # (lower: a Python float holding a float32, so the subtraction is float32's)
        thresholds = xp.astype((lower - xp.astype(deriv, xp.float32)) > 0, xp.float32)
        device_stats.add(self, "num_dims_self_repaired", xp.sum(thresholds))
        return thresholds


def _normalized(total: np.ndarray, count: float) -> np.ndarray:
    """Kaldi's ``Vector<BaseFloat> temp(sum); if (count != 0) temp.Scale(1.0 / count)``."""
    t = np.asarray(total, dtype=np.float64).astype(np.float32)
    if count != 0.0:
        t = t * np.float32(1.0 / count)
    return t


# ----------------------------------------------------------------------------------
@register
class SigmoidComponent(NonlinearComponent):
    """``y = 1 / (1 + exp(-x))``; backprop ``dx = dy * y * (1 - y)`` (needs the output).

    Self-repair: for dimensions whose average derivative is below the lower threshold
    (default 0.05), add ``scale / 0.5 * (1 - 2 y)`` to the input derivative.
    """

    type_name = "SigmoidComponent"

    def properties(self) -> Flags:
        return (Flags.SIMPLE | Flags.BACKPROP_NEEDS_OUTPUT | Flags.PROPAGATE_IN_PLACE
                | Flags.STORES_STATS)

    def _forward(self, x):
        xp = namespace(x)
        x = xp.astype(x, _as_float_dtype(x)) if xp.is_numpy else x
        e = xp.exp(-xp.abs(x))  # never overflows
        return xp.where(x > 0, 1.0 / (1.0 + e), e / (1.0 + e))

    def _diff(self, y, dy):
        return dy * y * (1 - y)

    def _stats_deriv(self, y):
        return (1 - y) * y

    def _repair(self, y, d):
        thr = self._problem_dims(0.05, d)
        if thr is None:
            return
        scale = f32(self.self_repair_scale / _REPAIR_PROBABILITY)
        thr = namespace(d).astype(thr, d.dtype)
        # (Python floats take d's dtype, as d.dtype.type(v) did: NEP 50)
        d += thr * (-2.0 * scale) * y
        d += thr * scale


@register
class TanhComponent(NonlinearComponent):
    """``y = tanh(x)``; backprop ``dx = dy * (1 - y^2)`` (needs the output).

    Self-repair: for dimensions whose average derivative is below the lower threshold
    (default 0.2), add ``-scale / 0.5 * y`` to the input derivative.
    """

    type_name = "TanhComponent"

    def properties(self) -> Flags:
        return (Flags.SIMPLE | Flags.BACKPROP_NEEDS_OUTPUT | Flags.PROPAGATE_IN_PLACE
                | Flags.STORES_STATS)

    def _forward(self, x):
        return namespace(x).tanh(x)

    def _diff(self, y, dy):
        return dy * (1 - y * y)

    def _stats_deriv(self, y):
        return 1 - y * y

    def _repair(self, y, d):
        thr = self._problem_dims(0.2, d)
        if thr is None:
            return
        scale = f32(-self.self_repair_scale / _REPAIR_PROBABILITY)
        d += namespace(d).astype(thr, d.dtype) * scale * y


@register
class RectifiedLinearComponent(NonlinearComponent):
    """``y = max(x, 0)``; backprop ``dx = dy * (y > 0)`` (needs the output).

    Self-repair works on blocks of ``block_dim`` columns (stats averaged over the
    blocks): add ``+2 scale`` to the derivative of dimensions whose average
    derivative is at most the lower threshold (default 0.05) and ``-2 scale`` where
    it exceeds the upper threshold (default 0.95). With ``block_dim != dim`` Kaldi
    views the rows as ``block_dim`` wide, so the input must be contiguous.
    """

    type_name = "RectifiedLinearComponent"

    def properties(self) -> Flags:
        f = (Flags.SIMPLE | Flags.BACKPROP_NEEDS_OUTPUT | Flags.PROPAGATE_IN_PLACE
             | Flags.STORES_STATS)
        if self.block_dim != self.dim:
            f |= Flags.INPUT_CONTIGUOUS
        return f

    def _forward(self, x):
        return namespace(x).maximum(x, 0.0)

    def _diff(self, y, dy):
        return dy * namespace(y).astype(y > 0, dy.dtype)

    def propagate(self, indexes, in_value: np.ndarray, out_value: np.ndarray):
        if out_value.dtype != in_value.dtype:
            return super().propagate(indexes, in_value, out_value)
        xp = namespace(in_value)
        if xp.is_numpy:  # (the same floats, 3x faster: np_kernels)
            np_kernels.relu(in_value, out_value)
        else:
            xp.maximum(in_value, 0.0, out=out_value)  # may run in place
        return None

    def backprop(self, indexes, in_value, out_value, out_deriv, memo, grad,
                 in_deriv) -> None:
        """:meth:`_diff` written straight into ``in_deriv`` (dy times a 0/1 mask: the
        same floats), then the self-repair term added there."""
        if in_deriv is None:
            return
        xp = namespace(out_deriv)
        if in_deriv.dtype != out_deriv.dtype or xp.may_share_memory(in_deriv, out_deriv):
            super().backprop(indexes, in_value, out_value, out_deriv, memo, grad, in_deriv)
            return
        if xp.is_numpy and not np.may_share_memory(in_deriv, out_value):
            # the mask as 0/1 floats in in_deriv, then the multiply: the same floats,
            # 10% faster than a multiply that casts a bool operand on the fly. (The
            # runtime may give the output as that bool mask: runtime.relu_mask_plans)
            mask = out_value if out_value.dtype == np.bool_ else out_value > 0
            np.copyto(in_deriv, mask, casting="unsafe")
            np.multiply(out_deriv, in_deriv, out=in_deriv)
        else:
            xp.multiply(out_deriv, out_value > 0, out=in_deriv)
        if grad is not None:  # Kaldi's "to_update != NULL": training backprop
            self._repair(out_value, in_deriv)
            self.store_backprop_stats(out_deriv)

    def _stats_deriv(self, y):
        return namespace(y).astype(y > 0, y.dtype)

    def _repair(self, y, d):
        if (self.self_repair_scale == 0.0 or self.count == 0.0
                or self._deriv_sum.size != self.dim):
            return
        if self._repair_draw_fails():
            return
        self.num_dims_processed += self.block_dim
        unset = f32(UNSET_THRESHOLD)
        count = f32(self.count)
        lower = self.self_repair_lower_threshold
        upper = self.self_repair_upper_threshold
        # (Python floats holding float32 values: the comparisons below are float32's)
        lower = f32((0.05 if lower == unset else lower) * count)
        upper = f32((0.95 if upper == unset else upper) * count)
        xp = namespace(d)
        deriv = device_stats.on_device(self, "deriv_sum", d)  # (on d's device)
        if self.block_dim == self.dim:
            stats = xp.astype(deriv, xp.float32)
        else:
            blocks = deriv.reshape(self.dim // self.block_dim, self.block_dim)
            stats = xp.astype(xp.sum(blocks, axis=0) * (self.block_dim / self.dim), xp.float32)
        # +1 where stats <= lower, -1 where stats > upper, 0 between.
        row = xp.astype((stats - lower) > 0, xp.float32) + ((stats - upper) > 0) - 1
        device_stats.add(self, "num_dims_self_repaired", xp.sum(row * row))
        row = row * f32(-self.self_repair_scale / _REPAIR_PROBABILITY)
        row = xp.astype(xp.tile(row, self.dim // self.block_dim), d.dtype)
        if xp.is_numpy and d.ndim == 2:  # (the row tiled over rows: same floats)
            np_kernels.rowwise(np.add, d, row, d)
        else:
            d += row


class _RowNormalizedNonlinear(NonlinearComponent):
    """Softmax-like per-row functions: no self-repair; a training backprop stores the
    squared output derivative whether or not an input derivative is wanted."""

    def backprop(self, indexes, in_value, out_value, out_deriv, memo, grad,
                 in_deriv) -> None:
        if grad is not None:  # Kaldi's "to_update != NULL"
            self.store_backprop_stats(out_deriv)
        if in_deriv is not None:
            in_deriv[...] = self._diff(out_value, out_deriv)


@register
class SoftmaxComponent(_RowNormalizedNonlinear):
    """Row softmax, floored at 1e-20 (so outputs can be logged); backprop
    ``dx = y * dy - y (y . dy)``, which may run in place. Stores value stats only
    (on every minibatch)."""

    type_name = "SoftmaxComponent"

    def properties(self) -> Flags:
        return (Flags.SIMPLE | Flags.PROPAGATE_IN_PLACE | Flags.BACKPROP_IN_PLACE
                | Flags.BACKPROP_NEEDS_OUTPUT | Flags.STORES_STATS)

    def _forward(self, x):
        xp = namespace(x)
        z = xp.exp(x - xp.amax(x, axis=1, keepdims=True))
        y = z / xp.sum(z, axis=1, keepdims=True)
        return xp.maximum(y, 1.0e-20)

    def _diff(self, y, dy):
        pe = namespace(y).sum(y * dy, axis=1, keepdims=True)
        return y * dy - y * pe

    def store_stats(self, in_value, out_value, memo) -> None:
        self._store_stats_internal(out_value, None)


# Rows per block of a blocked row-wise pass: about this many floats (512 KiB), so that a block
# and its temporary stay in the core's L2 cache.
_BLOCK_FLOATS = 131072


def _log_softmax_blocked(x: np.ndarray, out: np.ndarray) -> None:
    """``out = x - max - log(sum(exp(x - max)))`` per row (NumPy), a block of rows
    at a time: the exp temporary is one cache-sized block, not a matrix (a fresh
    matrix of that size costs its page faults on every call), and each block is
    read while cached. Row maxima come from ``fmax``, which NumPy reduces ~2x faster
    than ``amax`` (no NaN checks); the row sums of the exponentials are one
    matrix-vector product with ones (BLAS: ~4x faster than NumPy's row-wise sum,
    a float32 sum in another order, so equal to float32 rounding). A row with a
    NaN ends all NaN either way (NaN - max, exp and the sum keep it)."""
    rows, cols = x.shape
    step = max(1, _BLOCK_FLOATS // max(cols, 1))
    tmp = np.empty((min(step, rows), cols), dtype=x.dtype)
    ones = np.ones(cols, dtype=x.dtype)
    sums = np.empty(min(step, rows), dtype=x.dtype)
    for r in range(0, rows, step):
        xb, ob = x[r:r + step], out[r:r + step]
        n = len(xb)
        tb, sb = tmp[:n], sums[:n]
        np.subtract(xb, np.fmax.reduce(xb, axis=1, keepdims=True), out=ob)
        np.exp(ob, out=tb)
        np.matmul(tb, ones, out=sb)
        np.log(sb, out=sb)
        ob -= sb[:, None]


@register
class LogSoftmaxComponent(_RowNormalizedNonlinear):
    """Row log-softmax ``y = x - log(sum(exp(x)))``; backprop
    ``dx = dy - exp(y) * sum(dy)``. Kaldi flags it as storing stats but stores no
    forward stats (only the squared output derivative in a training backprop)."""

    type_name = "LogSoftmaxComponent"

    def properties(self) -> Flags:
        return Flags.SIMPLE | Flags.BACKPROP_NEEDS_OUTPUT | Flags.STORES_STATS

    def _forward(self, x):
        xp = namespace(x)
        s = x - xp.amax(x, axis=1, keepdims=True)
        return s - xp.log(xp.sum(xp.exp(s), axis=1, keepdims=True))

    def _diff(self, y, dy):
        xp = namespace(y)
        return dy - xp.exp(y) * xp.sum(dy, axis=1, keepdims=True)

    def propagate(self, indexes, in_value: np.ndarray, out_value: np.ndarray):
        """:meth:`_forward` with the shifted input and the result in ``out_value``
        (the same float operations; one exp temporary)."""
        xp = namespace(in_value)
        if out_value.dtype != in_value.dtype or xp.may_share_memory(in_value, out_value):
            return super().propagate(indexes, in_value, out_value)
        if isinstance(in_value, np.ndarray):
            if not c_kernels.log_softmax(in_value, out_value):
                _log_softmax_blocked(in_value, out_value)
            return None
        xp.subtract(in_value, xp.amax(in_value, axis=1, keepdims=True), out=out_value)
        out_value -= xp.log(xp.sum(xp.exp(out_value), axis=1, keepdims=True))
        return None

    def backprop(self, indexes, in_value, out_value, out_deriv, memo, grad,
                 in_deriv) -> None:
        """:meth:`_diff` computed in ``in_deriv`` (the same float operations)."""
        xp = namespace(out_deriv)
        if in_deriv is None or in_deriv.dtype != out_deriv.dtype \
                or xp.may_share_memory(in_deriv, out_deriv) \
                or xp.may_share_memory(in_deriv, out_value):
            super().backprop(indexes, in_value, out_value, out_deriv, memo, grad, in_deriv)
            return
        if grad is not None:  # Kaldi's "to_update != NULL"
            self.store_backprop_stats(out_deriv)
        row_sums = xp.sum(out_deriv, axis=1, keepdims=True)
        xp.exp(out_value, out=in_deriv)
        in_deriv *= row_sums
        xp.subtract(out_deriv, in_deriv, out=in_deriv)

    def store_stats(self, in_value, out_value, memo) -> None:
        """Kaldi's LogSoftmaxComponent keeps the base class's no-op StoreStats."""


# ----------------------------------------------------------------------------------
_SQUARED_NORM_FLOOR = 2.0 ** -66  # Kaldi's kSquaredNormFloor; its sqrt is exact


@register
class NormalizeComponent(Component):
    """Scale each block of ``block_dim`` inputs to root-mean-square ``target_rms``:
    ``y = x / sqrt(max(2^-66, x.x / (D target_rms^2)))`` (D = block_dim).

    With ``add_log_stddev`` each block's output gets one more column,
    ``log(target_rms) - log(scale)`` = the log of the block's (floored) RMS times
    target_rms, so the output dim is ``input_dim + input_dim / block_dim``.
    Backprop *adds* into ``in_deriv`` (Kaldi's kBackpropAdds) unless it aliases
    ``out_deriv`` (in place, only without add_log_stddev).
    """

    type_name = "NormalizeComponent"

    def __init__(self, input_dim: int = 0, block_dim: int | None = None,
                 target_rms: float = 1.0, add_log_stddev: bool = False) -> None:
        self.dim = int(input_dim)
        self.block_dim = int(input_dim if block_dim is None else block_dim)
        self.target_rms = f32(target_rms)
        self.add_log_stddev = bool(add_log_stddev)

    @property
    def input_dim(self) -> int:
        return self.dim

    @property
    def output_dim(self) -> int:
        return self.dim + (self.dim // self.block_dim if self.add_log_stddev else 0)

    def properties(self) -> Flags:
        f = Flags.SIMPLE | Flags.BACKPROP_NEEDS_INPUT | Flags.BACKPROP_ADDS
        if not self.add_log_stddev:
            f |= Flags.PROPAGATE_IN_PLACE | Flags.BACKPROP_IN_PLACE
        if self.block_dim != self.dim:
            f |= Flags.INPUT_CONTIGUOUS | Flags.OUTPUT_CONTIGUOUS
        return f

    def info(self) -> str:
        s = (f"type={self.type_name}, input-dim={self.input_dim}, "
             f"output-dim={self.output_dim}, target-rms={self.target_rms:g}, "
             f"add-log-stddev={str(self.add_log_stddev).lower()}")
        if self.block_dim != self.dim:
            s += f", block-dim={self.block_dim}"
        return s

    @classmethod
    def from_config(cls, cfg, rng: np.random.Generator | None = None) -> NormalizeComponent:
        if cfg.has("dim"):
            dim = cfg.get_int("dim")
        else:
            dim = cfg.get_int("input-dim", required=True)
        block_dim = cfg.get_int("block-dim", dim)
        target_rms = cfg.get_float("target-rms", 1.0)
        add_log_stddev = cfg.get_bool("add-log-stddev", False)
        cfg.check_all_used()
        require(dim > 0, cfg, f"dim must be positive, got {dim}")
        require(target_rms > 0.0, cfg, f"target-rms must be positive, got {target_rms}")
        require(block_dim > 0 and dim % block_dim == 0, cfg,
                f"block-dim={block_dim} must be positive and divide dim={dim}")
        return cls(dim, block_dim, target_rms, add_log_stddev)

    kaldi_fields = (
        Field("<InputDim>", "dim", "int", aliases=("<Dim>",), check=positive),
        Field("<BlockDim>", "block_dim", "int", default=lambda c: c.dim,
              write_if=lambda c: c.block_dim != c.dim, check=_block_divides_dim),
        Field("<TargetRms>", "target_rms", "float", default=1.0, convert=f32),
        Field("<AddLogStddev>", "add_log_stddev", "bool", default=False),
        Custom("_skip_old_stats", None),
    )

    def _skip_old_stats(self, r) -> None:
        if r.peek_token() == "<ValueAvg>":  # old format: stats that are now unused
            r.expect_token("<ValueAvg>")
            r.read_vector()
            r.read_tagged("<DerivAvg>", "vector")
            r.read_tagged("<Count>", "float")

    def _blocks(self, m: np.ndarray, width: int) -> np.ndarray:
        """View rows as (rows * num_blocks, width), like Kaldi's reshaped submatrix."""
        return m.reshape(m.shape[0] * (self.dim // self.block_dim), width)

    def _inv_scale(self, sq: np.ndarray) -> np.ndarray:
        """``1 / sqrt(max(floor, x.x / (D rms^2)))`` per block row (Python floats
        take ``sq``'s dtype, as ``dtype.type(v)`` would: NEP 50)."""
        xp = namespace(sq)
        d_scaled = self.block_dim * self.target_rms * self.target_rms
        return 1.0 / xp.sqrt(xp.maximum(sq / d_scaled, _SQUARED_NORM_FLOOR))

    def propagate(self, indexes, in_value, out_value):
        xp = namespace(in_value)
        out_w = self.block_dim + (1 if self.add_log_stddev else 0)
        x = self._blocks(in_value, self.block_dim)
        # (einsum: the squared norms with no x*x temporary, 3x faster)
        f = self._inv_scale(xp.einsum("ij,ij->i", x, x))
        if not self.add_log_stddev and out_value.dtype == in_value.dtype:
            # one pass straight into the output (which may be the input)
            xp.multiply(x, f[:, None], out=self._blocks(out_value, self.block_dim))
            return None
        y = x * f[:, None]
        if self.add_log_stddev:
            log_rms = xp.log(xp.full((), self.target_rms, like=f))
            log_col = log_rms - xp.log(f)
            y = xp.concatenate([y, log_col[:, None]], axis=1)
        out_value[...] = y.reshape(in_value.shape[0], self.dim // self.block_dim * out_w)
        return None

    def backprop(self, indexes, in_value, out_value, out_deriv, memo, grad,
                 in_deriv) -> None:
        if in_deriv is None:
            return
        xp = namespace(in_value)
        in_place = xp.shares_memory(in_deriv, out_deriv)
        out_w = self.block_dim + (1 if self.add_log_stddev else 0)
        x = self._blocks(in_value, self.block_dim)
        od = self._blocks(out_deriv, out_w)
        od_main = od[:, :self.block_dim]
        dots = xp.sum(od_main * x, axis=1)
        sq = xp.sum(x * x, axis=1)
        d = xp.zeros_like(x)
        if self.add_log_stddev:
            # d log(rms) / dx = x / (x.x), the norm floored at D * 2^-66
            floor = self.block_dim * _SQUARED_NORM_FLOOR
            d += (od[:, self.block_dim] / xp.maximum(sq, floor))[:, None] * x
        f = self._inv_scale(sq)
        d += od_main * f[:, None]
        # Where the floor was hit the scale does not depend on x: no second term.
        f3 = xp.where(f == 1.0 / np.sqrt(_SQUARED_NORM_FLOOR), 0.0, f) ** 3
        d_scaled = self.block_dim * self.target_rms * self.target_rms
        d -= ((dots * f3) / d_scaled)[:, None] * x
        d = d.reshape(in_value.shape)
        if in_place:
            in_deriv[...] = d
        else:
            in_deriv += d


@register
class PnormComponent(InOutComponent):
    """2-norm over groups of ``input_dim / output_dim`` consecutive inputs (Kaldi
    always uses p = 2); backprop ``dx = dy * x / y`` (0 where y = 0)."""

    type_name = "PnormComponent"

    def __init__(self, input_dim: int = 0, output_dim: int = 0) -> None:
        self._input_dim = int(input_dim)
        self._output_dim = int(output_dim)

    def properties(self) -> Flags:
        return Flags.SIMPLE | Flags.BACKPROP_NEEDS_INPUT | Flags.BACKPROP_NEEDS_OUTPUT

    @classmethod
    def from_config(cls, cfg, rng: np.random.Generator | None = None) -> PnormComponent:
        output_dim = cfg.get_int("output-dim", required=True)
        input_dim = cfg.get_int("input-dim", required=True)
        cfg.check_all_used()
        require(output_dim > 0, cfg, f"output-dim must be positive, got {output_dim}")
        require(input_dim > 0 and input_dim % output_dim == 0, cfg,
                f"input-dim={input_dim} must be a positive multiple of "
                f"output-dim={output_dim}")
        return cls(input_dim, output_dim)

    kaldi_fields = REDUCING_DIMS

    def _groups(self, m: np.ndarray) -> np.ndarray:
        return m.reshape(m.shape[0], self._output_dim, self._input_dim // self._output_dim)

    def propagate(self, indexes, in_value, out_value):
        xp = namespace(in_value)
        x = self._groups(in_value)
        out_value[...] = xp.sqrt(xp.sum(x * x, axis=2))
        return None

    def backprop(self, indexes, in_value, out_value, out_deriv, memo, grad,
                 in_deriv) -> None:
        if in_deriv is None:
            return
        xp = namespace(out_value)
        y = out_value[:, :, None]
        safe = xp.where(y == 0, 1.0, y)
        ratio = xp.where(y == 0, 0.0, self._groups(in_value) / safe)
        in_deriv[...] = (ratio * out_deriv[:, :, None]).reshape(in_value.shape)


__all__ = [
    "NonlinearComponent", "SigmoidComponent", "TanhComponent", "RectifiedLinearComponent",
    "SoftmaxComponent", "LogSoftmaxComponent", "NormalizeComponent", "PnormComponent",
    "read_double_vector", "f32", "UNSET_THRESHOLD",
]
