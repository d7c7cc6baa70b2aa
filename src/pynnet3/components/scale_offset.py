"""Per-element scales and offsets, and constant outputs.

Types: ``FixedScaleComponent``, ``FixedBiasComponent``, ``PerElementScaleComponent``,
``NaturalGradientPerElementScaleComponent``, ``PerElementOffsetComponent``,
``ScaleAndOffsetComponent``, ``ConstantFunctionComponent`` (simple) and
``ConstantComponent`` (non-simple: it needs no input at all).

Where Kaldi has a ``block-dim`` (PerElementOffset, ScaleAndOffset), a parameter
vector of ``block-dim`` values is applied to each consecutive block of ``dim``
columns; we express that by viewing a row as ``dim/block-dim`` blocks.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from .affine import (
    LEGACY_IS_GRADIENT,
    LENIENT_HEADER,
    f32,
    init_learning_rates,
    load_kaldi_object,
    randn,
)
from .base import (
    Component,
    Flags,
    InputDeps,
    UpdatableComponent,
    register,
    require,
)
from .fields import (
    REPEATED_OPENING,
    UPDATABLE_HEADER,
    Field,
    non_empty,
    skip_optional,
)
from .preconditioning import precondition_rows, preconditioners
from .xp import namespace


def _blocks(m: np.ndarray, block: int) -> np.ndarray:
    """A [rows, dim] matrix seen as [rows * dim/block, block] (copies if not contiguous)."""
    return m.reshape(-1, block)


def _times_scales(src: np.ndarray, scales: np.ndarray, dst: np.ndarray) -> None:
    """``dst = src * scales`` per column (``scales`` placed on ``src``'s backend)."""
    xp = namespace(src)
    xp.multiply(src, xp.param(scales, src), out=dst)


def _add_grad(grad, name: str, value: np.ndarray) -> None:
    if grad is not None and name in grad:
        grad[name] += value


def _multiple_of_offsets(tag: str, dim: int, comp) -> str | None:
    block = comp.offsets.shape[0]
    if dim > 0 and block and dim % block == 0:
        return None
    return f"{tag} must be a positive multiple of the offsets dim"


def _blocks_agree(tag: str, offsets: np.ndarray, comp) -> str | None:
    """ScaleAndOffset: scales and offsets are one block, and blocks tile the dim."""
    block = comp.scales.shape[0]
    if block == 0 or offsets.shape[0] != block or comp.dim % block:
        return f"<Dim> {comp.dim} / <Scales> / <Offsets> dimensions do not agree"
    return None


# -- fixed (non-trainable) scale and bias ---------------------------------------------


class _FixedVectorComponent(Component):
    """A simple component applying one fixed (not trained) per-column vector, held
    in the attribute named ``vector_name``; that is also the config option that
    reads it from a file. Its length is the input and output dim."""

    vector_name: ClassVar[str]

    @property
    def input_dim(self) -> int:
        return getattr(self, self.vector_name).shape[0]

    output_dim = input_dim

    def properties(self) -> Flags:
        return Flags.SIMPLE | Flags.PROPAGATE_IN_PLACE | Flags.BACKPROP_IN_PLACE

    @classmethod
    def from_config(cls, cfg, rng: np.random.Generator) -> _FixedVectorComponent:
        if cfg.has(cls.vector_name):
            vec = load_kaldi_object(cfg, cls.vector_name, "vector")
            require(vec.size > 0, cfg, f"{cls.vector_name}= is empty")
        else:
            dim = cfg.get_int("dim", required=True)
            require(dim > 0, cfg, "dim must be > 0")
            vec = cls._vector_for_dim(cfg, rng, dim)
        cfg.check_all_used()
        return cls(vec)

    @classmethod
    def _vector_for_dim(cls, cfg, rng: np.random.Generator, dim: int) -> np.ndarray:
        """The vector when the config gives only ``dim=``: random, N(0, 1)."""
        return randn(rng, dim)

    @classmethod
    def empty_for_read(cls) -> _FixedVectorComponent:
        return cls(np.zeros(0, np.float32))


@register
class FixedScaleComponent(_FixedVectorComponent):
    """y = x * scales (per column), fixed."""

    type_name = "FixedScaleComponent"
    vector_name = "scales"

    def __init__(self, scales: np.ndarray):
        self.scales = np.asarray(scales, np.float32)

    @classmethod
    def _vector_for_dim(cls, cfg, rng: np.random.Generator, dim: int) -> np.ndarray:
        if cfg.has("scale"):  # (one value for every column)
            return np.full(dim, cfg.get_float("scale"), np.float32)
        return randn(rng, dim)

    kaldi_fields = (
        REPEATED_OPENING,
        Field("<Scales>", "scales", "vector", finite="scales", check=non_empty),
    )

    def propagate(self, indexes, in_value, out_value):
        _times_scales(in_value, self.scales, out_value)
        return None

    def backprop(self, indexes, in_value, out_value, out_deriv, memo, grad, in_deriv) -> None:
        if in_deriv is not None:
            _times_scales(out_deriv, self.scales, in_deriv)


@register
class FixedBiasComponent(_FixedVectorComponent):
    """y = x + bias, fixed."""

    type_name = "FixedBiasComponent"
    vector_name = "bias"

    def __init__(self, bias: np.ndarray):
        self.bias = np.asarray(bias, np.float32)

    kaldi_fields = (
        REPEATED_OPENING,
        Field("<Bias>", "bias", "vector", finite="bias", check=non_empty),
    )

    def propagate(self, indexes, in_value, out_value):
        xp = namespace(in_value)
        xp.add(in_value, xp.param(self.bias, in_value), out=out_value)
        return None

    def backprop(self, indexes, in_value, out_value, out_deriv, memo, grad, in_deriv) -> None:
        if in_deriv is not None and in_deriv is not out_deriv:
            in_deriv[...] = out_deriv


# -- trainable per-element scale -----------------------------------------------------


@register
class PerElementScaleComponent(UpdatableComponent):
    """y = x * scales, scales trainable (gradient name ``scales``)."""

    type_name = "PerElementScaleComponent"

    def __init__(self, scales: np.ndarray):
        super().__init__()
        self.scales = np.asarray(scales, np.float32)

    @property
    def input_dim(self) -> int:
        return self.scales.shape[0]

    output_dim = input_dim

    def properties(self) -> Flags:
        return (Flags.SIMPLE | Flags.UPDATABLE | Flags.BACKPROP_NEEDS_INPUT
                | Flags.PROPAGATE_IN_PLACE | Flags.BACKPROP_IN_PLACE)

    @classmethod
    def from_config(cls, cfg, rng: np.random.Generator) -> PerElementScaleComponent:
        comp = cls(np.zeros(0))
        comp._init_extra(cfg)
        init_learning_rates(comp, cfg)
        # NaturalGradientPerElementScale names its file option "scales", the plain
        # type "vector".
        key = "scales" if cls is NaturalGradientPerElementScaleComponent else "vector"
        if cfg.has(key):
            comp.scales = load_kaldi_object(cfg, key, "vector")
            if cfg.has("dim"):
                require(cfg.get_int("dim") == comp.input_dim, cfg, "dim mismatch vs. vector")
        else:
            dim = cfg.get_int("dim", required=True)
            mean = cfg.get_float("param-mean", 1.0)
            stddev = cfg.get_float("param-stddev", 0.0)
            require(dim > 0 and stddev >= 0.0, cfg, "dim must be > 0 and param-stddev >= 0")
            comp.scales = randn(rng, dim) * np.float32(stddev) + np.float32(mean)
        cfg.check_all_used()
        return comp

    def _init_extra(self, cfg) -> None:
        """Subclass hook for extra config options."""

    kaldi_fields = (
        UPDATABLE_HEADER,
        Field("<Params>", "scales", "vector", finite="scales"),
        LEGACY_IS_GRADIENT,
    )

    @classmethod
    def empty_for_read(cls) -> PerElementScaleComponent:
        return cls(np.zeros(0, np.float32))

    def params(self) -> dict[str, np.ndarray]:
        return {"scales": self.scales}

    def propagate(self, indexes, in_value, out_value):
        _times_scales(in_value, self.scales, out_value)
        return None

    def backprop(self, indexes, in_value, out_value, out_deriv, memo, grad, in_deriv) -> None:
        # The gradient first: in_deriv may alias out_deriv.
        if preconditioners(grad) is not None:  # a trainer's natural gradient
            precondition_rows(grad, "scales", in_value * out_deriv)
        else:
            _add_grad(grad, "scales",
                      namespace(out_deriv).einsum("ij,ij->j", out_deriv, in_value))
        if in_deriv is not None:
            _times_scales(out_deriv, self.scales, in_deriv)


@register
class NaturalGradientPerElementScaleComponent(PerElementScaleComponent):
    """PerElementScaleComponent with a natural-gradient update; keeps the
    preconditioner settings (rank, update period, history, alpha) for the file."""

    type_name = "NaturalGradientPerElementScaleComponent"

    def __init__(self, scales: np.ndarray):
        super().__init__(scales)
        self.rank, self.update_period = 8, 10
        self.num_samples_history, self.alpha = 2000.0, 4.0

    def _init_extra(self, cfg) -> None:
        self.rank = cfg.get_int("rank", 8)
        self.update_period = cfg.get_int("update-period", 10)
        self.num_samples_history = f32(cfg.get_float("num-samples-history", 2000.0))
        self.alpha = f32(cfg.get_float("alpha", 4.0))

    kaldi_fields = (
        UPDATABLE_HEADER,
        Field("<Params>", "scales", "vector", finite="scales"),
        Field("<IsGradient>", "is_gradient", "bool"),
        Field("<Rank>", "rank", "int"),
        Field("<UpdatePeriod>", "update_period", "int"),
        Field("<NumSamplesHistory>", "num_samples_history", "float"),
        Field("<Alpha>", "alpha", "float"),
        skip_optional("<MaxChangePerMinibatch>", "float"),  # long removed; dropped
    )


# -- trainable per-element offset -----------------------------------------------------


@register
class PerElementOffsetComponent(UpdatableComponent):
    """y = x + offsets, with ``offsets`` of block-dim values repeated over ``dim``."""

    type_name = "PerElementOffsetComponent"

    def __init__(self, offsets: np.ndarray, dim: int | None = None):
        super().__init__()
        self.offsets = np.asarray(offsets, np.float32)
        self.dim = self.offsets.shape[0] if dim is None else int(dim)
        self.use_natural_gradient = True

    @property
    def input_dim(self) -> int:
        return self.dim

    output_dim = input_dim

    def properties(self) -> Flags:
        flags = (Flags.SIMPLE | Flags.UPDATABLE | Flags.BACKPROP_IN_PLACE
                 | Flags.PROPAGATE_IN_PLACE)
        if self.dim != self.offsets.shape[0]:
            flags |= Flags.OUTPUT_CONTIGUOUS
        return flags

    @classmethod
    def from_config(cls, cfg, rng: np.random.Generator) -> PerElementOffsetComponent:
        comp = cls(np.zeros(0))
        init_learning_rates(comp, cfg)
        if cfg.has("vector"):
            comp.offsets = load_kaldi_object(cfg, "vector", "vector")
            comp.dim = cfg.get_int("dim", comp.offsets.shape[0])
            require(comp.dim > 0 and comp.offsets.shape[0] % comp.dim == 0, cfg,
                    f"invalid dimension dim={comp.dim}")
        else:
            comp.dim = cfg.get_int("dim", required=True)
            require(comp.dim > 0, cfg, f"invalid dimension dim={comp.dim}")
            mean = cfg.get_float("param-mean", 0.0)
            stddev = cfg.get_float("param-stddev", 0.0)
            block_dim = cfg.get_int("block-dim", comp.dim)
            require(block_dim > 0 and comp.dim % block_dim == 0, cfg,
                    f"invalid value block-dim={block_dim}")
            comp.offsets = randn(rng, block_dim) * np.float32(stddev) + np.float32(mean)
        comp.use_natural_gradient = cfg.get_bool("use-natural-gradient", True)
        cfg.check_all_used()
        return comp

    # Old files end after the offsets: dim = block dim, natural gradient on.
    kaldi_fields = (
        UPDATABLE_HEADER,
        Field("<Offsets>", "offsets", "vector", finite="offsets"),
        LEGACY_IS_GRADIENT,
        Field("<Dim>", "dim", "int", default=lambda c: c.offsets.shape[0],
              check=_multiple_of_offsets,
              then=(Field("<UseNaturalGradient>", "use_natural_gradient", "bool",
                          default=True),)),
    )

    @classmethod
    def empty_for_read(cls) -> PerElementOffsetComponent:
        return cls(np.zeros(0, np.float32))

    def params(self) -> dict[str, np.ndarray]:
        return {"offsets": self.offsets}

    def propagate(self, indexes, in_value, out_value):
        reps = self.dim // self.offsets.shape[0]
        xp = namespace(in_value)
        xp.add(in_value, xp.tile(xp.param(self.offsets, in_value), reps), out=out_value)
        return None

    def backprop(self, indexes, in_value, out_value, out_deriv, memo, grad, in_deriv) -> None:
        if not precondition_rows(grad, "offsets", _blocks(out_deriv, self.offsets.shape[0])):
            _add_grad(grad, "offsets", namespace(out_deriv).sum(
                _blocks(out_deriv, self.offsets.shape[0]), axis=0))
        if in_deriv is not None and in_deriv is not out_deriv:
            in_deriv[...] = out_deriv


# -- trainable scale and offset --------------------------------------------------------


@register
class ScaleAndOffsetComponent(UpdatableComponent):
    """y = x * s + o per block of ``block-dim`` columns, where s is ``scales`` with
    values closer to zero than 1e-4 moved out to +-1e-4 (Kaldi's EnsureNonzero).

    The backprop consumes the OUTPUT (Kaldi reconstructs the input from it), and
    Kaldi's input derivative uses the raw scales, not the nonzero-ensured ones;
    both reproduced here.
    """

    type_name = "ScaleAndOffsetComponent"
    EPSILON = 1.0e-4

    def __init__(self, scales: np.ndarray, offsets: np.ndarray, dim: int | None = None):
        super().__init__()
        self.scales = np.asarray(scales, np.float32)
        self.offsets = np.asarray(offsets, np.float32)
        self.dim = self.scales.shape[0] if dim is None else int(dim)
        self.use_natural_gradient = True
        self.rank = 20

    @property
    def input_dim(self) -> int:
        return self.dim

    output_dim = input_dim

    def properties(self) -> Flags:
        flags = (Flags.SIMPLE | Flags.UPDATABLE | Flags.BACKPROP_IN_PLACE
                 | Flags.PROPAGATE_IN_PLACE | Flags.BACKPROP_NEEDS_OUTPUT)
        if self.dim != self.scales.shape[0]:
            flags |= Flags.INPUT_CONTIGUOUS | Flags.OUTPUT_CONTIGUOUS
        return flags

    @classmethod
    def from_config(cls, cfg, rng: np.random.Generator) -> ScaleAndOffsetComponent:
        comp = cls(np.zeros(0), np.zeros(0))
        init_learning_rates(comp, cfg)
        dim = cfg.get_int("dim", required=True)
        require(dim > 0, cfg, "dim must be > 0")
        comp.use_natural_gradient = cfg.get_bool("use-natural-gradient", True)
        block_dim = cfg.get_int("block-dim", dim)
        require(block_dim > 0 and dim % block_dim == 0, cfg, f"invalid block-dim={block_dim}")
        comp.rank = cfg.get_int("rank", 20)
        comp.dim = dim
        comp.scales = np.ones(block_dim, np.float32)  # Kaldi: unit scale, zero offset
        comp.offsets = np.zeros(block_dim, np.float32)
        cfg.check_all_used()
        return comp

    kaldi_fields = (
        UPDATABLE_HEADER,
        Field("<Dim>", "dim", "int"),
        Field("<Scales>", "scales", "vector", finite="scales"),
        Field("<Offsets>", "offsets", "vector", finite="offsets", check=_blocks_agree),
        Field("<UseNaturalGradient>", "use_natural_gradient", "bool"),
        Field("<Rank>", "rank", "int"),
    )

    @classmethod
    def empty_for_read(cls) -> ScaleAndOffsetComponent:
        return cls(np.zeros(0, np.float32), np.zeros(0, np.float32))

    def params(self) -> dict[str, np.ndarray]:
        return {"scales": self.scales, "offsets": self.offsets}

    def export_gradient(self, grad):
        xp = namespace(grad["scales"])
        return {"params_vectorized": xp.concatenate([grad["scales"], grad["offsets"]])}

    def _nonzero_scales(self, like):
        """The scales with magnitudes below EPSILON raised to +-EPSILON, in float32 as
        Kaldi keeps them, as an array of ``like``'s backend and device (made there
        from the parameter's device copy: nothing uploaded per call)."""
        xp = namespace(like)
        s = xp.param(self.scales, like)
        if self.scales.dtype == np.float32:  # (an exact round trip to Kaldi's float)
            s = xp.astype(s, xp.float32)
        # (a Python float holding the parameters' EPSILON: compared and placed in s's dtype)
        eps = float(self.scales.dtype.type(self.EPSILON))
        # (NumPy's where of two Python floats is float64: back to s's dtype)
        return xp.astype(xp.where(xp.abs(s) >= eps, s, xp.where(s >= 0, eps, -eps)), s.dtype)

    def propagate(self, indexes, in_value, out_value):
        xp, block = namespace(in_value), self.scales.shape[0]
        y = _blocks(in_value, block) * xp.astype(self._nonzero_scales(in_value),
                                                 in_value.dtype)
        y += xp.param(self.offsets, in_value)
        out_value[...] = y.reshape(out_value.shape)
        return None

    def backprop(self, indexes, in_value, out_value, out_deriv, memo, grad, in_deriv) -> None:
        xp, block = namespace(out_deriv), self.scales.shape[0]
        dy = _blocks(out_deriv, block)
        if grad is not None:
            if not precondition_rows(grad, "offsets", dy, "offset"):  # (trainer's NG)
                _add_grad(grad, "offsets", xp.sum(dy, axis=0))
            # Kaldi reconstructs the input from the output: x = (y - o) * (1/s).
            # (the reciprocal in the parameters' precision, then the run's dtype)
            inv = xp.astype(1 / self._nonzero_scales(out_deriv), out_deriv.dtype)
            x = (_blocks(out_value, block) - xp.param(self.offsets, out_deriv)) * inv
            if preconditioners(grad) is not None:
                precondition_rows(grad, "scales", x * dy, "scale")
            else:
                _add_grad(grad, "scales", xp.einsum("ij,ij->j", x, dy))
        if in_deriv is not None:
            dx = dy * xp.param(self.scales, out_deriv)
            in_deriv[...] = dx.reshape(in_deriv.shape)


# -- constant outputs ------------------------------------------------------------------


class _ConstantBase(UpdatableComponent):
    """Shared parts of ConstantComponent / ConstantFunctionComponent: an output
    vector (gradient name ``output``), optionally trainable."""

    def __init__(self, output: np.ndarray):
        super().__init__()
        self.output = np.asarray(output, np.float32)
        self.is_updatable_ = True
        self.use_natural_gradient = True

    @property
    def output_dim(self) -> int:
        return self.output.shape[0]

    def _init_output(self, cfg, rng) -> None:
        output_dim = cfg.get_int("output-dim", required=True)
        self.is_updatable_ = cfg.get_bool("is-updatable", True)
        self.use_natural_gradient = cfg.get_bool("use-natural-gradient", True)
        mean = cfg.get_float("output-mean", 0.0)
        stddev = cfg.get_float("output-stddev", 0.0)
        require(output_dim > 0, cfg, "output-dim must be > 0")
        self.output = randn(rng, output_dim) * np.float32(stddev) + np.float32(mean)

    _OUTPUT_TAIL = (
        Field("<Output>", "output", "vector", finite="output"),
        Field("<IsUpdatable>", "is_updatable_", "bool"),
        Field("<UseNaturalGradient>", "use_natural_gradient", "bool"),
    )

    @classmethod
    def empty_for_read(cls) -> _ConstantBase:
        return cls(np.zeros(0, np.float32))

    def params(self) -> dict[str, np.ndarray]:
        return {"output": self.output} if self.is_updatable_ else {}

    def propagate(self, indexes, in_value, out_value):
        out_value[...] = namespace(out_value).param(self.output, out_value)
        return None

    def backprop(self, indexes, in_value, out_value, out_deriv, memo, grad, in_deriv) -> None:
        # The output does not depend on the input: its derivative is zero, and
        # with BACKPROP_ADDS (ConstantFunction) nothing needs to be written.
        if not precondition_rows(grad, "output", out_deriv):  # (a trainer's NG)
            _add_grad(grad, "output", namespace(out_deriv).sum(out_deriv, axis=0))


@register
class ConstantFunctionComponent(_ConstantBase):
    """A simple component whose output rows are all the same vector, whatever the
    input (the input only gives the rows)."""

    type_name = "ConstantFunctionComponent"

    def __init__(self, output: np.ndarray, input_dim: int = -1):
        super().__init__(output)
        self.input_dim_ = int(input_dim)

    @property
    def input_dim(self) -> int:
        return self.input_dim_

    def properties(self) -> Flags:
        flags = Flags.SIMPLE | Flags.BACKPROP_ADDS
        if self.is_updatable_:
            flags |= Flags.UPDATABLE
        if self.input_dim == self.output_dim:
            flags |= Flags.PROPAGATE_IN_PLACE
        return flags

    @classmethod
    def from_config(cls, cfg, rng: np.random.Generator) -> ConstantFunctionComponent:
        comp = cls(np.zeros(0))
        init_learning_rates(comp, cfg)
        comp.input_dim_ = cfg.get_int("input-dim", required=True)
        require(comp.input_dim_ > 0, cfg, "input-dim must be > 0")
        comp._init_output(cfg, rng)
        cfg.check_all_used()
        return comp

    kaldi_fields = (
        LENIENT_HEADER,
        Field("<InputDim>", "input_dim_", "int"),
        *_ConstantBase._OUTPUT_TAIL,
    )


@register
class ConstantComponent(_ConstantBase):
    """A non-simple component with NO input dependencies: every requested output
    index gets the same vector. Its nominal input dim equals its output dim
    (a don't-care, as in Kaldi); propagate ignores ``in_value``."""

    type_name = "ConstantComponent"

    @property
    def input_dim(self) -> int:
        return self.output_dim

    def properties(self) -> Flags:
        return Flags.UPDATABLE if self.is_updatable_ else Flags.NONE

    @classmethod
    def from_config(cls, cfg, rng: np.random.Generator) -> ConstantComponent:
        comp = cls(np.zeros(0))
        init_learning_rates(comp, cfg)
        comp._init_output(cfg, rng)
        cfg.check_all_used()
        return comp

    kaldi_fields = (LENIENT_HEADER, *_ConstantBase._OUTPUT_TAIL)

    def input_indexes(self, output_indexes: np.ndarray) -> InputDeps:
        # No inputs at all; with no required dependency every output is computable.
        return InputDeps(np.zeros(0, np.int64), np.zeros((0, 3), np.int64),
                         np.zeros(0, bool), any_suffices=False)

    def backprop(self, indexes, in_value, out_value, out_deriv, memo, grad, in_deriv) -> None:
        super().backprop(indexes, in_value, out_value, out_deriv, memo, grad, in_deriv)
        if in_deriv is not None:
            in_deriv[...] = 0  # no BACKPROP_ADDS flag: assign the (zero) derivative
