"""The component contract: what every layer type provides to the compiler and runtime.

A component is the math of one layer (Kaldi's ``Component``). The compiler relies
on its property :class:`Flags`, so they must be exactly Kaldi's. The runtime calls
:meth:`Component.propagate` / :meth:`Component.backprop` on row blocks:

* ``in_value``  [rows_in, input_dim]   the component's input rows
* ``out_value`` [rows_out, output_dim] written by propagate (assigned, or added to
  when the component has ``PROPAGATE_ADDS``)
* ``out_deriv`` [rows_out, output_dim]
* ``in_deriv``  [rows_in, input_dim] or None; assigned by backprop (added to when
  ``BACKPROP_ADDS``). May alias ``out_deriv`` when ``BACKPROP_IN_PLACE``.
* ``grad``      None, or a dict ``{param_name: array}`` shaped like :meth:`params`;
  backprop ADDS the plain gradient of sum(out_value * out_deriv) to it (learning
  rate 1, natural gradient off: what Kaldi computes into a zeroed gradient copy).
* ``indexes``   the object from :meth:`precompute_indexes` (None for most simple
  components).

For *simple* components (``SIMPLE`` flag) row i of the output depends only on row
i of the input and rows_in == rows_out. Non-simple components also describe which
input indexes an output index needs (:meth:`input_indexes`) and precompute how
rows map (:meth:`precompute_indexes`), both vectorized over ``(k, 3)`` int arrays of
``(n, t, x)``.

Math runs in the dtype of ``in_value`` (float32 normally, float64 for gradient
checks); parameters are cast as needed.

Optional hooks the compiler looks up by name (a component without them loses
only speed):

* ``reorder_indexes(input_indexes, output_indexes) -> (input, output)``: Kaldi's
  ReorderIndexes; taken when it is a pure permutation of both.
* ``output_time_bounds((t_lo, t_hi)) -> (t_lo, t_hi)``: bounds on the computable
  output t given bounds on the computable input t (default: unbounded).
* ``input_indexes_within(output_indexes, t_lo, t_hi) -> InputDeps``:
  :meth:`input_indexes` without the dependencies outside ``[t_lo, t_hi]`` (which
  can never be computable), for components with very wide windows.
* ``stretch_precomputed(mini_indexes, input_indexes, output_indexes, need_backprop,
  stretch_rows)``: shortcut expansion's cheaper :meth:`precompute_indexes` for N
  sequences from the two-sequence object (:class:`pynnet3.cache.expand.RowMapStretch`).
"""

from __future__ import annotations

import enum
import sys
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from .. import limits
from ..errors import ComputeError, ConfigError, FormatError
from .fields import Field, Step, check_finite, read_fields, write_fields


class Flags(enum.IntFlag):
    """Kaldi's ``ComponentProperties`` (same bit values)."""

    NONE = 0
    SIMPLE = 0x001
    UPDATABLE = 0x002
    PROPAGATE_IN_PLACE = 0x004
    PROPAGATE_ADDS = 0x008
    REORDERS_INDEXES = 0x010
    BACKPROP_ADDS = 0x020
    BACKPROP_NEEDS_INPUT = 0x040
    BACKPROP_NEEDS_OUTPUT = 0x080
    BACKPROP_IN_PLACE = 0x100
    STORES_STATS = 0x200
    INPUT_CONTIGUOUS = 0x400
    OUTPUT_CONTIGUOUS = 0x800
    USES_MEMO = 0x1000
    RANDOM = 0x2000

    # Components build their properties with a few ORs on every properties() call,
    # and Enum's own | and & make each result through the enum constructor (about a
    # microsecond apiece); a combination seen once is a member of the value map
    # (Flag keeps its pseudo-members there), so later ones are one dict lookup.
    def __or__(self, other):
        value = other._value_ if type(other) is Flags else _int_value(other)
        if value is NotImplemented:
            return value
        value |= self._value_
        member = _FLAGS_BY_VALUE.get(value)
        return member if member is not None else Flags(value)

    def __and__(self, other):
        value = other._value_ if type(other) is Flags else _int_value(other)
        if value is NotImplemented:
            return value
        value &= self._value_
        member = _FLAGS_BY_VALUE.get(value)
        return member if member is not None else Flags(value)

    __ror__ = __or__
    __rand__ = __and__


_FLAGS_BY_VALUE = Flags._value2member_map_


def _int_value(other):
    return int(other) if isinstance(other, int) else NotImplemented


@dataclass
class InputDeps:
    """For non-simple components: the input indexes each output index needs.

    Ragged, flattened: dependency j belongs to output row ``owner[j]`` and is the
    input index ``indexes[j]`` (n, t, x). ``required[j]`` False marks inputs that
    are used when available but don't block computability (Kaldi's IsComputable
    with optional inputs). When ``any_suffices`` is True an output is computable
    when at least one of its dependencies is available (statistics components).
    """

    owner: np.ndarray  # (m,) int64
    indexes: np.ndarray  # (m, 3) int64
    required: np.ndarray  # (m,) bool
    any_suffices: bool = False


_REGISTRY: dict[str, type[Component]] = {}


def overwrite_by_zeroing(comp, indexes, in_value, out_value):
    """A component's ``propagate_overwrite`` (a propagate into an output of
    undefined contents, PROPAGATE_ADDS's zeroing skipped) for a class whose
    ``propagate`` is not the one its ``propagate_overwrite`` mirrors (a user's
    subclass): zero, then propagate."""
    out_value[...] = 0
    return comp.propagate(indexes, in_value, out_value)


def register(cls):
    """Class decorator: make a component type known by its Kaldi type name. While a
    built-in family module is being imported late (on demand, or directly by another
    module), its classes do not replace one the user registered under that name
    first, as when every family was imported with the package; a later explicit
    ``register(cls)`` always does (a user restoring a built-in class)."""
    held = _REGISTRY.get(cls.type_name)
    if (held is not None and held is not cls and _family_loading(cls)
            and not _family_loading(held) and not _is_builtin(held)):
        return cls
    _REGISTRY[cls.type_name] = cls
    return cls


def _is_builtin(cls) -> bool:
    return cls.__module__.startswith(__package__ + ".")


def _family_loading(cls) -> bool:
    """Whether ``cls`` is a built-in class whose module is being imported now."""
    if not _is_builtin(cls):
        return False
    spec = getattr(sys.modules.get(cls.__module__), "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


# Kaldi type name -> family module (of this package) imported when the type is first
# asked for: the families few networks use (components/__init__.py fills it).
_ON_DEMAND: dict[str, str] = {}


def _import_family(module: str) -> None:
    """Import a family module. A type the user registered before keeps the user's
    class, as when every family was imported with the package (before any @register
    of the user's)."""
    import importlib

    before = dict(_REGISTRY)
    try:
        importlib.import_module(f"{__package__}.{module}")
    finally:
        _REGISTRY.update(before)


def component_types() -> dict[str, type[Component]]:
    for module in dict.fromkeys(_ON_DEMAND.values()):
        _import_family(module)
    return dict(_REGISTRY)


def component_class(type_name: str) -> type[Component] | None:
    cls = _REGISTRY.get(type_name)
    if cls is None and type_name in _ON_DEMAND:
        _import_family(_ON_DEMAND[type_name])
        cls = _REGISTRY.get(type_name)
    return cls


class Component:
    """Base class of every component type (see module docstring for the contract)."""

    type_name: ClassVar[str] = "Component"
    # The file body as a declarative field list (see fields.py); None where the class
    # writes its own read/write.
    kaldi_fields: ClassVar[tuple[Step, ...] | None] = None

    # -- structure -------------------------------------------------------------
    @property
    def input_dim(self) -> int:
        raise NotImplementedError

    @property
    def output_dim(self) -> int:
        raise NotImplementedError

    def properties(self) -> Flags:
        raise NotImplementedError

    def is_updatable(self) -> bool:
        return bool(self.properties() & Flags.UPDATABLE)

    def is_simple(self) -> bool:
        return bool(self.properties() & Flags.SIMPLE)

    # -- construction and files ----------------------------------------------------
    @classmethod
    def from_config(cls, cfg, rng: np.random.Generator) -> Component:
        """Initialize from a config line (``ConfigLine``), like ``nnet3-init``.
        Implementations must call ``cfg.check_all_used()``."""
        raise NotImplementedError

    @classmethod
    def read(cls, r) -> Component:
        """Read the body after the opening ``<TypeName>`` token, through the
        closing ``</TypeName>`` token, from a ``KaldiReader``. Default: the
        ``kaldi_fields`` list, into ``cls()``."""
        if cls.kaldi_fields is None:
            raise NotImplementedError
        comp = cls.empty_for_read()
        read_fields(r, comp, cls.kaldi_fields)
        comp.read_end(r)
        return comp

    def read_end(self, r) -> None:
        """After the ``kaldi_fields``: consume ``</TypeName>`` (override for Kaldi's
        lenient closings, or to check the fields against each other)."""
        read_closing(r, self.type_name)

    @classmethod
    def empty_for_read(cls) -> Component:
        """The instance the default :meth:`read` fills in (override where the
        constructor needs arguments)."""
        return cls()

    def write(self, w) -> None:
        """Write ``<TypeName> ... </TypeName> `` to a ``KaldiWriter``, exactly as Kaldi.
        Default: the ``kaldi_fields`` list."""
        if self.kaldi_fields is None:
            raise NotImplementedError
        w.write_token(f"<{self.type_name}>")
        write_fields(w, self, self.kaldi_fields)
        w.write_token(f"</{self.type_name}>")

    def info(self) -> str:
        """One line for ``nnet3-info``-style listings."""
        return f"type={self.type_name}, input-dim={self.input_dim}, output-dim={self.output_dim}"

    def copy(self) -> Component:
        import copy

        return copy.deepcopy(self)

    # -- parameters --------------------------------------------------------------
    def params(self) -> dict[str, np.ndarray]:
        """Live references to the trainable arrays, by their gradient names
        (``linear_params``, ``bias_params``, ...); empty if not updatable."""
        return {}

    def export_gradient(self, grad: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Map a gradient dict (shaped like :meth:`params`) to the names and shapes
        of the reference data (e.g. ``params_vectorized``). Default: unchanged."""
        return dict(grad)

    def num_params(self) -> int:
        return int(sum(p.size for p in self.params().values()))

    def set_test_mode(self, test_mode: bool) -> None:
        """Dropout / BatchNorm style components switch behaviour; others ignore."""

    # -- non-simple components -----------------------------------------------------
    def input_indexes(self, output_indexes: np.ndarray) -> InputDeps:
        """Which input indexes each output index needs. Simple components: itself."""
        k = len(output_indexes)
        return InputDeps(np.arange(k, dtype=np.int64), np.asarray(output_indexes, np.int64),
                         np.ones(k, dtype=bool))

    def precompute_indexes(self, input_indexes: np.ndarray, output_indexes: np.ndarray,
                           need_backprop: bool) -> Any:
        """Given the actual row order of the input and output matrices, build
        whatever propagate/backprop need (gather maps, ...). None if nothing."""
        return None

    # -- math ----------------------------------------------------------------------
    def propagate(self, indexes, in_value: np.ndarray, out_value: np.ndarray) -> Any:
        """Write the output into ``out_value``; return a memo (or None)."""
        raise NotImplementedError

    def backprop(self, indexes, in_value, out_value, out_deriv, memo, grad, in_deriv) -> None:
        raise NotImplementedError

    def store_stats(self, in_value, out_value, memo) -> None:
        """Accumulate statistics (components with ``STORES_STATS``)."""

    def zero_stats(self) -> None:
        """Reset accumulated statistics (Kaldi's ZeroComponentStats)."""


class SameDimComponent(Component):
    """A ``dim -> dim`` component: both dims are ``self.dim``."""

    dim: int = 0

    @property
    def input_dim(self) -> int:
        return self.dim

    @property
    def output_dim(self) -> int:
        return self.dim


class InOutComponent(Component):
    """A component whose dims are the plain fields ``_input_dim`` / ``_output_dim``."""

    _input_dim: int = 0
    _output_dim: int = 0

    @property
    def input_dim(self) -> int:
        return self._input_dim

    @property
    def output_dim(self) -> int:
        return self._output_dim


def output_divides_input(tag: str, value: int, comp: InOutComponent) -> str | None:
    """Field check for ``<OutputDim>`` of a component that reduces groups of inputs."""
    if comp._input_dim > 0 and value > 0 and comp._input_dim % value == 0:
        return None
    return f"bad {comp.type_name} dims {comp._input_dim} -> {value}"


# <InputDim> <OutputDim> of a component that reduces groups of inputs (Pnorm, SumBlock).
REDUCING_DIMS = (Field("<InputDim>", "_input_dim", "int"),
                 Field("<OutputDim>", "_output_dim", "int", check=output_divides_input))


class UpdatableComponent(Component):
    """Shared fields and file header of Kaldi's UpdatableComponent.

    Kaldi writes ``<Type> [<LearningRateFactor> f] [<IsGradient> T] [<MaxChange> f]
    [<L2Regularize> f] <LearningRate> f`` and reads the optional tokens in that order.
    """

    def __init__(self):
        self.learning_rate = 0.001
        self.learning_rate_factor = 1.0
        self.is_gradient = False
        self.max_change = 0.0
        self.l2_regularize = 0.0

    def init_updatable_from_config(self, cfg) -> None:
        """Kaldi's InitLearningRatesFromConfig: learning-rate, learning-rate-factor,
        max-change and l2-regularize as float32 holds them (BaseFloat members), none
        negative ("Bad initializer": a negative max-change would turn the
        max-change factor negative in training)."""
        for attr, key, default in (("learning_rate", "learning-rate", 0.001),
                                   ("learning_rate_factor", "learning-rate-factor", 1.0),
                                   ("max_change", "max-change", 0.0),
                                   ("l2_regularize", "l2-regularize", 0.0)):
            value = cfg.get_float(key, default)
            require(value >= 0.0, cfg, f"{key}={value} must be >= 0")
            setattr(self, attr, float(np.float32(value)))

    def read_updatable_common(self, r) -> None:
        """Read the common header (after the opening ``<Type>`` token)."""
        tok = r.read_token()
        if tok == "<LearningRateFactor>":
            self.learning_rate_factor = r.read_float()
            tok = r.read_token()
        if tok == "<IsGradient>":
            self.is_gradient = r.read_bool()
            tok = r.read_token()
        if tok == "<MaxChange>":
            self.max_change = r.read_float()
            tok = r.read_token()
        if tok == "<L2Regularize>":
            self.l2_regularize = r.read_float()
            tok = r.read_token()
        if tok != "<LearningRate>":
            raise r.error("expected <LearningRate>", token=tok)
        self.learning_rate = r.read_float()

    def write_updatable_common(self, w) -> None:
        w.write_token(f"<{self.type_name}>")
        self.write_updatable_header(w)

    def write_updatable_header(self, w) -> None:
        """The common header after the opening token (fields.UPDATABLE_HEADER)."""
        if self.learning_rate_factor != 1.0:
            w.write_tagged("<LearningRateFactor>", "float", self.learning_rate_factor)
        if self.is_gradient:
            w.write_tagged("<IsGradient>", "bool", True)
        if self.max_change > 0.0:
            w.write_tagged("<MaxChange>", "float", self.max_change)
        if self.l2_regularize > 0.0:
            w.write_tagged("<L2Regularize>", "float", self.l2_regularize)
        w.write_tagged("<LearningRate>", "float", self.learning_rate)

    def updatable_info(self) -> str:
        s = f", learning-rate={self.learning_rate:g}"
        if self.learning_rate_factor != 1.0:
            s += f", learning-rate-factor={self.learning_rate_factor:g}"
        if self.max_change > 0:
            s += f", max-change={self.max_change:g}"
        return s


def read_closing(r, type_name: str) -> None:
    """Consume ``</TypeName>``, naming the token if something else is there."""
    r.expect_token(f"</{type_name}>")


def require(cond: bool, cfg, message: str) -> None:
    """Config validation helper: raise ConfigError naming the line."""
    if not cond:
        if cfg is not None and hasattr(cfg, "error"):
            raise cfg.error(message)
        raise ConfigError(message)


def check_dims(comp: Component) -> str | None:
    """None when the component's input and output dims are within ``max_dim``
    (pynnet3.limits), else why not (dims derived from several options, such as an
    attention context, are only known once the component is made)."""
    for what, dim in (("input-dim", comp.input_dim), ("output-dim", comp.output_dim)):
        problem = limits.exceeded("max_dim", dim, f"{comp.type_name} {what}")
        if problem:
            return problem
    return None


def check_table_rows(rows: int, what: str) -> None:
    """ComputeError when an index table a component is about to build would have
    more than ``max_rows`` rows (pynnet3.limits): raised before allocating it."""
    problem = limits.exceeded("max_rows", rows, what)
    if problem:
        raise ComputeError(problem)


__all__ = [
    "Component", "UpdatableComponent", "SameDimComponent", "InOutComponent", "Flags",
    "InputDeps", "register", "component_types", "component_class", "read_closing",
    "output_divides_input", "REDUCING_DIMS", "require", "check_dims", "check_finite",
    "check_table_rows", "FormatError",
]
