"""Affine-family components: a matrix product plus (usually) a bias.

Types: ``AffineComponent``, ``NaturalGradientAffineComponent``, ``LinearComponent``,
``FixedAffineComponent``, ``RepeatedAffineComponent``,
``NaturalGradientRepeatedAffineComponent``, ``BlockAffineComponent``.

All are simple (row i of the output depends on row i of the input). Parameters are
kept in float32 as Kaldi stores them; math runs in the dtype of the input. The
natural-gradient types only differ from the plain ones in training-time
preconditioning, which the plain gradient (what ``backprop`` computes) ignores; we
keep their preconditioner settings so that files round-trip.

The small helpers at the top (header reading, file-parameter loading, float32
conversion) are shared with ``scale_offset`` and ``composite``.
"""

from __future__ import annotations

import contextlib
import contextvars

import numpy as np

from ..io.kaldi_stream import make_reader
from . import np_kernels
from .base import Flags, UpdatableComponent, overwrite_by_zeroing, register, require
from .blas import available as blas_direct
from .blas import column_block_path
from .fields import REPEATED_OPENING, UPDATABLE_HEADER, Custom, Field, pair, positive, skip_optional
from .preconditioning import precondition_matrix, precondition_product, preconditioners
from .xp import namespace

# -- helpers shared by the updatable families ------------------------------------------


def f32(x: float) -> float:
    """A Python float holding the float32 value Kaldi would store (BaseFloat)."""
    return float(np.float32(x))


def init_learning_rates(comp: UpdatableComponent, cfg) -> None:
    """Kaldi's InitLearningRatesFromConfig, including its check for negative values
    (:meth:`UpdatableComponent.init_updatable_from_config`)."""
    comp.init_updatable_from_config(cfg)


def read_lenient_header(comp: UpdatableComponent, r) -> None:
    """The updatable header for types whose Kaldi reader has its own variant
    (Constant, ConstantFunction, Composite): every token optional, in Kaldi's order.
    Accepting a superset of what each variant reads costs nothing and round-trips."""
    for tag, attr, kind in (("<LearningRateFactor>", "learning_rate_factor", "float"),
                            ("<IsGradient>", "is_gradient", "bool"),
                            ("<MaxChange>", "max_change", "float"),
                            ("<L2Regularize>", "l2_regularize", "float"),
                            ("<LearningRate>", "learning_rate", "float")):
        if r.peek_token() == tag:
            setattr(comp, attr, r.read_tagged(tag, kind))


# The header as a field-list step: read leniently, written as Kaldi writes it.
LENIENT_HEADER = Custom(read_lenient_header, "write_updatable_header")


def read_legacy_is_gradient(comp: UpdatableComponent, r) -> None:
    """Old files wrote ``<IsGradient>`` after the parameters; Kaldi still accepts it."""
    if r.peek_token() == "<IsGradient>":
        comp.is_gradient = r.read_tagged("<IsGradient>", "bool")


# Old files wrote <IsGradient> after the parameters; Kaldi still accepts it there.
LEGACY_IS_GRADIENT = Custom(read_legacy_is_gradient, None)

# The parameter fields shared by the affine family.
_LINEAR = Field("<LinearParams>", "linear_params", "matrix", finite="linear_params")
_BIAS = Field("<BiasParams>", "bias_params", "vector", finite="bias_params")
_ORTHONORMAL = Field("<OrthonormalConstraint>", "orthonormal_constraint", "float", default=0.0,
                     write_if=lambda c: c.orthonormal_constraint != 0.0)


def load_kaldi_object(cfg, key: str, kind: str) -> np.ndarray:
    """Read the matrix or vector file named by option ``key`` (Kaldi's ReadKaldiObject)."""
    path = cfg.get_str(key)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise cfg.error(f"{key}={path}: cannot read file ({e.strerror})") from None
    r = make_reader(data, path)
    value = r.read_matrix() if kind == "matrix" else r.read_vector()
    require(np.all(np.isfinite(value)), cfg, f"{key}={path}: non-finite values")
    return value


def randn(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _param(a: np.ndarray, like):
    """Parameter ``a`` in ``like``'s dtype (and device: see ``xp.param``)."""
    return namespace(like).param(a, like)


_REFINE = contextvars.ContextVar("pynnet3_refine_near_zero", default=True)


@contextlib.contextmanager
def near_zero_refinement(enabled: bool):
    """Within this context (per thread / task), :func:`refine_near_zero` runs only
    when ``enabled``. The runtime turns it off for computations with no backward
    pass, where the sign of a near-zero pre-activation gates no derivative, and in
    training for the propagates whose output no use gates on a sign (e.g. an output
    layer feeding a log-softmax: runtime.computer.sign_free_propagates)."""
    token = _REFINE.set(bool(enabled))
    try:
        yield
    finally:
        _REFINE.reset(token)


def backward_follows() -> bool:
    """False inside ``near_zero_refinement(False)``: the runtime is running a
    computation with no backward pass, or a propagate whose output's signs gate no
    derivative, so forward kernels may trade bit-identity with the spliced-input
    product for speed (float32 rounding only)."""
    return _REFINE.get()


def bias_first(out, b) -> bool:
    """Forward only (no backward pass follows), NumPy: ``out[:] = b`` (per row), so
    that the product is added by BLAS itself (beta = 1) instead of a pass adding the
    bias afterwards; False (nothing done) otherwise. With the inner dimension
    within one BLAS block the floats are those of product-then-bias; else they
    differ by float32 rounding (the bias joins the sum earlier)."""
    if _REFINE.get() or type(out) is not np.ndarray or not blas_direct():
        return False
    np.copyto(out, b if b.dtype == out.dtype else b.astype(out.dtype))
    return True


def matmul_blocks_into(out: np.ndarray, blocks: list, w: np.ndarray, add: bool,
                       any_order: bool = False) -> bool:
    """``out (+)= hstack(blocks) @ w.T`` as one GEMM per block, without the spliced
    copy: each block's product is accumulated into ``out`` by BLAS itself
    (``gemm_acc``, beta = 1: no temporary), which measured as fast as or faster than
    copying the blocks side by side for one GEMM at every shape of the realistic
    networks. Returns False (nothing done) for a single block, or when a backward
    pass follows (then the caller's one-GEMM form keeps results bit-identical to a
    spliced input), unless the caller says ``any_order`` (a TDNN layer: Kaldi's sums
    its time offsets' products one by one, too)."""
    k = len(blocks)
    if k < 2 or (_REFINE.get() and not any_order):
        return False
    xp = namespace(out)
    col = 0
    for j, blk in enumerate(blocks):
        wj = w[:, col:col + blk.shape[1]]
        col += blk.shape[1]
        if j == 0 and not add:
            xp.matmul(blk, wj.T, out=out)
        else:
            xp.gemm_acc(out, blk, wj.T)
    return True


def row_block_product(in_value: np.ndarray, block: tuple[int, int], src: np.ndarray,
                      table: np.ndarray, alpha: float, w: np.ndarray, b: np.ndarray | None,
                      out: np.ndarray, add_rows) -> bool:
    """``out = x w^T (+ b)`` for an ``x`` whose columns ``block`` are ``alpha *
    src[table]`` (see :meth:`AffineComponent.propagate_row_block`); the other
    columns are read from ``in_value``. False when the dtypes differ (nothing done)."""
    dtype = out.dtype
    if in_value.dtype != dtype or src.dtype != dtype:
        return False
    w = w if w.dtype == dtype else w.astype(dtype)
    c0, c1 = block
    parts = [(lo, hi) for lo, hi in ((0, c0), (c1, in_value.shape[1])) if hi > lo]
    # the block's product on src's rows, with the bias: added where the bias would be.
    # One vector-matrix product per row (a stacked matmul), so each row's floats do
    # not depend on how many rows src has: NumPy's 2-D matmul takes gemv for one row
    # and gemm for more, and a chunk must not change with the batch it runs in.
    small = np.matmul(src[:, None, :], w[:, c0:c1].T).reshape(src.shape[0], -1)
    if alpha != 1.0:
        small *= dtype.type(alpha)
    if b is not None:
        small += b if b.dtype == dtype else b.astype(dtype)
    if parts:
        lo, hi = parts[0]
        np.matmul(in_value[:, lo:hi], w[:, lo:hi].T, out=out)
        for lo, hi in parts[1:]:
            namespace(out).gemm_acc(out, in_value[:, lo:hi], w[:, lo:hi].T)
        add_rows(out, small, table)
    else:
        np.take(small, table, axis=0, out=out, mode="clip")
    return True


def refine_near_zero(out: np.ndarray, x: np.ndarray, w: np.ndarray,
                     b: np.ndarray | None = None, blocks: list | None = None) -> None:
    """Recompute, in float64, the float32 entries of ``out = x @ w.T (+ b)`` that
    are so close to zero that sgemm's rounding could give them the wrong sign.

    Why: a following ReLU gates its derivative on that sign, so one flipped entry
    changes gradients visibly (Kaldi's reference tdnn_relu_bn/train has one at
    -1.4e-7). The entries are few; the rest keep the fast float32 product. A
    forward-only computation skips it (:func:`near_zero_refinement`): there the
    entries differ from sgemm's by float32 rounding only.

    ``blocks``: ``x``'s column blocks, when the caller has them (a spliced input);
    where they are row windows of one matrix, the first pass's bound on the rows'
    norms reads that matrix once instead of ``x`` (the same entries are refined).

    Torch tensors on the CPU are refined through NumPy views of their memory (the
    same float64 arithmetic); on a GPU the refinement is skipped, since finding the
    entries would make the host wait for the device (GPU results differ from the
    CPU's by float32 rounding, as Kaldi's own GPU results do).
    """
    if not _REFINE.get():
        return
    if not isinstance(out, np.ndarray):
        if out.device.type != "cpu" or out.dtype != namespace(out).float32:
            return
        out, x, blocks = out.numpy(), np.asarray(x.numpy()), None
    if out.dtype != np.float32 or out.size == 0:
        return
    k = x.shape[1]
    eps = float(np.finfo(np.float32).eps)
    c = 4.0 * eps * np.sqrt(k)
    # One cheap pass with the loosest bound, c * max|x_i| * max|w_j|, from float32
    # sums of squares (4x cheaper than float64 ones) made larger by their worst
    # rounding, so that it passes every entry the float64 norms would.
    slack = 1.0 + 2.0 * k * eps
    x_sq = _row_sq(blocks if blocks is not None else [x])
    w_sq = np.einsum("ij,ij->i", w, w)
    loose = c * slack * np.sqrt(float(x_sq.max(initial=0.0)) * float(w_sq.max(initial=0.0)))
    # (compared in float32, 1.7x faster than against a float64 bound: the bound
    # rounded up, so no entry the float64 comparison passes is missed)
    with np.errstate(over="ignore"):
        loose32 = np.float32(loose)
    if loose32 < loose:
        loose32 = np.nextafter(loose32, np.float32(np.inf))
    flat = _flat_true(np.abs(out) <= loose32)  # (2-D nonzero: ~15x slower)
    if not len(flat):
        return
    rows, cols = np.divmod(flat, out.shape[1])
    # The same bound per entry (in float64), from those float32 sums: no row of x
    # read yet. NaN (inf * 0) keeps the entry: the float64 bound below decides it
    with np.errstate(over="ignore", invalid="ignore"):
        pre = c * slack * np.sqrt(x_sq[rows].astype(np.float64) * w_sq[cols])
        near = ~(np.abs(out[rows, cols]) > pre)
    rows, cols = rows[near], cols[near]
    if not len(rows):
        return
    # The exact per-entry bound, with float64 norms of the candidates' rows only.
    xr = x[rows].astype(np.float64)
    wc = w[cols].astype(np.float64)
    bound = c * np.sqrt(np.einsum("ij,ij->i", xr, xr)) * np.sqrt(np.einsum("ij,ij->i", wc, wc))
    keep = np.abs(out[rows, cols]) <= bound
    if not keep.any():
        return
    exact = np.einsum("ij,ij->i", xr[keep], wc[keep])
    if b is not None:
        exact += b[cols[keep]]
    out[rows[keep], cols[keep]] = exact


def _flat_true(mask: np.ndarray) -> np.ndarray:
    """``np.flatnonzero(mask)`` of a C-contiguous bool array, faster when few
    entries are True: the 8-byte words that hold any are found first (a scan of
    an eighth as many entries), then their bytes. The same indices, in order."""
    flat = mask.reshape(-1)
    if flat.size < 4096 or flat.size % 8 or not flat.flags.c_contiguous:
        return np.flatnonzero(flat)
    words = np.flatnonzero(flat.view(np.uint64) != 0)
    if len(words) * 8 > flat.size // 16:  # (many: the plain scan)
        return np.flatnonzero(flat)
    r, c = np.nonzero(flat.view(np.uint8).reshape(-1, 8)[words])
    return words[r] * 8 + c


def _row_window(blk: np.ndarray):
    """``(base, first row)`` when ``blk`` is a window of whole rows of the
    C-contiguous 2-D array ``base``; else None."""
    base = blk.base
    if (type(base) is not np.ndarray or base.ndim != 2 or not base.flags.c_contiguous
            or base.dtype != blk.dtype or base.shape[1] != blk.shape[1]
            or blk.strides != base.strides):
        return None
    off = blk.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    row, rem = divmod(off, base.strides[0])
    if rem or row < 0 or row + blk.shape[0] > base.shape[0]:
        return None
    return base, row


def _row_sq(blocks: list) -> np.ndarray:
    """The rows' sums of squares of ``x``, the column blocks side by side: float32
    sums per block, added in float64. Blocks that are row windows of one matrix
    take them from one pass over the rows they span."""
    if len(blocks) == 1:
        return np.einsum("ij,ij->i", blocks[0], blocks[0])
    wins = [_row_window(b) for b in blocks]
    if all(wn is not None and wn[0] is wins[0][0] for wn in wins):
        lo = min(r for _, r in wins)
        hi = max(r + b.shape[0] for (_, r), b in zip(wins, blocks, strict=True))
        span = wins[0][0][lo:hi]
        sq = np.einsum("ij,ij->i", span, span)
        parts = [sq[r - lo:r - lo + b.shape[0]] for (_, r), b in zip(wins, blocks, strict=True)]
    else:
        parts = [np.einsum("ij,ij->i", b, b) for b in blocks]
    total = parts[0].astype(np.float64)
    for part in parts[1:]:
        total += part
    return total


def _add_grad(grad, name: str, value: np.ndarray) -> None:
    if grad is not None and name in grad:
        grad[name] += value


def gather_blocks(blocks: list) -> np.ndarray:
    """An input value given as its column blocks (a spliced input that
    optimize/splice.py left unmaterialized), as one transient matrix.

    Why gather rather than sum block products: the results are then bit-identical
    to those with the spliced matrix. A block-by-block sum rounds differently in
    float32, and the sign of a near-zero pre-ReLU value, hence a training
    gradient, can depend on that (Kaldi's reference tdnn_relu_bn/train does). The
    transient lives for one command only, not from the copies to the backprop."""
    return blocks[0] if len(blocks) == 1 else namespace(blocks[0]).concatenate(blocks, axis=1)


def add_weight_grad(g: np.ndarray, out_deriv: np.ndarray, in_value) -> None:
    """``g += out_deriv.T @ in_value`` in one BLAS call (no product temporary).
    ``in_value`` may be a list of column blocks: then one GEMM per block into its
    columns of ``g``, with no spliced copy (each entry is the same sum over rows)."""
    xp = namespace(g)
    if isinstance(in_value, list):
        col = 0
        for blk in in_value:
            xp.gemm_acc(g[:, col:col + blk.shape[1]], out_deriv.T, blk)
            col += blk.shape[1]
    else:
        xp.gemm_acc(g, out_deriv.T, in_value)


def add_input_deriv(in_deriv, out_deriv, w) -> None:
    """``in_deriv += out_deriv @ w``. ``in_deriv`` may be a list of column blocks (a
    backprop with ``deriv_blocks``): block j gets the product's columns of block j
    added; blocks may overlap (row windows of one derivative matrix) and are then
    added to in order. Small blocks go through the whole product (its floats, as a
    spliced derivative matrix had them), large ones take a GEMM each straight into
    place (the same to float rounding): ``blas.column_block_path``."""
    xp = namespace(out_deriv)
    if not isinstance(in_deriv, list):
        xp.gemm_acc(in_deriv, out_deriv, w)
        return
    rows, inner = out_deriv.shape
    col = 0
    if column_block_path(rows, inner, [blk.shape[1] for blk in in_deriv]) == "whole":
        prod = xp.zeros((rows, w.shape[1]), like=out_deriv)  # (the spliced derivative's
        xp.gemm_acc(prod, out_deriv, w)  # floats: the same call on the same shapes)
        for blk in in_deriv:
            blk += prod[:, col:col + blk.shape[1]]
            col += blk.shape[1]
        return
    for blk in in_deriv:
        xp.gemm_acc(blk, out_deriv, w[:, col:col + blk.shape[1]])
        col += blk.shape[1]


class BlockInputMixin:
    """``propagate_blocks`` / ``backprop_blocks``: :meth:`propagate` /
    :meth:`backprop` with the input value given as its column blocks, in order.
    The backprop only reads the input for the weight gradient, which takes the
    blocks as they are (:func:`add_weight_grad`)."""

    def propagate_blocks(self, indexes, blocks: list, out_value):
        return self.propagate(indexes, gather_blocks(blocks), out_value)

    def backprop_blocks(self, indexes, blocks: list, out_value, out_deriv, memo, grad,
                        in_deriv) -> None:
        self.backprop(indexes, blocks[0] if len(blocks) == 1 else list(blocks), out_value,
                      out_deriv, memo, grad, in_deriv)

    @property
    def deriv_blocks(self) -> bool:
        """Whether :meth:`backprop` takes ``in_deriv`` as a list of column blocks to
        add to (:func:`add_input_deriv`; a subclass's own backprop may not)."""
        return type(self).backprop in _DERIV_BLOCK_BACKPROPS


# -- AffineComponent and NaturalGradientAffineComponent ------------------------------


@register
class AffineComponent(BlockInputMixin, UpdatableComponent):
    """y = x W^T + b, with W [output-dim, input-dim] and b [output-dim]."""

    type_name = "AffineComponent"

    def __init__(self, linear_params: np.ndarray, bias_params: np.ndarray):
        super().__init__()
        self.linear_params = np.asarray(linear_params, np.float32)
        self.bias_params = np.asarray(bias_params, np.float32)
        self.orthonormal_constraint = 0.0

    @property
    def input_dim(self) -> int:
        return self.linear_params.shape[1]

    @property
    def output_dim(self) -> int:
        return self.linear_params.shape[0]

    def properties(self) -> Flags:
        return Flags.SIMPLE | Flags.UPDATABLE | Flags.BACKPROP_NEEDS_INPUT | Flags.BACKPROP_ADDS

    # -- config --------------------------------------------------------------------
    @classmethod
    def _init_params(cls, cfg, rng, with_bias_mean: bool):
        if cfg.has("matrix"):
            mat = load_kaldi_object(cfg, "matrix", "matrix")
            require(mat.shape[1] >= 2, cfg, "matrix= must have at least 2 columns")
            linear, bias = mat[:, :-1].copy(), mat[:, -1].copy()
            for key, want in (("input-dim", linear.shape[1]), ("output-dim", linear.shape[0])):
                if cfg.has(key):
                    require(cfg.get_int(key) == want, cfg, f"{key} mismatch vs. matrix")
            return linear, bias
        input_dim = cfg.get_int("input-dim", required=True)
        output_dim = cfg.get_int("output-dim", required=True)
        require(input_dim > 0 and output_dim > 0, cfg, "input-dim and output-dim must be > 0")
        param_stddev = cfg.get_float("param-stddev", 1.0 / np.sqrt(input_dim))
        bias_stddev = cfg.get_float("bias-stddev", 1.0)
        bias_mean = cfg.get_float("bias-mean", 0.0) if with_bias_mean else 0.0
        require(param_stddev >= 0.0, cfg, "param-stddev must be >= 0")
        if with_bias_mean:
            require(bias_stddev >= 0.0, cfg, "bias-stddev must be >= 0")
        linear = randn(rng, output_dim, input_dim) * np.float32(param_stddev)
        bias = randn(rng, output_dim) * np.float32(bias_stddev) + np.float32(bias_mean)
        return linear, bias

    @classmethod
    def from_config(cls, cfg, rng: np.random.Generator) -> AffineComponent:
        linear, bias = cls._init_params(cfg, rng, with_bias_mean=cls is not AffineComponent)
        comp = cls(linear, bias)
        init_learning_rates(comp, cfg)
        comp.orthonormal_constraint = f32(cfg.get_float("orthonormal-constraint", 0.0))
        comp._init_extra(cfg)
        cfg.check_all_used()
        return comp

    def _init_extra(self, cfg) -> None:
        """Subclass hook for extra config options."""

    # -- files ---------------------------------------------------------------------
    kaldi_fields = (UPDATABLE_HEADER, _LINEAR, _BIAS, LEGACY_IS_GRADIENT, _ORTHONORMAL)

    @classmethod
    def empty_for_read(cls) -> AffineComponent:
        return cls(np.zeros((0, 0), np.float32), np.zeros(0, np.float32))

    def read_end(self, r) -> None:
        super().read_end(r)
        self._check_dims(r)

    def _check_dims(self, r) -> None:
        if self.bias_params.shape[0] != self.linear_params.shape[0]:
            raise r.error(f"{self.type_name}: bias dim {self.bias_params.shape[0]} != "
                          f"output dim {self.linear_params.shape[0]}")

    # -- parameters and math -------------------------------------------------------
    def params(self) -> dict[str, np.ndarray]:
        return {"linear_params": self.linear_params, "bias_params": self.bias_params}

    def propagate_blocks(self, indexes, blocks: list, out_value):
        w = _param(self.linear_params, blocks[0])
        if len(blocks) > 1 and bias_first(out_value, self.bias_params):
            matmul_blocks_into(out_value, blocks, w, add=True)  # (forward only: done)
            return None
        if matmul_blocks_into(out_value, blocks, w, add=False):
            out_value += _param(self.bias_params, blocks[0])
            return None
        if type(self).propagate is not AffineComponent.propagate:  # a subclass's own math
            return self.propagate(indexes, gather_blocks(blocks), out_value)
        return self._propagate(gather_blocks(blocks), out_value, blocks)

    def propagate(self, indexes, in_value, out_value):
        return self._propagate(in_value, out_value, None)

    def propagate_row_block(self, in_value, block: tuple[int, int], src, table,
                            alpha: float, out_value, add_rows) -> bool:
        """Forward only (NumPy): ``out = x W^T + b`` where columns ``block`` of
        ``x = in_value`` hold ``alpha * src[table]`` (rows of a small matrix repeated,
        e.g. an iVector appended to every frame) and are not read: that block's
        product is taken once per row of ``src`` and added to the rows it feeds, so
        its share of the GEMM shrinks from a row per frame to one per sequence.
        Differs from :meth:`propagate` by float32 rounding only (like
        :func:`matmul_blocks_into`). ``add_rows(dst, m, table)``: the backend's
        ``dst[i] += m[table[i]]``. False (nothing done) where it does not apply:
        a subclass with math of its own, or not NumPy arrays."""
        if (type(self).propagate is not AffineComponent.propagate
                or type(self)._propagate is not AffineComponent._propagate
                or not isinstance(in_value, np.ndarray)):
            return False  # (a subclass's own math)
        return row_block_product(in_value, block, src, table, alpha, self.linear_params,
                                 self.bias_params, out_value, add_rows)

    def _propagate(self, in_value, out_value, blocks: list | None):
        """``blocks``: ``in_value``'s column blocks, when it was gathered from them
        (only a cheaper first pass of :func:`refine_near_zero`)."""
        xp = namespace(in_value)
        if bias_first(out_value, self.bias_params):  # (forward only: no refinement)
            xp.gemm_acc(out_value, in_value, _param(self.linear_params, in_value).T)
            return None
        # (into the output: no product temporary; the same sgemm, the same bits)
        xp.matmul(in_value, xp.param(self.linear_params, in_value).T, out=out_value)
        if xp.is_numpy:  # (the bias tiled over rows: np_kernels.rowwise, same floats)
            np_kernels.rowwise(np.add, out_value, _param(self.bias_params, in_value), out_value)
        else:
            out_value += xp.param(self.bias_params, in_value)
        if blocks is None:
            refine_near_zero(out_value, in_value, self.linear_params, self.bias_params)
        else:
            refine_near_zero(out_value, in_value, self.linear_params, self.bias_params,
                             blocks=blocks)
        return None

    def backprop(self, indexes, in_value, out_value, out_deriv, memo, grad, in_deriv) -> None:
        """``in_value`` may be a list of column blocks (:class:`BlockInputMixin`)."""
        xp = namespace(out_deriv)
        if in_deriv is not None:
            add_input_deriv(in_deriv, out_deriv, xp.param(self.linear_params, out_deriv))
        # (a trainer's grad may carry natural-gradient preconditioners: then Kaldi's
        # preconditioned update is added instead; see components/preconditioning.py)
        if grad is not None and not precondition_product(grad, "linear_params", "bias_params",
                                                         in_value, out_deriv):
            if "linear_params" in grad:
                add_weight_grad(grad["linear_params"], out_deriv, in_value)
            _add_grad(grad, "bias_params", xp.sum(out_deriv, axis=0))

    def info(self) -> str:
        s = super().info() + self.updatable_info()
        if self.orthonormal_constraint != 0.0:
            s += f", orthonormal-constraint={self.orthonormal_constraint:g}"
        return s


@register
class NaturalGradientAffineComponent(AffineComponent):
    """AffineComponent trained with Kaldi's natural gradient; the forward/backward
    math and the plain gradient are the same. Stores the preconditioner settings
    (ranks, update period, history, alpha) so files round-trip."""

    type_name = "NaturalGradientAffineComponent"

    def __init__(self, linear_params: np.ndarray, bias_params: np.ndarray):
        super().__init__(linear_params, bias_params)
        self.rank_in = min(20, (self.input_dim + 1) // 2)
        self.rank_out = min(80, (self.output_dim + 1) // 2)
        self.update_period = 4
        self.num_samples_history = 2000.0
        self.alpha = 4.0

    def _init_extra(self, cfg) -> None:
        self.num_samples_history = f32(cfg.get_float("num-samples-history", 2000.0))
        self.alpha = f32(cfg.get_float("alpha", 4.0))
        self.rank_in = cfg.get_int("rank-in", -1)
        self.rank_out = cfg.get_int("rank-out", -1)
        self.update_period = cfg.get_int("update-period", 4)
        if self.rank_in < 0:
            self.rank_in = min(20, (self.input_dim + 1) // 2)
        if self.rank_out < 0:
            self.rank_out = min(80, (self.output_dim + 1) // 2)

    kaldi_fields = (
        UPDATABLE_HEADER, _LINEAR, _BIAS,
        Field("<RankIn>", "rank_in", "int"),
        Field("<RankOut>", "rank_out", "int"),
        _ORTHONORMAL,
        Field("<UpdatePeriod>", "update_period", "int"),
        Field("<NumSamplesHistory>", "num_samples_history", "float"),
        Field("<Alpha>", "alpha", "float"),
        # Back-compatibility tokens Kaldi still accepts (and drops).
        skip_optional("<MaxChangePerSample>", "float"),
        LEGACY_IS_GRADIENT,
        Custom("_skip_update_stats", None),
    )

    def _skip_update_stats(self, r) -> None:
        if r.peek_token() == "<UpdateCount>":
            for tag in ("<UpdateCount>", "<ActiveScalingCount>", "<MaxChangeScaleStats>"):
                r.read_tagged(tag, "float")

    def read_end(self, r) -> None:
        # Kaldi accepts any token containing "NaturalGradientAffineComponent>" here.
        start = r.pos
        tok = r.read_token()
        if "NaturalGradientAffineComponent>" not in tok:
            raise r.error("expected </NaturalGradientAffineComponent>", token=tok, pos=start)
        self._check_dims(r)


# -- LinearComponent ------------------------------------------------------------------


@register
class LinearComponent(BlockInputMixin, UpdatableComponent):
    """y += x W^T (no bias; note Kaldi's PROPAGATE_ADDS: the output is added to)."""

    type_name = "LinearComponent"

    def __init__(self, params: np.ndarray):
        super().__init__()
        self.params_ = np.asarray(params, np.float32)
        self.orthonormal_constraint = 0.0
        self.use_natural_gradient = True
        self.rank_in, self.rank_out = 40, 80
        self.alpha, self.num_samples_history, self.update_period = 4.0, 2000.0, 4

    @property
    def input_dim(self) -> int:
        return self.params_.shape[1]

    @property
    def output_dim(self) -> int:
        return self.params_.shape[0]

    def properties(self) -> Flags:
        return (Flags.SIMPLE | Flags.UPDATABLE | Flags.BACKPROP_NEEDS_INPUT
                | Flags.PROPAGATE_ADDS | Flags.BACKPROP_ADDS)

    @classmethod
    def from_config(cls, cfg, rng: np.random.Generator) -> LinearComponent:
        comp = cls(np.zeros((0, 0), np.float32))
        init_learning_rates(comp, cfg)
        if cfg.has("matrix"):
            comp.params_ = load_kaldi_object(cfg, "matrix", "matrix")
            require(comp.params_.shape[0] != 0, cfg, "matrix= is empty")
            for key, want in (("input-dim", comp.input_dim), ("output-dim", comp.output_dim)):
                if cfg.has(key):
                    require(cfg.get_int(key) == want, cfg, f"{key} mismatch vs. matrix")
        else:
            input_dim = cfg.get_int("input-dim", required=True)
            output_dim = cfg.get_int("output-dim", required=True)
            require(input_dim > 0 and output_dim > 0, cfg, "input-dim and output-dim must be > 0")
            stddev = cfg.get_float("param-stddev", 1.0 / np.sqrt(input_dim))
            require(stddev >= 0.0, cfg, "param-stddev must be >= 0")
            comp.params_ = randn(rng, output_dim, input_dim) * np.float32(stddev)
        comp.num_samples_history = f32(cfg.get_float("num-samples-history", 2000.0))
        comp.alpha = f32(cfg.get_float("alpha", 4.0))
        comp.rank_in = cfg.get_int("rank-in", -1)
        comp.rank_out = cfg.get_int("rank-out", -1)
        comp.update_period = cfg.get_int("update-period", 4)
        comp.use_natural_gradient = cfg.get_bool("use-natural-gradient", True)
        if comp.rank_in < 0:
            comp.rank_in = min(20, (comp.input_dim + 1) // 2)
        if comp.rank_out < 0:
            comp.rank_out = min(80, (comp.output_dim + 1) // 2)
        comp.orthonormal_constraint = f32(cfg.get_float("orthonormal-constraint", 0.0))
        cfg.check_all_used()
        return comp

    kaldi_fields = (
        UPDATABLE_HEADER,
        Field("<Params>", "params_", "matrix", finite="params"),
        _ORTHONORMAL,
        Field("<UseNaturalGradient>", "use_natural_gradient", "bool"),
        *pair("<RankInOut>", "rank", "int"),
        Field("<Alpha>", "alpha", "float"),
        Field("<NumSamplesHistory>", "num_samples_history", "float"),
        Field("<UpdatePeriod>", "update_period", "int"),
    )

    @classmethod
    def empty_for_read(cls) -> LinearComponent:
        return cls(np.zeros((0, 0), np.float32))

    def params(self) -> dict[str, np.ndarray]:
        return {"params": self.params_}

    def export_gradient(self, grad):
        g = grad["params"]
        return {"params_vectorized": namespace(g).copy(g.reshape(-1))}

    def propagate_blocks(self, indexes, blocks: list, out_value):
        if matmul_blocks_into(out_value, blocks, _param(self.params_, blocks[0]), add=True):
            return None
        return self.propagate(indexes, gather_blocks(blocks), out_value)

    def propagate(self, indexes, in_value, out_value):
        # PROPAGATE_ADDS in one BLAS call (into a zeroed output: the floats of the product)
        xp = namespace(in_value)
        xp.gemm_acc(out_value, in_value, xp.param(self.params_, in_value).T)
        return None

    def propagate_overwrite(self, indexes, in_value, out_value):
        """:meth:`propagate` into an output of undefined contents, as if it were zero
        (the runtime skips the zeroing Kaldi's PROPAGATE_ADDS asks for): the same
        floats, the product written rather than added."""
        if type(self).propagate is not LinearComponent.propagate:  # (a subclass's math)
            return overwrite_by_zeroing(self, indexes, in_value, out_value)
        xp = namespace(in_value)
        xp.matmul(in_value, xp.param(self.params_, in_value).T, out=out_value)
        return None

    def backprop(self, indexes, in_value, out_value, out_deriv, memo, grad, in_deriv) -> None:
        """``in_value`` may be a list of column blocks (:class:`BlockInputMixin`)."""
        if in_deriv is not None:
            add_input_deriv(in_deriv, out_deriv, namespace(out_deriv).param(self.params_,
                                                                              out_deriv))
        if grad is not None and "params" in grad and not precondition_product(
                grad, "params", None, in_value, out_deriv):  # (natural gradient: trainer)
            add_weight_grad(grad["params"], out_deriv, in_value)


#: the backprops that take their input derivative as column blocks
_DERIV_BLOCK_BACKPROPS = (AffineComponent.backprop, LinearComponent.backprop)


# -- FixedAffineComponent -------------------------------------------------------------


@register
class FixedAffineComponent(AffineComponent):
    """A non-trainable affine transform (e.g. an LDA matrix)."""

    type_name = "FixedAffineComponent"

    def properties(self) -> Flags:
        return Flags.SIMPLE | Flags.BACKPROP_ADDS

    @classmethod
    def from_config(cls, cfg, rng: np.random.Generator) -> FixedAffineComponent:
        if cfg.has("matrix"):
            mat = load_kaldi_object(cfg, "matrix", "matrix")
            require(mat.shape[0] != 0 and mat.shape[1] > 1, cfg, "matrix= too small")
        else:
            # "input-dim=x output-dim=y": random, for testing only (as Kaldi).
            input_dim = cfg.get_int("input-dim", required=True)
            output_dim = cfg.get_int("output-dim", required=True)
            require(input_dim > 0 and output_dim > 0, cfg, "input-dim and output-dim must be > 0")
            mat = randn(rng, output_dim, input_dim + 1)
        cfg.check_all_used()
        return cls(mat[:, :-1].copy(), mat[:, -1].copy())

    kaldi_fields = (REPEATED_OPENING, _LINEAR, _BIAS)

    def params(self) -> dict[str, np.ndarray]:
        return {}

    def backprop(self, indexes, in_value, out_value, out_deriv, memo, grad, in_deriv) -> None:
        if in_deriv is not None:
            in_deriv += out_deriv @ _param(self.linear_params, out_deriv)

    def info(self) -> str:
        return f"type={self.type_name}, input-dim={self.input_dim}, output-dim={self.output_dim}"


# -- RepeatedAffineComponent and its natural-gradient twin ------------------------------


class _CountedAffine(UpdatableComponent):
    """File layout shared by RepeatedAffine and BlockAffine: the header, a count
    (``<NumRepeats>`` / ``<NumBlocks>``), the linear and bias parameters."""

    @staticmethod
    def counted_fields(tag: str, attr: str) -> tuple:
        return (UPDATABLE_HEADER, Field(tag, attr, "int", check=positive),
                _LINEAR, _BIAS, LEGACY_IS_GRADIENT)

    @classmethod
    def empty_for_read(cls) -> _CountedAffine:
        return cls(np.zeros((0, 0), np.float32), np.zeros(0, np.float32), 1)

    def read_end(self, r) -> None:
        super().read_end(r)
        if self.bias_params.shape[0] != self.linear_params.shape[0]:
            raise r.error(f"{self.type_name}: bias dim does not match linear params")


@register
class RepeatedAffineComponent(_CountedAffine):
    """The same small affine map applied to each of ``num_repeats`` consecutive
    column blocks: W [output-dim/r, input-dim/r], b [output-dim/r]."""

    type_name = "RepeatedAffineComponent"

    def __init__(self, linear_params: np.ndarray, bias_params: np.ndarray, num_repeats: int):
        super().__init__()
        self.linear_params = np.asarray(linear_params, np.float32)
        self.bias_params = np.asarray(bias_params, np.float32)
        self.num_repeats = int(num_repeats)

    @property
    def input_dim(self) -> int:
        return self.linear_params.shape[1] * self.num_repeats

    @property
    def output_dim(self) -> int:
        return self.linear_params.shape[0] * self.num_repeats

    def properties(self) -> Flags:
        return (Flags.SIMPLE | Flags.UPDATABLE | Flags.BACKPROP_NEEDS_INPUT | Flags.BACKPROP_ADDS
                | Flags.INPUT_CONTIGUOUS | Flags.OUTPUT_CONTIGUOUS)

    @classmethod
    def from_config(cls, cfg, rng: np.random.Generator) -> RepeatedAffineComponent:
        comp = cls(np.zeros((0, 0)), np.zeros(0), 1)
        init_learning_rates(comp, cfg)
        num_repeats = cfg.get_int("num-repeats", required=True)
        input_dim = cfg.get_int("input-dim", required=True)
        output_dim = cfg.get_int("output-dim", required=True)
        require(num_repeats > 0, cfg, "num-repeats must be > 0")
        require(input_dim > 0 and output_dim > 0, cfg, "input-dim and output-dim must be > 0")
        require(input_dim % num_repeats == 0, cfg, "num-repeats must divide input-dim")
        require(output_dim % num_repeats == 0, cfg, "num-repeats must divide output-dim")
        block_in, block_out = input_dim // num_repeats, output_dim // num_repeats
        stddev = cfg.get_float("param-stddev", 1.0 / np.sqrt(block_in))
        bias_mean = cfg.get_float("bias-mean", 0.0)
        bias_stddev = cfg.get_float("bias-stddev", 0.0)
        require(stddev >= 0.0, cfg, "param-stddev must be >= 0")
        comp.linear_params = randn(rng, block_out, block_in) * np.float32(stddev)
        comp.bias_params = (randn(rng, block_out) * np.float32(bias_stddev)
                            + np.float32(bias_mean))
        comp.num_repeats = num_repeats
        cfg.check_all_used()
        return comp

    kaldi_fields = _CountedAffine.counted_fields("<NumRepeats>", "num_repeats")

    def params(self) -> dict[str, np.ndarray]:
        return {"linear_params": self.linear_params, "bias_params": self.bias_params}

    def _blocks(self, m: np.ndarray, block: int) -> np.ndarray:
        # Each input row holds num_repeats consecutive blocks; treat them as rows.
        return m.reshape(-1, block)

    def propagate(self, indexes, in_value, out_value):
        x = self._blocks(in_value, self.linear_params.shape[1])
        y = x @ _param(self.linear_params, x).T + _param(self.bias_params, x)
        out_value[...] = y.reshape(out_value.shape)
        return None

    def backprop(self, indexes, in_value, out_value, out_deriv, memo, grad, in_deriv) -> None:
        dy = self._blocks(out_deriv, self.linear_params.shape[0])
        if in_deriv is not None:
            dx = dy @ _param(self.linear_params, dy)
            in_deriv += dx.reshape(in_deriv.shape)
        if grad is not None:
            x = self._blocks(in_value, self.linear_params.shape[1])
            if preconditioners(grad) is not None:  # a trainer's natural gradient: Kaldi
                # preconditions the [linear | bias] derivative's rows
                xp = namespace(dy)
                precondition_matrix(grad, ("linear_params", "bias_params"), xp.concatenate(
                    [dy.T @ x, xp.sum(dy, axis=0)[:, None]], axis=1))
                return
            _add_grad(grad, "linear_params", dy.T @ x)
            _add_grad(grad, "bias_params", namespace(dy).sum(dy, axis=0))

    def info(self) -> str:
        return super().info() + self.updatable_info() + f", num-repeats={self.num_repeats}"


@register
class NaturalGradientRepeatedAffineComponent(RepeatedAffineComponent):
    """RepeatedAffineComponent with a (fixed-configuration) natural-gradient update;
    same file layout, math and plain gradient."""

    type_name = "NaturalGradientRepeatedAffineComponent"


# -- BlockAffineComponent -------------------------------------------------------------


@register
class BlockAffineComponent(_CountedAffine):
    """A block-diagonal affine map with ``num_blocks`` independent blocks.

    ``linear_params`` [output-dim, input-dim/num-blocks] stacks the blocks
    vertically: block b maps input columns b*ci..(b+1)*ci to output columns
    b*co..(b+1)*co using rows b*co..(b+1)*co.
    """

    type_name = "BlockAffineComponent"

    def __init__(self, linear_params: np.ndarray, bias_params: np.ndarray, num_blocks: int):
        super().__init__()
        self.linear_params = np.asarray(linear_params, np.float32)
        self.bias_params = np.asarray(bias_params, np.float32)
        self.num_blocks = int(num_blocks)

    @property
    def input_dim(self) -> int:
        return self.linear_params.shape[1] * self.num_blocks

    @property
    def output_dim(self) -> int:
        return self.linear_params.shape[0]

    def properties(self) -> Flags:
        return Flags.SIMPLE | Flags.UPDATABLE | Flags.BACKPROP_NEEDS_INPUT | Flags.BACKPROP_ADDS

    @classmethod
    def from_config(cls, cfg, rng: np.random.Generator) -> BlockAffineComponent:
        comp = cls(np.zeros((0, 0)), np.zeros(0), 1)
        input_dim = cfg.get_int("input-dim", required=True)
        output_dim = cfg.get_int("output-dim", required=True)
        num_blocks = cfg.get_int("num-blocks", required=True)
        init_learning_rates(comp, cfg)
        require(input_dim > 0 and output_dim > 0 and num_blocks >= 1, cfg,
                "input-dim, output-dim and num-blocks must be > 0")
        require(input_dim % num_blocks == 0 and output_dim % num_blocks == 0, cfg,
                "num-blocks must divide input-dim and output-dim")
        stddev = cfg.get_float("param-stddev", 1.0 / np.sqrt(input_dim // num_blocks))
        bias_stddev = cfg.get_float("bias-stddev", 1.0)
        bias_mean = cfg.get_float("bias-mean", 0.0)
        require(stddev >= 0.0 and bias_stddev >= 0.0, cfg,
                "param-stddev and bias-stddev must be >= 0")
        comp.linear_params = randn(rng, output_dim, input_dim // num_blocks) * np.float32(stddev)
        comp.bias_params = randn(rng, output_dim) * np.float32(bias_stddev) + np.float32(bias_mean)
        comp.num_blocks = num_blocks
        cfg.check_all_used()
        return comp

    kaldi_fields = _CountedAffine.counted_fields("<NumBlocks>", "num_blocks")

    def read_end(self, r) -> None:
        super().read_end(r)
        if self.linear_params.shape[0] % self.num_blocks:
            raise r.error("<NumBlocks> must divide the output dim",
                          token=str(self.num_blocks))

    def params(self) -> dict[str, np.ndarray]:
        return {"linear_params": self.linear_params, "bias_params": self.bias_params}

    def export_gradient(self, grad):
        xp = namespace(grad["linear_params"])
        return {"params_vectorized": xp.concatenate([grad["linear_params"].reshape(-1),
                                                     grad["bias_params"].reshape(-1)])}

    def _w3(self, like):
        """The blocks as [num_blocks, block_out, block_in], in ``like``'s dtype."""
        nb = self.num_blocks
        return _param(self.linear_params, like).reshape(nb, -1, self.linear_params.shape[1])

    def propagate(self, indexes, in_value, out_value):
        xp = namespace(in_value)
        x = in_value.reshape(len(in_value), self.num_blocks, -1)
        y = xp.einsum("rbi,boi->rbo", x, self._w3(in_value))
        out_value[...] = y.reshape(out_value.shape) + xp.param(self.bias_params, in_value)
        return None

    def backprop(self, indexes, in_value, out_value, out_deriv, memo, grad, in_deriv) -> None:
        xp = namespace(out_deriv)
        dy = out_deriv.reshape(len(out_deriv), self.num_blocks, -1)
        if in_deriv is not None:
            dx = xp.einsum("rbo,boi->rbi", dy, self._w3(out_deriv))
            in_deriv += dx.reshape(in_deriv.shape)
        if grad is not None:
            x = in_value.reshape(len(in_value), self.num_blocks, -1)
            gw = xp.einsum("rbo,rbi->boi", dy, x)
            _add_grad(grad, "linear_params", gw.reshape(self.linear_params.shape))
            _add_grad(grad, "bias_params", xp.sum(out_deriv, axis=0))

    def info(self) -> str:
        return super().info() + self.updatable_info() + f", num-blocks={self.num_blocks}"
