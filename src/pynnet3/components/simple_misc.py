"""Small parameter-free components: SumGroup, SumBlock, NoOp, ClipGradient,
BackpropTruncation, ElementwiseProduct and Permute.

Most are simple (row i of the output depends on row i of the input). The
exception is BackpropTruncation, whose derivative zeroing depends on each row's
(n, t) index; its :meth:`~BackpropTruncationComponent.precompute_indexes` turns
the indexes into a per-row zeroing mask (and a row map, since the compiler may
hand over the input rows in another order than the output rows).

ClipGradient and BackpropTruncation keep counters (elements clipped, processed,
...) that Kaldi updates only in a training backprop (when it passes a component
"to update"); here that is signalled by ``grad is not None`` and the component's
own counters are updated.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ComputeError, ConfigError
from . import device_stats
from .base import (
    REDUCING_DIMS,
    Component,
    Flags,
    InOutComponent,
    SameDimComponent,
    read_closing,
    register,
    require,
)
from .device_stats import stats_attribute
from .fields import Custom, Field, positive
from .nonlinear import f32
from .precomputed import (
    expect_fields,
    float_array,
    float_field,
    int_array,
    plain_indexes,
    same_rows,
)
from .xp import namespace


def _positive_sizes(tag: str, sizes: np.ndarray, comp) -> str | None:
    if sizes.size and np.all(sizes > 0):
        return None
    return f"{tag} must be non-empty and positive"


def _two_or_more_groups(tag: str, output_dim: int, comp) -> str | None:
    """ElementwiseProduct multiplies input_dim / output_dim (>= 2) blocks."""
    input_dim = comp._input_dim
    if output_dim > 0 and input_dim > output_dim and input_dim % output_dim == 0:
        return None
    return f"bad {comp.type_name} dims {input_dim} -> {output_dim}"


def _row_norms_sq(m: np.ndarray) -> np.ndarray:
    return namespace(m).sum(m * m, axis=1)


class _Dim(SameDimComponent):
    """A ``dim -> dim`` component (shared plumbing)."""

    def __init__(self, dim: int = 0) -> None:
        self.dim = int(dim)


class _InOut(InOutComponent):
    """An ``input_dim -> output_dim`` component written as ``<InputDim> <OutputDim>``."""

    def __init__(self, input_dim: int = 0, output_dim: int = 0) -> None:
        self._input_dim = int(input_dim)
        self._output_dim = int(output_dim)


# ----------------------------------------------------------------------------------
@register
class SumGroupComponent(Component):
    """Sums consecutive groups of input columns: output column g is the sum of the
    ``sizes[g]`` inputs after the previous groups. Backprop copies each output
    derivative back to every column of its group."""

    type_name = "SumGroupComponent"

    def __init__(self, sizes=(1,)) -> None:
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self._starts = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)
        self._reverse = np.repeat(np.arange(self.sizes.size), self.sizes)

    @property
    def input_dim(self) -> int:
        return int(self.sizes.sum())

    @property
    def output_dim(self) -> int:
        return int(self.sizes.size)

    def properties(self) -> Flags:
        return Flags.SIMPLE

    @classmethod
    def from_config(cls, cfg, rng: np.random.Generator | None = None) -> SumGroupComponent:
        if cfg.has("sizes"):
            sizes = cfg.get_int_list("sizes")
            cfg.check_all_used()
            require(len(sizes) > 0 and all(s > 0 for s in sizes), cfg,
                    "sizes= must be a non-empty list of positive integers")
            return cls(sizes)
        input_dim = cfg.get_int("input-dim", required=True)
        output_dim = cfg.get_int("output-dim", required=True)
        cfg.check_all_used()
        require(output_dim > 0 and input_dim > 0 and input_dim % output_dim == 0, cfg,
                f"input-dim={input_dim} must be a positive multiple of "
                f"output-dim={output_dim}")
        return cls([input_dim // output_dim] * output_dim)

    kaldi_fields = (
        Field("<Sizes>", "sizes", "int_vector", check=_positive_sizes),
    )

    def read_end(self, r) -> None:
        start = r.pos
        tok = r.read_token()
        # Kaldi accepts a repeated opening token here too (an old writer's bug).
        if tok not in ("</SumGroupComponent>", "<SumGroupComponent>"):
            raise r.error("expected '</SumGroupComponent>'", token=tok, pos=start)
        self.__init__(self.sizes)  # the group tables follow from the sizes

    def propagate(self, indexes, in_value, out_value):
        out_value[...] = namespace(in_value).add_reduceat(in_value, self._starts, axis=1)
        return None

    def backprop(self, indexes, in_value, out_value, out_deriv, memo, grad,
                 in_deriv) -> None:
        if in_deriv is not None:
            in_deriv[...] = out_deriv[:, namespace(out_deriv).index(self._reverse, out_deriv)]


@register
class SumBlockComponent(_InOut):
    """Sums the ``input_dim / output_dim`` column blocks of width ``output_dim``,
    times ``scale``; both directions *add* to their destination (Kaldi's
    kPropagateAdds / kBackpropAdds). Backprop repeats the scaled derivative over the
    blocks."""

    type_name = "SumBlockComponent"

    def __init__(self, input_dim: int = 0, output_dim: int = 0, scale: float = 1.0) -> None:
        super().__init__(input_dim, output_dim)
        self.scale = f32(scale)

    def properties(self) -> Flags:
        return Flags.SIMPLE | Flags.PROPAGATE_ADDS | Flags.BACKPROP_ADDS

    def info(self) -> str:
        return super().info() + f", scale={self.scale:g}"

    @classmethod
    def from_config(cls, cfg, rng: np.random.Generator | None = None) -> SumBlockComponent:
        input_dim = cfg.get_int("input-dim", required=True)
        output_dim = cfg.get_int("output-dim", required=True)
        scale = cfg.get_float("scale", 1.0)
        cfg.check_all_used()
        require(output_dim > 0 and input_dim > 0 and input_dim % output_dim == 0, cfg,
                f"invalid values input-dim={input_dim} output-dim={output_dim}")
        return cls(input_dim, output_dim, scale)

    kaldi_fields = (*REDUCING_DIMS, Field("<Scale>", "scale", "float", convert=f32))

    def propagate(self, indexes, in_value, out_value):
        k = self._input_dim // self._output_dim
        blocks = in_value.reshape(in_value.shape[0], k, self._output_dim)
        out_value += self.scale * namespace(blocks).sum(blocks, axis=1)
        return None

    def backprop(self, indexes, in_value, out_value, out_deriv, memo, grad,
                 in_deriv) -> None:
        if in_deriv is None:
            return
        k = self._input_dim // self._output_dim
        in_deriv += namespace(out_deriv).tile(self.scale * out_deriv, (1, k))


@register
class NoOpComponent(_Dim):
    """Identity forward; backprop multiplies the derivative by ``backprop_scale``
    (so it can damp gradients, e.g. in TDNN-F bypasses)."""

    type_name = "NoOpComponent"

    def __init__(self, dim: int = 0, backprop_scale: float = 1.0) -> None:
        super().__init__(dim)
        self.backprop_scale = f32(backprop_scale)

    def properties(self) -> Flags:
        return Flags.SIMPLE | Flags.PROPAGATE_IN_PLACE | Flags.BACKPROP_IN_PLACE

    def info(self) -> str:
        s = f"type={self.type_name}, dim={self.dim}"
        if self.backprop_scale != 1.0:
            s += f", backprop-scale={self.backprop_scale:g}"
        return s

    @classmethod
    def from_config(cls, cfg, rng: np.random.Generator | None = None) -> NoOpComponent:
        backprop_scale = cfg.get_float("backprop-scale", 1.0)
        dim = cfg.get_int("dim", required=True)
        cfg.check_all_used()
        require(dim > 0, cfg, f"dim must be positive, got {dim}")
        return cls(dim, backprop_scale)

    # Old files (NoOp once derived from NonlinearComponent) have stats where
    # <BackpropScale> is now, and no scale.
    kaldi_fields = (
        Field("<Dim>", "dim", "int", check=positive),
        Custom("_skip_old_stats", None),
        Field("<BackpropScale>", "backprop_scale", "float", default=1.0, convert=f32),
    )

    def _skip_old_stats(self, r) -> None:
        if r.peek_token() == "<ValueAvg>":
            r.expect_token("<ValueAvg>")
            r.read_vector()
            r.read_tagged("<DerivAvg>", "vector")
            r.read_tagged("<Count>", "float")
            if r.peek_token() == "<OderivRms>":
                r.read_tagged("<OderivRms>", "vector")
                r.read_tagged("<OderivCount>", "float")
            r.read_optional("<NumDimsSelfRepaired>", "float")
            r.read_optional("<NumDimsProcessed>", "float")

    def propagate(self, indexes, in_value, out_value):
        out_value[...] = in_value
        return None

    def backprop(self, indexes, in_value, out_value, out_deriv, memo, grad,
                 in_deriv) -> None:
        if in_deriv is None:
            return
        if self.backprop_scale != 1.0:
            in_deriv[...] = out_deriv * self.backprop_scale
        else:
            in_deriv[...] = out_deriv


@register
class ClipGradientComponent(_Dim):
    """Identity forward; backprop clips the derivative: element-wise to
    ``[-threshold, threshold]``, or (``norm_based_clipping``) each row scaled to norm
    at most ``threshold``; threshold 0 zeroes it.

    Self-repair (norm-based clipping, training backprop, when more than
    ``self_repair_clipped_proportion_threshold`` of the rows were clipped so far)
    adds a term that pulls the input towards ``self_repair_target``, then rescales
    the derivative to its previous total row norm. Kaldi applies it at random on
    about half the minibatches; ``rng`` None means always (see nonlinear.py).
    """

    type_name = "ClipGradientComponent"

    def __init__(self, dim: int = 0, clipping_threshold: float = 15.0,
                 norm_based_clipping: bool = False,
                 self_repair_clipped_proportion_threshold: float = 0.01,
                 self_repair_target: float = 0.0, self_repair_scale: float = 1.0) -> None:
        super().__init__(dim)
        self.clipping_threshold = f32(clipping_threshold)
        self.norm_based_clipping = bool(norm_based_clipping)
        self.self_repair_clipped_proportion_threshold = f32(
            self_repair_clipped_proportion_threshold)
        self.self_repair_target = f32(self_repair_target)
        self.self_repair_scale = f32(self_repair_scale)
        self.num_clipped = 0  # int32 counters, as in Kaldi
        self.count = 0
        self.num_self_repaired = 0
        self.num_backpropped = 0
        self.rng: np.random.Generator | None = None

    def properties(self) -> Flags:
        return (Flags.SIMPLE | Flags.PROPAGATE_IN_PLACE | Flags.BACKPROP_IN_PLACE
                | Flags.BACKPROP_NEEDS_INPUT)

    def info(self) -> str:
        prop = self.num_clipped / self.count if self.count > 0 else 0
        s = (f"type={self.type_name}, dim={self.dim}, norm-based-clipping="
             f"{str(self.norm_based_clipping).lower()}, clipping-threshold="
             f"{self.clipping_threshold:g}, clipped-proportion={prop:g}")
        if self.self_repair_scale != 0.0:
            s += (f", self-repair-clipped-proportion-threshold="
                  f"{self.self_repair_clipped_proportion_threshold:g}, self-repair-target="
                  f"{self.self_repair_target:g}, self-repair-scale={self.self_repair_scale:g}")
        return s

    @classmethod
    def from_config(cls, cfg, rng: np.random.Generator | None = None) -> ClipGradientComponent:
        dim = cfg.get_int("dim", required=True)
        threshold = cfg.get_float("clipping-threshold", 15.0)
        norm_based = cfg.get_bool("norm-based-clipping", False)
        prop = cfg.get_float("self-repair-clipped-proportion-threshold", 0.01)
        target = cfg.get_float("self-repair-target", 0.0)
        scale = cfg.get_float("self-repair-scale", 1.0)
        cfg.check_all_used()
        require(dim > 0, cfg, f"dim must be positive, got {dim}")
        require(threshold >= 0, cfg, f"clipping-threshold must be >= 0, got {threshold}")
        require(prop >= 0, cfg, "self-repair-clipped-proportion-threshold must be >= 0")
        require(target >= 0, cfg, "self-repair-target must be >= 0")
        require(scale >= 0, cfg, "self-repair-scale must be >= 0")
        return cls(dim, threshold, norm_based, prop, target, scale)

    # Old files lack the self-repair options (then off) and the two last counters.
    kaldi_fields = (
        Field("<Dim>", "dim", "int", check=positive),
        Field("<ClippingThreshold>", "clipping_threshold", "float", convert=f32),
        Field("<NormBasedClipping>", "norm_based_clipping", "bool"),
        Field("<SelfRepairClippedProportionThreshold>",
              "self_repair_clipped_proportion_threshold", "float", default=1.0, convert=f32,
              then=(Field("<SelfRepairTarget>", "self_repair_target", "float", default=0.0,
                          convert=f32),
                    Field("<SelfRepairScale>", "self_repair_scale", "float", default=0.0,
                          convert=f32))),
        Field("<NumElementsClipped>", "num_clipped", "int"),
        Field("<NumElementsProcessed>", "count", "int"),
        Field("<NumSelfRepaired>", "num_self_repaired", "int", default=0,
              then=(Field("<NumBackpropped>", "num_backpropped", "int", default=0),)),
    )

    def zero_stats(self) -> None:
        self.count = 0
        self.num_clipped = 0
        self.num_self_repaired = 0
        self.num_backpropped = 0

    def propagate(self, indexes, in_value, out_value):
        out_value[...] = in_value
        return None

    def backprop(self, indexes, in_value, out_value, out_deriv, memo, grad,
                 in_deriv) -> None:
        if in_deriv is None:
            return
        xp = namespace(out_deriv)
        d = xp.copy(out_deriv)
        training = grad is not None  # Kaldi's "to_update != NULL"
        thr = self.clipping_threshold
        if thr > 0:
            if self.norm_based_clipping:
                # (Python floats take d's dtype, as dtype.type(v) did: NEP 50)
                ratio = _row_norms_sq(d) * (thr ** -2.0)
                # (rows with ratio < 1 are scaled by exactly 1: no data-dependent branch)
                d *= (1 / xp.sqrt(xp.maximum(ratio, 1.0)))[:, None]
                if training:
                    # Kaldi's ApplyFloor(1.0, &num_not_scaled) counts the rows below 1
                    # (reading the count waits for a GPU: training only, as in Kaldi)
                    self.num_clipped += int(xp.sum(ratio >= 1))
                    self.count += d.shape[0]
            else:
                xp.clip(d, -thr, thr, out=d)
            if training:
                self.num_backpropped += 1
                self._repair(in_value, d)
        elif thr == 0.0:
            d[...] = 0
        in_deriv[...] = d

    def _repair(self, in_value: np.ndarray, d: np.ndarray) -> None:
        """Kaldi's ClipGradientComponent::RepairGradients (modifies ``d`` in place)."""
        if (self.self_repair_clipped_proportion_threshold >= 1.0
                or self.self_repair_scale == 0.0 or self.count == 0):
            return
        if self.rng is not None and float(self.rng.random()) > 0.5:
            return
        clipped_proportion = f32(f32(self.num_clipped) / self.count)
        if clipped_proportion <= self.self_repair_clipped_proportion_threshold:
            return
        self.num_self_repaired += 1
        xp = namespace(d)
        sign = xp.where(in_value > 0, 1.0, -1.0)
        repair = xp.maximum(xp.abs(in_value) - self.self_repair_target, 0.0) * sign
        norm_sum = float(xp.sum(xp.sqrt(_row_norms_sq(d))))
        rows = d.shape[0]
        magnitude = f32(self.self_repair_scale * clipped_proportion * (norm_sum / rows))
        repair_norm_sum = float(xp.sum(xp.sqrt(_row_norms_sq(repair))))
        scale = magnitude / (repair_norm_sum / rows) if repair_norm_sum != 0.0 else 0.0
        d += (-scale / 0.5) * repair
        repaired_norm_sum = float(xp.sum(xp.sqrt(_row_norms_sq(d))))
        if repaired_norm_sum != 0.0:
            d *= norm_sum / repaired_norm_sum


# ----------------------------------------------------------------------------------
@plain_indexes("BackpropTruncationComponent")
@dataclass
class BackpropTruncationIndexes:
    """Precomputed for BackpropTruncation: ``zeroing[i]`` is -1.0 for output rows at a
    zeroing boundary, else 0 (None, and ``zeroing_sum`` 0, when the computation has
    no backprop for it: only the backprop reads them); ``in_rows[i]`` the input row
    of output row i (None when the rows are in the same order)."""

    zeroing: np.ndarray | None
    zeroing_sum: float
    in_rows: np.ndarray | None

    # -- plain data (pynnet3.components.precomputed) -----------------------------------
    def to_data(self) -> dict:
        return {"zeroing": self.zeroing, "zeroing_sum": self.zeroing_sum,
                "in_rows": self.in_rows}

    @classmethod
    def from_data(cls, data: dict) -> BackpropTruncationIndexes:
        expect_fields(data, {"zeroing", "zeroing_sum", "in_rows"}, "BackpropTruncationIndexes")
        in_rows = int_array(data, "in_rows", (None,), 0, optional=True)
        zeroing = data["zeroing"]
        if zeroing is not None:
            zeroing = float_array(data, "zeroing", len(zeroing))
        if in_rows is not None and zeroing is not None and len(in_rows) != len(zeroing):
            raise ValueError("BackpropTruncationIndexes: zeroing and in_rows differ in length")
        return cls(zeroing, float_field(data, "zeroing_sum"), in_rows)

    def check_use(self, component, num_in: int | None, num_out: int) -> None:
        for name in ("zeroing", "in_rows"):
            a = getattr(self, name)
            if a is not None:
                same_rows(f"BackpropTruncationIndexes {name}", len(a), num_out)
        if self.in_rows is not None and num_in is not None and len(self.in_rows) \
                and self.in_rows.max() >= num_in:
            raise ValueError("BackpropTruncationIndexes: an input row out of range")


def match_rows(input_indexes: np.ndarray, output_indexes: np.ndarray) -> np.ndarray | None:
    """For each output index, the row of the same (n, t, x) among the inputs
    (None when the two lists are identical). Raises ValueError when one is missing."""
    if input_indexes is output_indexes:  # (a simple component's step: the same array)
        return None
    inp = np.asarray(input_indexes, dtype=np.int64).reshape(-1, 3)
    out = np.asarray(output_indexes, dtype=np.int64).reshape(-1, 3)
    if inp.shape == out.shape and np.array_equal(inp, out):
        return None
    both = np.concatenate([inp, out])
    _, ids = np.unique(both, axis=0, return_inverse=True)
    ids = ids.reshape(-1)
    lookup = np.full(ids.max() + 1 if ids.size else 0, -1, dtype=np.int64)
    lookup[ids[:len(inp)]] = np.arange(len(inp))
    rows = lookup[ids[len(inp):]]
    if np.any(rows < 0):
        bad = out[np.argmax(rows < 0)]
        raise ComputeError(f"output index {tuple(bad.tolist())} has no matching input row")
    return rows


@register
class BackpropTruncationComponent(_Dim):
    """Forward: ``y = scale * x``. Backprop: ``dx = scale * dy``, then each row is
    scaled down to norm at most ``clipping_threshold``, and zeroed when it is at a
    zeroing boundary and its norm exceeds ``zeroing_threshold``.

    A row (n, t) is at a boundary when ``floor((t - n) / zeroing_interval) !=
    floor((t - recurrence_interval - n) / zeroing_interval)``: the offset by n keeps
    sequences from all truncating on the same frames. Because of that the component
    is not simple (it needs the indexes); input index = output index.
    """

    type_name = "BackpropTruncationComponent"
    num_clipped = stats_attribute("num_clipped")
    num_zeroed = stats_attribute("num_zeroed")

    def __init__(self, dim: int = 0, scale: float = 1.0, clipping_threshold: float = 30.0,
                 zeroing_threshold: float = 15.0, zeroing_interval: int = 20,
                 recurrence_interval: int = 1) -> None:
        super().__init__(dim)
        self.scale = f32(scale)
        self.clipping_threshold = f32(clipping_threshold)
        self.zeroing_threshold = f32(zeroing_threshold)
        self.zeroing_interval = int(zeroing_interval)
        self.recurrence_interval = int(recurrence_interval)
        if self.zeroing_interval < 1 or self.recurrence_interval < 1:
            # precompute_indexes' boundary test ((t - n) mod zi < ri) equals Kaldi's
            # floor-division form only for intervals >= 1
            raise ConfigError(f"{self.type_name}: zeroing-interval and recurrence-interval "
                              f"must be >= 1, got {self.zeroing_interval}, "
                              f"{self.recurrence_interval}")
        self.num_clipped = 0.0  # double counters, as in Kaldi
        self.num_zeroed = 0.0
        self.count = 0.0
        self.count_zeroing_boundaries = 0.0

    def properties(self) -> Flags:
        return Flags.PROPAGATE_IN_PLACE | Flags.BACKPROP_IN_PLACE

    def info(self) -> str:
        return (f"type={self.type_name}, dim={self.dim}, scale={self.scale:g}, "
                f"recurrence-interval={self.recurrence_interval}, "
                f"clipping-threshold={self.clipping_threshold:g}, "
                f"zeroing-threshold={self.zeroing_threshold:g}, "
                f"zeroing-interval={self.zeroing_interval}")

    @classmethod
    def from_config(cls, cfg, rng: np.random.Generator | None = None):
        dim = cfg.get_int("dim", required=True)
        scale = cfg.get_float("scale", 1.0)
        clipping = cfg.get_float("clipping-threshold", 30.0)
        zeroing = cfg.get_float("zeroing-threshold", 15.0)
        interval = cfg.get_int("zeroing-interval", 20)
        recurrence = cfg.get_int("recurrence-interval", 1)
        cfg.check_all_used()
        require(dim > 0, cfg, f"dim must be positive, got {dim}")
        require(clipping >= 0, cfg, "clipping-threshold must be >= 0")
        require(zeroing >= 0, cfg, "zeroing-threshold must be >= 0")
        require(interval >= 1, cfg, "zeroing-interval must be >= 1")
        require(recurrence >= 1, cfg, "recurrence-interval must be >= 1")
        # Kaldi asserts this in Init() (after the config checks).
        require(scale > 0.0, cfg, f"scale must be positive, got {scale}")
        return cls(dim, scale, clipping, zeroing, interval, recurrence)

    kaldi_fields = (
        Field("<Dim>", "dim", "int", check=positive),
        Field("<Scale>", "scale", "float", default=1.0, convert=f32),
        Field("<ClippingThreshold>", "clipping_threshold", "float", convert=f32),
        Field("<ZeroingThreshold>", "zeroing_threshold", "float", convert=f32),
        Field("<ZeroingInterval>", "zeroing_interval", "int", check=positive),
        Field("<RecurrenceInterval>", "recurrence_interval", "int", check=positive),
        Field("<NumElementsClipped>", "num_clipped", "double"),
        Field("<NumElementsZeroed>", "num_zeroed", "double"),
        Field("<NumElementsProcessed>", "count", "double"),
        Field("<NumZeroingBoundaries>", "count_zeroing_boundaries", "double"),
    )

    def zero_stats(self) -> None:
        self.num_clipped = self.num_zeroed = 0.0
        self.count = self.count_zeroing_boundaries = 0.0

    # input_indexes: the base class default (each output needs the same index).

    def precompute_indexes(self, input_indexes, output_indexes,
                           need_backprop: bool) -> BackpropTruncationIndexes:
        in_rows = match_rows(input_indexes, output_indexes)
        if not need_backprop:
            return BackpropTruncationIndexes(None, 0.0, in_rows)
        out = np.asarray(output_indexes, dtype=np.int64).reshape(-1, 3)
        # Kaldi's test (t - n) // zi != (t - ri - n) // zi (floor division): with
        # m = (t - n) mod zi in [0, zi) and ri >= 1 it holds exactly when m < ri.
        boundary = np.mod(out[:, 1] - out[:, 0], self.zeroing_interval) \
            < self.recurrence_interval
        zeroing = np.subtract(0.0, boundary, dtype=np.float32)  # -1.0 or +0.0
        return BackpropTruncationIndexes(zeroing, float(np.count_nonzero(boundary)), in_rows)

    def propagate(self, indexes, in_value, out_value):
        x = in_value if indexes is None or indexes.in_rows is None \
            else namespace(in_value).take(in_value, namespace(in_value).index(
                indexes.in_rows, in_value))
        if self.scale != 1.0:
            x = x * self.scale
        out_value[...] = x
        return None

    def backprop(self, indexes, in_value, out_value, out_deriv, memo, grad,
                 in_deriv) -> None:
        if in_deriv is None:
            return
        xp = namespace(out_deriv)
        # (Python floats take the dtype of the arrays, as dtype.type(v) did: NEP 50)
        d = out_deriv * self.scale  # a new array, so in-place use is safe
        norms_sq = _row_norms_sq(d)
        clip = self.clipping_threshold if self.clipping_threshold > 0.0 else 1.0e10
        ratio = norms_sq * f32(clip ** -2.0)
        scales = 1 / xp.sqrt(xp.maximum(ratio, 1.0))
        zthr = self.zeroing_threshold if self.zeroing_threshold > 0.0 else 1.0e10
        over = (norms_sq - f32(zthr ** 2)) > 0
        if indexes is None or indexes.zeroing is None:
            raise ComputeError("BackpropTruncationComponent needs precompute_indexes() "
                               "with need_backprop")
        zero = over * xp.asarray(indexes.zeroing, like=d, dtype=xp.float32)  # -1: zeroed
        if grad is not None:  # Kaldi's "to_update != NULL"
            # (on a GPU the counts stay there until read: components/device_stats.py)
            device_stats.add(self, "num_clipped", xp.sum(ratio >= 1))
            self.count += d.shape[0]
            device_stats.add(self, "num_zeroed", -xp.sum(zero))
            self.count_zeroing_boundaries += indexes.zeroing_sum
        d *= (scales * xp.astype(zero + 1, d.dtype))[:, None]
        if indexes.in_rows is None:
            in_deriv[...] = d
        else:
            if len(indexes.in_rows) != in_deriv.shape[0]:
                in_deriv[...] = 0  # input rows no output uses get no derivative
            in_deriv[xp.index(indexes.in_rows, d)] = d


# ----------------------------------------------------------------------------------
@register
class ElementwiseProductComponent(_InOut):
    """Multiplies the ``input_dim / output_dim`` (at least 2) column blocks of width
    ``output_dim`` element by element. Backprop: each block's derivative is the
    output derivative times the product of the other blocks."""

    type_name = "ElementwiseProductComponent"

    def properties(self) -> Flags:
        return Flags.SIMPLE | Flags.BACKPROP_NEEDS_INPUT

    @classmethod
    def from_config(cls, cfg, rng: np.random.Generator | None = None):
        output_dim = cfg.get_int("output-dim", required=True)
        input_dim = cfg.get_int("input-dim", required=True)
        cfg.check_all_used()
        require(output_dim > 0, cfg, f"output-dim must be positive, got {output_dim}")
        require(input_dim > output_dim and input_dim % output_dim == 0, cfg,
                f"input-dim={input_dim} must be a multiple (>= 2) of output-dim={output_dim}")
        return cls(input_dim, output_dim)

    kaldi_fields = (
        Field("<InputDim>", "_input_dim", "int"),
        Field("<OutputDim>", "_output_dim", "int", check=_two_or_more_groups),
    )

    def _blocks(self, m: np.ndarray) -> np.ndarray:
        k = self._input_dim // self._output_dim
        return m.reshape(m.shape[0], k, self._output_dim)

    def propagate(self, indexes, in_value, out_value):
        out_value[...] = namespace(in_value).prod(self._blocks(in_value), axis=1)
        return None

    def backprop(self, indexes, in_value, out_value, out_deriv, memo, grad,
                 in_deriv) -> None:
        if in_deriv is None:
            return
        xp = namespace(in_value)
        x = self._blocks(in_value)
        k = x.shape[1]
        # Product of the other blocks, without dividing (inputs may be zero).
        d = xp.empty_like(x)
        for i in range(k):
            others = xp.concatenate([x[:, :i], x[:, i + 1:]], axis=1)
            d[:, i, :] = out_deriv * xp.prod(others, axis=1)
        in_deriv[...] = d.reshape(in_value.shape)


@register
class PermuteComponent(Component):
    """Reorders columns: output column i is input column ``column_map[i]`` (a
    permutation). Backprop applies the inverse permutation."""

    type_name = "PermuteComponent"

    def __init__(self, column_map=(0,)) -> None:
        self.column_map = np.asarray(column_map, dtype=np.int64)
        self.reverse_column_map = np.empty_like(self.column_map)
        self.reverse_column_map[self.column_map] = np.arange(self.column_map.size)

    @staticmethod
    def is_permutation(column_map) -> bool:
        m = np.asarray(column_map, dtype=np.int64)
        return m.size > 0 and np.array_equal(np.sort(m), np.arange(m.size))

    @property
    def input_dim(self) -> int:
        return int(self.column_map.size)

    @property
    def output_dim(self) -> int:
        return int(self.column_map.size)

    def properties(self) -> Flags:
        return Flags.SIMPLE

    def info(self) -> str:
        head = " ".join(str(int(c)) for c in self.column_map[:5])
        more = "... " if self.column_map.size > 5 else ""
        return f"type={self.type_name}, dim={self.input_dim} , column-map=[ {head} {more}]"

    @classmethod
    def from_config(cls, cfg, rng: np.random.Generator | None = None) -> PermuteComponent:
        column_map = cfg.get_int_list("column-map", required=True)
        cfg.check_all_used()
        require(cls.is_permutation(column_map), cfg,
                f"column-map={cfg.values.get('column-map')} is not a permutation")
        return cls(column_map)

    @classmethod
    def read(cls, r) -> PermuteComponent:
        r.expect_token("<ColumnMap>")
        pos = r.pos
        if r.binary and r.data[pos:pos + 1] == b"F":
            # Old format: a float vector (rounded), last entry forced to dim - 1.
            fmap = r.read_vector()
            column_map = (fmap + 0.5).astype(np.int64)
            if column_map.size:
                column_map[-1] = column_map.size - 1
        else:
            column_map = r.read_int_vector()
        if not cls.is_permutation(column_map):
            raise r.error("<ColumnMap> is not a permutation", pos=pos)
        read_closing(r, cls.type_name)
        return cls(column_map)

    def write(self, w) -> None:
        w.write_token("<PermuteComponent>")
        w.write_token("<ColumnMap>")
        w.write_int_vector(self.column_map.tolist())
        w.write_token("</PermuteComponent>")

    def propagate(self, indexes, in_value, out_value):
        out_value[...] = in_value[:, namespace(in_value).index(self.column_map, in_value)]
        return None

    def backprop(self, indexes, in_value, out_value, out_deriv, memo, grad,
                 in_deriv) -> None:
        if in_deriv is not None:
            in_deriv[...] = out_deriv[:, namespace(out_deriv).index(self.reverse_column_map,
                                                                    out_deriv)]


__all__ = [
    "SumGroupComponent", "SumBlockComponent", "NoOpComponent", "ClipGradientComponent",
    "BackpropTruncationComponent", "BackpropTruncationIndexes", "ElementwiseProductComponent",
    "PermuteComponent", "match_rows",
]
