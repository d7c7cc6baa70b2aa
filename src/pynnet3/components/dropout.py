"""Dropout-style random components: Dropout, DropoutMask, GeneralDropout and the
time part of SpecAugment (Kaldi's ``RandomComponent`` family).

Every type here has a *test mode* (inference: deterministic, see each class) and a
*training mode* that draws random masks. Kaldi draws from its own generator; we draw
from a :class:`numpy.random.Generator` that each component owns
(:meth:`RandomComponent.reset_generator` seeds it), so the mask *structure* is
Kaldi's (per element / per frame / per (sequence, time-block) / time segments) and
the values are random.

Non-simple types (GeneralDropout, SpecAugmentTimeMask) share masks between rows by
their (n, t) index, so their :meth:`precompute_indexes` turns the row indexes into
mask-row maps. Kaldi requires the input rows to be exactly the output rows; we also
accept the same set of indexes in another order (a permutation is then applied).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .base import (
    Component,
    Flags,
    InputDeps,
    SameDimComponent,
    register,
    require,
)
from .fields import Field, non_negative, positive, proportion
from .precomputed import expect_fields, int_array, int_field, plain_indexes, same_rows
from .xp import namespace


def _block_divides_dim(tag: str, block_dim: int, comp) -> str | None:
    if block_dim <= 0:
        return f"{tag} must be positive"
    if comp.dim % block_dim:
        return f"{tag} {block_dim} does not divide <Dim> {comp.dim}"
    return None


def _at_least_one(tag: str, value: int, comp) -> str | None:
    return None if value >= 1 else f"{tag} must be >= 1"


class RandomComponent(Component):
    """Kaldi's ``RandomComponent``: a test-mode flag plus a random generator.

    Invariant: ``rng`` is the only source of randomness of the component, so
    ``reset_generator(seed)`` makes training-mode masks reproducible.
    """

    def __init__(self) -> None:
        self.test_mode = False
        # Deterministic by default (seed 0); the network may reseed every component.
        # The generator itself is made on first use (:attr:`rng`): a network read for
        # decoding never draws, and numpy.random costs ~10 ms to import.
        self._rng = None
        self._rng_seed = 0

    @property
    def rng(self) -> np.random.Generator:
        """The component's generator (``default_rng`` of its seed, made when first
        asked for)."""
        rng = self.__dict__.get("_rng")  # (also for an object made without __init__)
        if rng is None:
            rng = self._rng = np.random.default_rng(self.__dict__.get("_rng_seed", 0))
        return rng

    @rng.setter
    def rng(self, value: np.random.Generator) -> None:
        self._rng = value

    def set_test_mode(self, test_mode: bool) -> None:
        self.test_mode = bool(test_mode)

    def reset_generator(self, seed: int | None = None) -> None:
        """Reseed the component's generator (Kaldi's ``ResetGenerator``); the new
        generator, ``default_rng(seed)``, is made when first drawn from."""
        self._rng, self._rng_seed = None, seed

    def _seed_from(self, rng: np.random.Generator | None) -> None:
        if rng is not None:
            self._rng = np.random.default_rng(int(rng.integers(0, 2**63 - 1)))

    def _uniform(self, shape, dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        if dtype not in (np.float32, np.float64):
            dtype = np.dtype(np.float32)
        return self.rng.random(shape, dtype=dtype)


# ----------------------------------------------------------------------------------
@register
class DropoutComponent(RandomComponent, SameDimComponent):
    """Classic (not inverted) dropout on a ``dim``-dimensional simple component.

    Training: each element (or, with ``dropout_per_frame``, each row) is kept with
    probability ``1 - dropout_proportion`` and zeroed otherwise, without rescaling.
    Test mode: output = ``(1 - dropout_proportion) * input``.
    Backprop (both modes, Kaldi's SetMatMatDivMat): ``in_deriv = out_deriv *
    (out_value / in_value)`` where ``in_value != 0``, else ``out_deriv`` unchanged.
    """

    type_name = "DropoutComponent"

    def __init__(self, dim: int = 0, dropout_proportion: float = 0.0,
                 dropout_per_frame: bool = False, test_mode: bool = False):
        super().__init__()
        self.dim = int(dim)
        self.dropout_proportion = float(dropout_proportion)
        self.dropout_per_frame = bool(dropout_per_frame)
        self.test_mode = bool(test_mode)

    def properties(self) -> Flags:
        return (Flags.BACKPROP_IN_PLACE | Flags.SIMPLE | Flags.BACKPROP_NEEDS_INPUT
                | Flags.BACKPROP_NEEDS_OUTPUT | Flags.RANDOM)

    def info(self) -> str:
        return (f"{self.type_name}, dim={self.dim}, dropout-proportion="
                f"{self.dropout_proportion:g}, dropout-per-frame="
                f"{'true' if self.dropout_per_frame else 'false'}")

    @classmethod
    def from_config(cls, cfg, rng: np.random.Generator | None = None) -> DropoutComponent:
        dim = cfg.get_int("dim", required=True)
        p = cfg.get_float("dropout-proportion", required=True)
        per_frame = cfg.get_bool("dropout-per-frame", False)
        # Only meaningful for testing, but Kaldi accepts it.
        test_mode = cfg.get_bool("test-mode", False)
        cfg.check_all_used()
        require(dim > 0, cfg, f"dim must be positive, got {dim}")
        require(0.0 <= p <= 1.0, cfg, f"dropout-proportion must be in [0, 1], got {p}")
        comp = cls(dim, p, per_frame, test_mode)
        comp._seed_from(rng)
        return comp

    kaldi_fields = (
        Field("<Dim>", "dim", "int", check=positive),
        Field("<DropoutProportion>", "dropout_proportion", "float", check=proportion),
        # Both trailing fields are optional in Kaldi's reader (older files lack them).
        Field("<DropoutPerFrame>", "dropout_per_frame", "bool", default=False),
        Field("<TestMode>", "test_mode", "bool", default=False),
    )

    def propagate(self, indexes, in_value: np.ndarray, out_value: np.ndarray) -> None:
        xp = namespace(in_value)
        p = self.dropout_proportion
        if self.test_mode:
            xp.multiply(in_value, 1.0 - p, out=out_value)  # (rounded to the dtype: NEP 50)
            return None
        # The mask is drawn on the host from the component's generator: every
        # backend draws the same numbers.
        ft = xp.scalar_type(in_value)
        if self.dropout_per_frame:
            keep = self._uniform((in_value.shape[0], 1), ft) > p
        else:
            keep = self._uniform(in_value.shape, ft) > p
        xp.multiply(in_value, xp.asarray(keep, like=in_value), out=out_value)
        return None

    def backprop(self, indexes, in_value, out_value, out_deriv, memo, grad, in_deriv) -> None:
        if in_deriv is None:
            return
        # The kept fraction out/in is 0, 1 or the test-mode scale; where the input is
        # exactly 0 Kaldi passes the derivative through unscaled.
        xp = namespace(out_deriv)
        nonzero = in_value != 0
        ratio = xp.where(nonzero, out_value / xp.where(nonzero, in_value, 1.0), 1.0)
        xp.multiply(out_deriv, ratio, out=in_deriv)


# ----------------------------------------------------------------------------------
@register
class DropoutMaskComponent(RandomComponent):
    """Outputs a dropout mask and has no input (used for LSTM per-frame dropout).

    Test mode: the constant ``1 - dropout_proportion`` (1.0 when ``continuous`` or
    when the proportion is 0). Training: 0/1 values, 0 with probability
    ``dropout_proportion``; with 2 or 3 columns the first two columns come from one
    uniform ``u`` per row (``u > p`` and ``u < 1 - p``) so they are never both 0.
    Continuous training: ``1 - 2p + 4p * u`` (mean 1).
    """

    type_name = "DropoutMaskComponent"

    def __init__(self, output_dim: int = 0, dropout_proportion: float = 0.5,
                 continuous: bool = False, test_mode: bool = False):
        super().__init__()
        self.dim = int(output_dim)
        self.dropout_proportion = float(dropout_proportion)
        self.continuous = bool(continuous)
        self.test_mode = bool(test_mode)

    @property
    def input_dim(self) -> int:
        return self.dim  # a don't-care: the component reads no input rows

    @property
    def output_dim(self) -> int:
        return self.dim

    def properties(self) -> Flags:
        return Flags.RANDOM

    def info(self) -> str:
        s = (f"{self.type_name}, output-dim={self.dim}, dropout-proportion="
             f"{self.dropout_proportion:g}")
        return s + (", continuous=true" if self.continuous else "")

    @classmethod
    def from_config(cls, cfg, rng: np.random.Generator | None = None) -> DropoutMaskComponent:
        dim = cfg.get_int("output-dim", required=True)
        p = cfg.get_float("dropout-proportion", 0.5)
        continuous = cfg.get_bool("continuous", False)
        test_mode = cfg.get_bool("test-mode", False)
        cfg.check_all_used()
        require(dim > 0, cfg, f"output-dim must be positive, got {dim}")
        require(0.0 <= p <= 1.0, cfg, f"dropout-proportion must be in [0, 1], got {p}")
        comp = cls(dim, p, continuous, test_mode)
        comp._seed_from(rng)
        return comp

    kaldi_fields = (
        Field("<OutputDim>", "dim", "int", check=positive),
        Field("<DropoutProportion>", "dropout_proportion", "float", check=proportion),
        Field("<TestMode>", "test_mode", "bool", default=False),
        Field("<Continuous>", "continuous", "flag"),
    )

    def input_indexes(self, output_indexes: np.ndarray) -> InputDeps:
        """No input at all: every output index is computable on its own."""
        empty = np.zeros(0, dtype=np.int64)
        return InputDeps(empty, np.zeros((0, 3), dtype=np.int64), np.zeros(0, dtype=bool))

    def propagate(self, indexes, in_value: np.ndarray, out_value: np.ndarray) -> None:
        p = self.dropout_proportion
        xp = namespace(out_value)
        # (masks drawn and made on the host, in the output's precision: every backend
        # draws the same numbers)
        dtype = np.dtype(xp.scalar_type(out_value))
        if p == 0.0:
            out_value[...] = 1.0
            return None
        if self.continuous:
            if self.test_mode:
                out_value[...] = 1.0
            else:
                u = self._uniform(out_value.shape, dtype)
                out_value[...] = xp.asarray(u * dtype.type(p * 4.0) + dtype.type(1.0 - 2.0 * p),
                                            like=out_value)
            return None
        if self.test_mode:
            out_value[...] = float(dtype.type(1.0 - p))
            return None
        mask = (self._uniform(out_value.shape, dtype) > p).astype(dtype)
        if out_value.shape[1] in (2, 3):
            # LSTM special case: never drop both of the first two gates of a row.
            u = self._uniform(out_value.shape[0], dtype)
            mask[:, 0] = u > p
            mask[:, 1] = u < 1.0 - p
        out_value[...] = xp.asarray(mask, like=out_value)
        return None

    def backprop(self, indexes, in_value, out_value, out_deriv, memo, grad, in_deriv) -> None:
        """Nothing to do: there is no input to propagate a derivative to."""


# ----------------------------------------------------------------------------------
@dataclass
class RowMaskIndexes:
    """Precomputed rows for GeneralDropout / SpecAugmentTimeMask.

    ``gather``: for each output row, the input row holding the same index (None
    when input and output rows are in the same order, the usual case).
    """

    gather: np.ndarray | None

    @staticmethod
    def _gather_from(data: dict, num_rows: int) -> np.ndarray | None:
        gather = int_array(data, "gather", (num_rows,), 0, num_rows, optional=True)
        if gather is not None and not np.array_equal(np.sort(gather), np.arange(num_rows)):
            raise ValueError("gather is not a permutation of the rows")
        return gather

    def check_use(self, component, num_in: int | None, num_out: int) -> None:
        rows = len(self.output_indexes)
        same_rows(f"{type(self).__name__} input", rows, num_in)
        same_rows(f"{type(self).__name__} output", rows, num_out)


@plain_indexes("GeneralDropoutComponent")
@dataclass(eq=False)
class GeneralDropoutIndexes(RowMaskIndexes):
    """``mask_rows[i]``: the mask row of output row i, one per distinct
    ``(n, floor(t / time_period))`` (``t`` ignored when the period is 0), numbered
    in order of first appearance; ``num_mask_rows`` of them. They are numbered
    when first asked for (from ``output_indexes``, which is not copied): a network
    in test mode never draws a mask, so it never needs them."""

    output_indexes: np.ndarray
    time_period: int

    @cached_property
    def _numbering(self) -> tuple[np.ndarray, int]:
        out = np.asarray(self.output_indexes, dtype=np.int64).reshape(-1, 3)
        if len(out) == 0:
            return np.zeros(0, dtype=np.int64), 0
        t_block = (out[:, 1] // self.time_period if self.time_period > 0
                   else np.zeros(len(out), dtype=np.int64))
        return _first_appearance_ids(out[:, 0], t_block)

    @property
    def mask_rows(self) -> np.ndarray:
        return self._numbering[0]

    def to_data(self) -> dict:
        return {"gather": self.gather, "output_indexes": self.output_indexes,
                "time_period": self.time_period}

    @classmethod
    def from_data(cls, data: dict) -> GeneralDropoutIndexes:
        expect_fields(data, {"gather", "output_indexes", "time_period"},
                      "GeneralDropoutIndexes")
        out = int_array(data, "output_indexes", (None, 3))
        return cls(cls._gather_from(data, len(out)), out, int_field(data, "time_period"))

    @property
    def num_mask_rows(self) -> int:
        return self._numbering[1]


@plain_indexes("SpecAugmentTimeMaskComponent")
@dataclass(eq=False)
class TimeMaskIndexes(RowMaskIndexes):
    """``sequences``: for each distinct n (ascending), the output rows of that
    sequence ordered by t (ties by row); ``num_rows`` output rows. The sequences
    are found when first asked for (test mode never does)."""

    output_indexes: np.ndarray

    @property
    def num_rows(self) -> int:
        return len(self.output_indexes)

    def to_data(self) -> dict:
        return {"gather": self.gather, "output_indexes": self.output_indexes}

    @classmethod
    def from_data(cls, data: dict) -> TimeMaskIndexes:
        expect_fields(data, {"gather", "output_indexes"}, "TimeMaskIndexes")
        out = int_array(data, "output_indexes", (None, 3))
        return cls(cls._gather_from(data, len(out)), out)

    @cached_property
    def sequences(self) -> list[np.ndarray]:
        out = np.asarray(self.output_indexes, dtype=np.int64).reshape(-1, 3)
        rows = np.arange(len(out))
        order = np.lexsort((rows, out[:, 1], out[:, 0]))  # by n, then t, then row
        cuts = np.flatnonzero(np.diff(out[order, 0])) + 1
        return np.split(order, cuts) if len(order) else []


def _first_appearance_ids(n: np.ndarray, t_block: np.ndarray) -> tuple[np.ndarray, int]:
    """Id of each row's (n, t block) pair, pairs numbered in order of first
    appearance, and the number of pairs."""
    n_lo, tb_lo = int(n.min()), int(t_block.min())
    tb_ext = int(t_block.max()) - tb_lo + 1
    ext = (int(n.max()) - n_lo + 1) * tb_ext
    if len(n) < 2048 or ext > 4 * len(n) + 4096:  # few rows, or pairs spread thinly
        keys = (n << 32) + (t_block - tb_lo)
        _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        rank = np.empty(len(first), dtype=np.int64)
        rank[np.argsort(first, kind="stable")] = np.arange(len(first))
        return rank[inverse.reshape(-1)], len(first)
    # A table over the pairs' bounding box holding each pair's first row: no sort
    # of the rows, only of the (few) pairs' first rows.
    pair = (n - n_lo) * tb_ext
    pair += t_block
    pair -= tb_lo
    first_row = np.full(ext, len(n), dtype=np.int64)
    np.minimum.at(first_row, pair, np.arange(len(n), dtype=np.int64))
    present = np.flatnonzero(first_row < len(n))
    rank = np.empty(ext, dtype=np.int64)
    rank[present[np.argsort(first_row[present])]] = np.arange(len(present))
    return rank[pair], len(present)


def _row_gather(input_indexes: np.ndarray, output_indexes: np.ndarray) -> np.ndarray | None:
    """Map each output row to the input row with the same index (Kaldi requires
    identical lists; a permutation of them is accepted too)."""
    inp = np.asarray(input_indexes, dtype=np.int64).reshape(-1, 3)
    out = np.asarray(output_indexes, dtype=np.int64).reshape(-1, 3)
    if inp.shape == out.shape and np.array_equal(inp, out):
        return None
    if inp.shape != out.shape:
        raise ValueError("input and output indexes must be the same set for this component")
    in_order = np.lexsort(inp.T[::-1])
    out_order = np.lexsort(out.T[::-1])
    if not np.array_equal(inp[in_order], out[out_order]):
        raise ValueError("input and output indexes must be the same set for this component")
    gather = np.empty(len(out), dtype=np.int64)
    gather[out_order] = in_order
    return gather


def _apply_row_mask(gather, src: np.ndarray, mask: np.ndarray, dst: np.ndarray,
                    forward: bool) -> None:
    """dst = src * mask with rows matched through ``gather`` (output-row order of the
    mask). Safe when ``dst`` is ``src`` (in place) and gather is None."""
    xp = namespace(src)
    if gather is None:
        xp.multiply(src, mask, out=dst)
    elif forward:
        dst[...] = xp.take(src, xp.index(gather, src)) * mask
    else:
        tmp = src * mask
        dst[xp.index(gather, src)] = tmp


def _copy_rows(gather, src: np.ndarray, dst: np.ndarray, forward: bool) -> None:
    xp = namespace(src)
    if gather is None:
        if dst is not src:
            dst[...] = src
    elif forward:
        dst[...] = xp.take(src, xp.index(gather, src))
    else:
        tmp = xp.copy(src)
        dst[xp.index(gather, src)] = tmp


class _RowMaskComponent(RandomComponent, SameDimComponent):
    """A random component that multiplies each row by a mask row drawn in training
    (GeneralDropout, SpecAugmentTimeMask); its precomputed indexes carry ``gather``
    (see :class:`RowMaskIndexes`). The propagate returns the mask as the memo, and
    the backprop multiplies by that memo (None: the step was an identity copy).

    A subclass says when it is an identity (:meth:`_is_identity`) and draws the
    mask, in output-row order (:meth:`_row_mask`)."""

    def _is_identity(self) -> bool:
        raise NotImplementedError

    def _row_mask(self, indexes, dtype) -> np.ndarray:
        raise NotImplementedError

    def propagate(self, indexes, in_value: np.ndarray, out_value: np.ndarray):
        gather = None if indexes is None else indexes.gather
        if self._is_identity():
            _copy_rows(gather, in_value, out_value, forward=True)
            return None
        if indexes is None:
            raise ValueError(f"{self.type_name} needs precomputed indexes in training mode")
        xp = namespace(in_value)
        # (drawn on the host from the component's generator: every backend draws the
        # same numbers)
        mask = xp.asarray(self._row_mask(indexes, xp.scalar_type(in_value)), like=in_value)
        _apply_row_mask(gather, in_value, mask, out_value, forward=True)
        return mask

    def backprop(self, indexes, in_value, out_value, out_deriv, memo, grad, in_deriv) -> None:
        if in_deriv is None:
            return
        gather = None if indexes is None else indexes.gather
        if memo is None:
            _copy_rows(gather, out_deriv, in_deriv, forward=False)
            return
        _apply_row_mask(gather, out_deriv, memo, in_deriv, forward=False)


@register
class GeneralDropoutComponent(_RowMaskComponent):
    """Dropout with masks shared along time and across blocks of the feature dim.

    The mask has ``block_dim`` columns and one row per distinct ``(n, t //
    time_period)`` (one per sequence when ``time_period`` is 0); it is repeated over
    the ``dim / block_dim`` blocks of each row. Training values: ``(u > p) / (1 -
    p)`` (inverted dropout), or ``1 - 2p + 4p * u`` when ``continuous``, or, with
    ``specaugment_max_proportion`` > 0, a frequency mask: up to
    ``round(block_dim * max_proportion)`` consecutive (wrapping) bins zeroed, split
    into up to ``specaugment_max_regions`` regions. Test mode: identity.
    """

    type_name = "GeneralDropoutComponent"

    def __init__(self, dim: int = 0, block_dim: int | None = None, time_period: int = 0,
                 dropout_proportion: float = 0.5, specaugment_max_proportion: float = 0.0,
                 specaugment_max_regions: int = 1, continuous: bool = False,
                 test_mode: bool = False):
        super().__init__()
        self.dim = int(dim)
        self.block_dim = int(dim if block_dim is None else block_dim)
        self.time_period = int(time_period)
        self.dropout_proportion = float(dropout_proportion)
        self.specaugment_max_proportion = float(specaugment_max_proportion)
        self.specaugment_max_regions = int(specaugment_max_regions)
        self.continuous = bool(continuous)
        self.test_mode = bool(test_mode)

    def properties(self) -> Flags:
        flags = (Flags.RANDOM | Flags.PROPAGATE_IN_PLACE | Flags.BACKPROP_IN_PLACE
                 | Flags.USES_MEMO)
        if self.block_dim != self.dim:
            # Kaldi reshapes the matrix to block_dim columns, which needs no stride gaps.
            flags |= Flags.INPUT_CONTIGUOUS | Flags.OUTPUT_CONTIGUOUS
        return flags

    def info(self) -> str:
        s = (f"{self.type_name}, dim={self.dim}, block-dim={self.block_dim}, "
             f"dropout-proportion={self.dropout_proportion:g}")
        if self.continuous:
            s += ", continuous=true"
        if self.specaugment_max_proportion != 0:
            s += (f", specaugment-max-proportion={self.specaugment_max_proportion:g}"
                  f", specaugment-max-regions={self.specaugment_max_regions}")
        if self.time_period > 0:
            s += f", time-period={self.time_period}"
        return s

    @classmethod
    def from_config(cls, cfg, rng: np.random.Generator | None = None
                    ) -> GeneralDropoutComponent:
        dim = cfg.get_int("dim", required=True)
        require(dim > 0, cfg, f"dim must be positive, got {dim}")
        block_dim = cfg.get_int("block-dim", dim)
        require(block_dim > 0 and dim % block_dim == 0, cfg,
                f"invalid configuration dim={dim}, block-dim={block_dim}")
        time_period = cfg.get_int("time-period", 0)
        require(time_period >= 0, cfg, f"time-period must be >= 0, got {time_period}")
        p = cfg.get_float("dropout-proportion", 0.5)
        require(0.0 <= p <= 1.0, cfg, f"dropout-proportion must be in [0, 1], got {p}")
        sa_prop = cfg.get_float("specaugment-max-proportion", 0.0)
        sa_regions = cfg.get_int("specaugment-max-regions", 1)
        continuous = cfg.get_bool("continuous", False)
        test_mode = cfg.get_bool("test-mode", False)
        cfg.check_all_used()
        if sa_prop != 0.0 and not (0.0 <= sa_prop <= 1.0 and not continuous
                                   and sa_regions >= 1):
            raise cfg.error(
                f"invalid config values: specaugment-max-proportion={sa_prop}, "
                f"continuous={str(continuous).lower()}, specaugment-max-regions={sa_regions}")
        comp = cls(dim, block_dim, time_period, p, sa_prop, sa_regions, continuous, test_mode)
        comp._seed_from(rng)
        return comp

    kaldi_fields = (
        Field("<Dim>", "dim", "int", check=positive),
        Field("<BlockDim>", "block_dim", "int", check=_block_divides_dim),
        Field("<TimePeriod>", "time_period", "int", check=non_negative),
        Field("<DropoutProportion>", "dropout_proportion", "float", check=proportion),
        Field("<SpecAugmentMaxProportion>", "specaugment_max_proportion", "float",
              default=0.0, check=proportion,
              write_if=lambda c: c.specaugment_max_proportion != 0.0,
              then=(Field("<SpecAugmentMaxRegions>", "specaugment_max_regions", "int",
                          default=1, check=_at_least_one,
                          write_if=lambda c: c.specaugment_max_regions != 1),)),
        # <TestMode> and <Continuous> are bare flags (no value) in this component.
        Field("<TestMode>", "test_mode", "flag"),
        Field("<Continuous>", "continuous", "flag"),
    )

    # -- indexes -------------------------------------------------------------------
    def precompute_indexes(self, input_indexes: np.ndarray, output_indexes: np.ndarray,
                           need_backprop: bool) -> GeneralDropoutIndexes:
        out = np.asarray(output_indexes, dtype=np.int64).reshape(-1, 3)
        # mask rows: one per (n, t block), numbered in order of first appearance as
        # Kaldi's hash map does (when first needed)
        return GeneralDropoutIndexes(_row_gather(input_indexes, out), out, self.time_period)

    def _is_identity(self) -> bool:
        return self.test_mode or (self.dropout_proportion == 0.0
                                  and self.specaugment_max_proportion == 0.0)

    def _make_mask(self, num_rows: int, dtype) -> np.ndarray:
        """The [num_rows, block_dim] mask (Kaldi's GetMemo)."""
        dtype = np.dtype(dtype)
        bd = self.block_dim
        if self.specaugment_max_proportion != 0.0:
            return self._specaugment_mask(num_rows, dtype)
        p = self.dropout_proportion
        u = self._uniform((num_rows, bd), dtype)
        if self.continuous:
            return u * dtype.type(p * 4.0) + dtype.type(1.0 - 2.0 * p)
        scale = 1.0 / (1.0 - p) if p < 1.0 else 0.0  # p == 1 drops everything
        return (u > p).astype(dtype) * dtype.type(scale)

    def _specaugment_mask(self, num_rows: int, dtype) -> np.ndarray:
        bins = self.block_dim
        mask = np.ones((num_rows, bins), dtype=dtype)
        max_zeroed = int(bins * self.specaugment_max_proportion + 0.5)
        rng = self.rng
        for row in mask:
            num_zeroed = int(rng.integers(0, max_zeroed + 1))
            if num_zeroed == 0:
                continue
            start = int(rng.integers(0, bins))
            row[(start + np.arange(num_zeroed)) % bins] = 0.0  # wraps around
            # More regions: flip a random half of the (circular) spectrum.
            half = bins // 2
            quarter = half // 2
            for _ in range(1, self.specaugment_max_regions):
                s = int(rng.integers(0, bins))
                a = (s + np.arange(quarter)) % bins
                b = (s + half - np.arange(quarter)) % bins
                row[a], row[b] = row[b].copy(), row[a].copy()
        return mask

    def _row_mask(self, indexes: GeneralDropoutIndexes, dtype) -> np.ndarray:
        mask = self._make_mask(indexes.num_mask_rows, dtype)
        per_row = mask[indexes.mask_rows]
        reps = self.dim // self.block_dim
        return np.tile(per_row, (1, reps)) if reps > 1 else per_row


@register
class SpecAugmentTimeMaskComponent(_RowMaskComponent):
    """The time-masking part of SpecAugment: zeroes whole frames in segments.

    In training, each sequence (rows with the same n, in t order) is cut into
    alternating kept / zeroed segments: zeroed segments of 1..time_mask_max_frames
    frames, kept ones of 1..int(time_mask_max_frames * (1 - z) / z) frames (z =
    zeroed_proportion); the first segment is a kept one with probability z. No
    rescaling. Test mode: identity.
    """

    type_name = "SpecAugmentTimeMaskComponent"

    def __init__(self, dim: int = 0, zeroed_proportion: float = 0.25,
                 time_mask_max_frames: int = 10, test_mode: bool = False):
        super().__init__()
        self.dim = int(dim)
        self.zeroed_proportion = float(zeroed_proportion)
        self.time_mask_max_frames = int(time_mask_max_frames)
        self.test_mode = bool(test_mode)

    def properties(self) -> Flags:
        return Flags.RANDOM | Flags.PROPAGATE_IN_PLACE | Flags.BACKPROP_IN_PLACE | Flags.USES_MEMO

    def info(self) -> str:
        return (f"{self.type_name}, dim={self.dim}, zeroed-proportion="
                f"{self.zeroed_proportion:g}, time-mask-max-frames={self.time_mask_max_frames}")

    @classmethod
    def from_config(cls, cfg, rng: np.random.Generator | None = None
                    ) -> SpecAugmentTimeMaskComponent:
        dim = cfg.get_int("dim", required=True)
        z = cfg.get_float("zeroed-proportion", 0.25)
        max_frames = cfg.get_int("time-mask-max-frames", 10)
        cfg.check_all_used()  # note: Kaldi has no test-mode= option for this type
        require(dim > 0, cfg, f"dim must be positive, got {dim}")
        require(max_frames > 1, cfg, f"time-mask-max-frames must be > 1, got {max_frames}")
        require(0.0 <= z < 1.0, cfg, f"zeroed-proportion must be in [0, 1), got {z}")
        comp = cls(dim, z, max_frames)
        comp._seed_from(rng)
        return comp

    kaldi_fields = (
        Field("<Dim>", "dim", "int", check=positive),
        Field("<ZeroedProportion>", "zeroed_proportion", "float", check=proportion),
        Field("<TimeMaskMaxFrames>", "time_mask_max_frames", "int", check=positive),
        Field("<TestMode>", "test_mode", "flag"),
    )

    def precompute_indexes(self, input_indexes: np.ndarray, output_indexes: np.ndarray,
                           need_backprop: bool) -> TimeMaskIndexes:
        out = np.asarray(output_indexes, dtype=np.int64).reshape(-1, 3)
        return TimeMaskIndexes(_row_gather(input_indexes, out), out)

    def _is_identity(self) -> bool:
        return self.test_mode or self.zeroed_proportion == 0.0

    def _row_mask(self, indexes: TimeMaskIndexes, dtype) -> np.ndarray:
        """Per-row 0/1 mask (Kaldi's GetMemo), in output-row order."""
        z = np.float32(self.zeroed_proportion)
        max_zeroed = self.time_mask_max_frames
        # Kaldi computes this in single precision and truncates.
        max_kept = int(np.float32(max_zeroed) * (np.float32(1.0) - z) / z)
        if max_zeroed <= 0 or max_kept <= 0:
            raise ValueError(f"{self.type_name}: zeroed-proportion {self.zeroed_proportion} "
                             f"and time-mask-max-frames {max_zeroed} leave no kept frames")
        rng = self.rng
        mask = np.empty(indexes.num_rows, dtype=dtype)
        for rows in indexes.sequences:
            length, t = len(rows), 0
            while t < length:
                if t > 0 or rng.random() < z:
                    kept = int(rng.integers(1, max_kept + 1))
                    mask[rows[t:t + kept]] = 1.0
                    t += kept
                zeroed = int(rng.integers(1, max_zeroed + 1))
                mask[rows[t:t + zeroed]] = 0.0
                t += zeroed
        return mask[:, None]


__all__ = ["RandomComponent", "DropoutComponent", "DropoutMaskComponent",
           "GeneralDropoutComponent", "SpecAugmentTimeMaskComponent"]
