"""TdnnComponent: an affine (or linear) map of input frames spliced at fixed time offsets.

Output row (n, t, x) = bias + sum_k W_k · input(n, t + time_offsets[k], x), where
W = [W_0 | W_1 | ...] is ``linear_params`` [output-dim, input-dim * num-offsets].
It is Kaldi's memory-efficient replacement for "splice, then affine": the
splicing is a row gather done inside the component.

Also here: the gather map shared with the time-height convolution
(:func:`time_offset_sources`), and the readers/writers of Kaldi's integer
vectors, whose binary form (size byte, raw int32 count, raw int32 elements)
the generic stream reader does not handle.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import ComputeError
from ..index import KeySet, pack
from .affine import bias_first, f32, matmul_blocks_into
from .base import Flags, InputDeps, UpdatableComponent, overwrite_by_zeroing, register
from .fields import UPDATABLE_HEADER, Custom, Field, pair
from .precomputed import expect_fields, int_array, int_field, plain_indexes, same_rows
from .preconditioning import precondition_product, preconditioners
from .xp import namespace

# ----------------------------------------------------------------------------------
# Kaldi integer vectors (WriteIntegerVector / WriteIntegerPairVector)


# ----------------------------------------------------------------------------------
# Gather maps over time offsets


def time_offset_sources(input_indexes: np.ndarray, output_indexes: np.ndarray,
                        time_offsets) -> np.ndarray:
    """``src[k, j]``: the input row holding (n, t + time_offsets[k], x) of output row
    j, or -1 when that input row is absent. Rows may be in any order; input rows
    are distinct cindexes (rows of one matrix)."""
    inp = np.asarray(input_indexes, dtype=np.int64).reshape(-1, 3)
    out = np.asarray(output_indexes, dtype=np.int64).reshape(-1, 3)
    src = np.empty((len(time_offsets), len(out)), dtype=np.int64)
    if len(inp) == 0 or len(out) == 0:
        src.fill(-1)
        return src
    # (column by column: numpy's reductions over the short axis of (k, 3) are slow)
    cols_in = [inp[:, c] for c in range(3)]
    lo = [int(c.min()) for c in cols_in]
    hi = [int(c.max()) for c in cols_in]
    ext = [hi[q] - lo[q] + 1 for q in range(3)]
    if ext[0] * ext[1] * ext[2] > 4 * len(inp) + 4096:
        return _sparse_offset_sources(inp, out, time_offsets, src)
    cols_out = [out[:, c] for c in range(3)]
    if all(int(c.min()) >= lo[q] and int(c.max()) <= hi[q] for q, c in enumerate(cols_out)):
        return _dense_offset_sources(cols_in, cols_out, lo, ext, time_offsets, src)
    # The inputs fill most of their (n, t, x) bounding box (the usual case): a
    # dense table of rows over the box, so each offset is a gather, no sorting.
    table = np.full(ext[0] * ext[1] * ext[2], -1, dtype=np.int64)
    table[((cols_in[0] - lo[0]) * ext[1] + (cols_in[1] - lo[1])) * ext[2]
          + (cols_in[2] - lo[2])] = np.arange(len(inp))
    n_rel, t_rel, x_rel = out[:, 0] - lo[0], out[:, 1] - lo[1], out[:, 2] - lo[2]
    nx_ok = (n_rel >= 0) & (n_rel < ext[0]) & (x_rel >= 0) & (x_rel < ext[2])
    base = n_rel * (ext[1] * ext[2]) + x_rel
    all_nx = bool(nx_ok.all())
    for k, off in enumerate(time_offsets):
        t = t_rel + int(off)
        ok = (t >= 0) & (t < ext[1])
        if not all_nx:
            ok &= nx_ok
        lin = base + t * ext[2]
        if ok.all():
            src[k] = table[lin]
            continue
        lin[~ok] = 0
        row = table[lin]
        row[~ok] = -1
        src[k] = row
    return src


def _box_positions(cols: list[np.ndarray], lo: list[int], strides: tuple[int, int],
                   t_shift: int) -> np.ndarray:
    """Row-major positions ``(n - lo_n) * strides[0] + (t - lo_t + t_shift) * strides[1]
    + (x - lo_x)`` of rows given as (n, t, x) columns; x is skipped where the box
    is one x wide (then it is lo_x in every row)."""
    pos = cols[0] * strides[0]
    if strides[1] == 1:
        pos += cols[1]
    else:
        pos += cols[1] * strides[1]
        pos += cols[2]
    pos += (t_shift - lo[1]) * strides[1] - lo[0] * strides[0] - (lo[2] if strides[1] > 1 else 0)
    return pos


def _dense_offset_sources(cols_in: list[np.ndarray], cols_out: list[np.ndarray],
                          lo: list[int], ext: list[int], time_offsets,
                          src: np.ndarray) -> np.ndarray:
    """:func:`time_offset_sources` where the output rows lie inside the inputs'
    (n, t, x) bounding box: a table of input rows over that box, padded in t by the
    largest offsets so that every shifted output row lands inside it (absent rows
    and the padding hold -1); then each offset is one addition and one gather.
    Few, in-place array operations: on long index sets the temporaries' memory
    traffic is what costs."""
    offs = [int(o) for o in time_offsets]
    if not offs:
        return src
    pad_lo, pad_hi = max(0, -min(offs)), max(0, max(offs))
    span_t = ext[1] + pad_lo + pad_hi
    strides = (span_t * ext[2], ext[2])
    table = np.full(ext[0] * strides[0], -1, dtype=np.int64)
    table[_box_positions(cols_in, lo, strides, pad_lo)] = np.arange(len(cols_in[0]))
    base = _box_positions(cols_out, lo, strides, pad_lo)
    for k, off in enumerate(offs):
        if off:
            np.take(table, base + off * strides[1], out=src[k])
        else:
            np.take(table, base, out=src[k])
    return src


def _sparse_offset_sources(inp: np.ndarray, out: np.ndarray, time_offsets,
                           src: np.ndarray) -> np.ndarray:
    """:func:`time_offset_sources` by sorted keys (inputs spread thinly)."""
    keys = KeySet(pack(inp))
    shifted = out.copy()
    for k, off in enumerate(time_offsets):
        shifted[:, 1] = out[:, 1] + int(off)
        src[k] = keys.position(pack(shifted))
    return src


def time_offset_deps(output_indexes: np.ndarray, time_offsets,
                     required) -> InputDeps:
    """Dependencies (n, t + offset, x) of each output index, offset-major per output."""
    out = np.asarray(output_indexes, dtype=np.int64).reshape(-1, 3)
    k, m = len(out), len(time_offsets)
    offs = np.asarray(time_offsets, dtype=np.int64)
    deps = np.repeat(out, m, axis=0)
    deps[:, 1] += np.tile(offs, k)
    owner = np.repeat(np.arange(k, dtype=np.int64), m)
    req = np.tile(np.asarray(required, dtype=bool), k)
    return InputDeps(owner, deps, req)


@plain_indexes("TdnnComponent", "TimeHeightConvolutionComponent")
class OffsetGather:
    """Precomputed indexes of Tdnn/TimeHeightConvolution: ``src`` [num-offsets,
    rows-out], the input row per time offset and output row (-1 = absent, then a
    zero contribution), and ``num_in``, the number of input rows.

    When every offset's rows are one contiguous run (the usual case: inputs and
    outputs in the same row order, e.g. n innermost), ``starts[k]`` is where offset
    k's run begins, and the components read slices of their input instead of
    gathering rows (Kaldi's TdnnComponent keeps a row offset and stride likewise);
    otherwise ``starts`` is None. An object may be made from the starts alone
    (shortcut expansion does); ``src`` is then built on first use."""

    def __init__(self, src: np.ndarray | None, num_in: int, *,
                 starts: tuple[int, ...] | None = None, num_out: int = 0):
        if src is not None:
            num_out = src.shape[1]
            starts = run_starts(src)
        elif starts is None:
            raise ValueError("OffsetGather needs src or starts")
        self._src = src
        self.num_in, self.num_out, self.starts = int(num_in), int(num_out), starts

    @property
    def src(self) -> np.ndarray:
        if self._src is None:  # (computed at most once per object; racing threads agree)
            self._src = (np.asarray(self.starts, dtype=np.int64)[:, None]
                         + np.arange(self.num_out, dtype=np.int64))
        return self._src

    @property
    def complete(self) -> bool:
        """Whether every output row has an input row for every offset (no -1)."""
        return self.starts is not None or self._derived(
            "_complete", lambda: bool(np.all(self.src >= 0)))

    # -- host tables derived from ``src``, made once per object (components hand them
    # to ``xp.index``, which keeps one device copy per table: they must be the same
    # array objects on every call) -------------------------------------------------
    def _derived(self, name: str, make):
        value = self.__dict__.get(name)
        if value is None:  # (racing threads compute equal values)
            value = self.__dict__[name] = make()
        return value

    @property
    def spliced_rows(self) -> np.ndarray:
        """``src.T`` flattened: gathering these input rows and reshaping to
        [num_out, num_offsets * dim] gives the spliced input (no -1 entries)."""
        return self._derived("_spliced_rows", lambda: np.ascontiguousarray(self.src.T).ravel())

    def offset_rows(self, k: int) -> tuple[np.ndarray | None, np.ndarray]:
        """``(outputs, inputs)`` of time offset k: output rows ``outputs`` read input
        rows ``inputs`` (``outputs`` None: every output row, in order)."""
        def make():
            per = []
            for rows in self.src:
                if rows.size and rows.min() < 0:
                    have = np.flatnonzero(rows >= 0)
                    per.append((have, np.ascontiguousarray(rows[have])))
                else:
                    per.append((None, np.ascontiguousarray(rows)))
            return per
        return self._derived("_offset_rows", make)[k]

    def __eq__(self, other) -> bool:
        if not isinstance(other, OffsetGather):
            return NotImplemented
        return (self.num_in, self.num_out, self.starts) == (other.num_in, other.num_out,
                                                           other.starts) \
            and self.src.shape == other.src.shape and np.array_equal(self.src, other.src)

    __hash__ = None  # mutable-looking, compared by content

    # -- plain data (pynnet3.components.precomputed) -----------------------------------
    def to_data(self) -> dict:
        if self.starts is not None:  # (src follows from the starts)
            return {"starts": np.asarray(self.starts, dtype=np.int64),
                    "num_in": self.num_in, "num_out": self.num_out}
        return {"src": self._src, "num_in": self.num_in}

    @classmethod
    def from_data(cls, data: dict) -> OffsetGather:
        num_in = int_field(data, "num_in")
        if "starts" in data:
            expect_fields(data, {"starts", "num_in", "num_out"}, "OffsetGather")
            num_out = int_field(data, "num_out", 1)
            starts = int_array(data, "starts", (None,), 0, num_in - num_out + 1)
            return cls(None, num_in, starts=tuple(starts.tolist()), num_out=num_out)
        expect_fields(data, {"src", "num_in"}, "OffsetGather")
        return cls(int_array(data, "src", (None, None), -1, num_in), num_in)

    def check_use(self, component, num_in: int | None, num_out: int) -> None:
        same_rows("OffsetGather input", self.num_in, num_in)
        same_rows("OffsetGather output", self.num_out, num_out)
        offsets = (component.time_offsets if component.type_name == "TdnnComponent"
                   else component.model.all_time_offsets)
        have = len(self.src) if self.starts is None else len(self.starts)
        if have != len(offsets):
            raise ValueError(f"OffsetGather has {have} time offsets, the component "
                             f"{len(offsets)}")

    def __repr__(self) -> str:
        k = len(self.src) if self.starts is None else len(self.starts)
        return (f"OffsetGather(num_offsets={k}, num_out={self.num_out}, "
                f"num_in={self.num_in}, starts={self.starts})")


def run_starts(src: np.ndarray) -> tuple[int, ...] | None:
    """Per row of ``src`` [K, J]: its first entry when every row is a contiguous
    run ``s, s + 1, ..., s + J - 1`` of real rows (s >= 0); else None."""
    if src.ndim != 2 or src.shape[1] == 0:
        return None
    first = src[:, 0]
    if (first < 0).any():
        return None
    if src.shape[1] > 1 and not (np.diff(src, axis=1) == 1).all():
        return None
    return tuple(first.tolist())


def stretch_offset_gather(mini: OffsetGather, input_indexes: np.ndarray,
                          output_indexes: np.ndarray, stretch_rows) -> OffsetGather | None:
    """The shortcut-expansion hook's work for an :class:`OffsetGather`: from the
    starts alone when the stretched maps are runs (``stretch_rows.run_starts``),
    else from the stretched rows; None when the maps do not stretch."""
    run = getattr(stretch_rows, "run_starts", None)
    if mini.starts is not None and run is not None:
        starts = run(mini.src)
        if starts is not None:
            return OffsetGather(None, len(input_indexes), starts=starts,
                                num_out=len(output_indexes))
    src = stretch_rows(mini.src)
    return None if src is None else OffsetGather(src, len(input_indexes))


def gather_offset(indexes: OffsetGather, k: int, x):
    """Time offset k's input rows for every output row (zero rows where absent)."""
    xp = namespace(x)
    outputs, inputs = indexes.offset_rows(k)
    if outputs is None:
        return xp.take(x, xp.index(inputs, like=x))
    out = xp.zeros((indexes.num_out, x.shape[1]), like=x)
    out[xp.index(outputs, like=x)] = xp.take(x, xp.index(inputs, like=x))
    return out


def scatter_add_offset(indexes: OffsetGather, k: int, target, values) -> None:
    """``target[src[k]] += values`` skipping the absent rows; offset k's input rows
    do not repeat ((n, t, x) -> (n, t + o, x) is one-to-one), so this is a plain
    indexed add."""
    xp = namespace(target)
    outputs, inputs = indexes.offset_rows(k)
    if outputs is not None:
        values = xp.take(values, xp.index(outputs, like=values))
    target[xp.index(inputs, like=target)] += values


# ----------------------------------------------------------------------------------
def _unique_offsets(tag: str, offsets: list[int], comp) -> str | None:
    if offsets and len(set(offsets)) == len(offsets):
        return None
    return f"{tag} must be non-empty and unique"


def _columns_per_offset(tag: str, linear: np.ndarray, comp) -> str | None:
    if linear.shape[0] and linear.shape[1] % len(comp.time_offsets) == 0:
        return None
    return f"{tag} columns must be a multiple of the number of time offsets"


def _bias_empty_or_output_dim(tag: str, bias: np.ndarray, comp) -> str | None:
    if bias.size in (0, comp.linear_params.shape[0]):
        return None
    return f"{tag} must be empty or have output-dim values"


@register
class TdnnComponent(UpdatableComponent):
    """Spliced affine transform over time offsets (see module docstring).

    Invariants: ``time_offsets`` non-empty and unique; ``linear_params`` is
    [output-dim, input-dim * len(time_offsets)] with column block k belonging to
    ``time_offsets[k]``; ``bias_params`` is [output-dim] or empty (use-bias=false,
    then propagate adds to its output, Kaldi's PROPAGATE_ADDS).
    """

    type_name = "TdnnComponent"

    def __init__(self):
        super().__init__()
        self.time_offsets: list[int] = [0]
        self.linear_params = np.zeros((1, 1), dtype=np.float32)
        self.bias_params = np.zeros(0, dtype=np.float32)
        self.orthonormal_constraint = 0.0
        self.use_natural_gradient = True
        self.num_samples_history = 2000.0
        self.alpha_in = 4.0
        self.alpha_out = 4.0
        self.rank_in = 20
        self.rank_out = 80

    # -- structure -------------------------------------------------------------------
    @property
    def input_dim(self) -> int:
        return self.linear_params.shape[1] // len(self.time_offsets)

    @property
    def output_dim(self) -> int:
        return self.linear_params.shape[0]

    @property
    def use_bias(self) -> bool:
        return self.bias_params.size > 0

    def properties(self) -> Flags:
        flags = (Flags.UPDATABLE | Flags.REORDERS_INDEXES | Flags.BACKPROP_ADDS
                 | Flags.BACKPROP_NEEDS_INPUT)
        if not self.use_bias:
            flags |= Flags.PROPAGATE_ADDS
        return flags

    def info(self) -> str:
        s = super().info() + self.updatable_info()
        if self.orthonormal_constraint != 0.0:
            s += f", orthonormal-constraint={self.orthonormal_constraint:g}"
        s += ", time-offsets=" + ",".join(str(o) for o in self.time_offsets)
        if not self.use_bias:
            s += ", has-bias=false"
        return s

    # -- construction ----------------------------------------------------------------
    @classmethod
    def from_config(cls, cfg, rng: np.random.Generator) -> TdnnComponent:
        comp = cls()
        comp.init_updatable_from_config(cfg)
        offsets = cfg.get_int_list("time-offsets", required=True)
        input_dim = cfg.get_int("input-dim", required=True)
        output_dim = cfg.get_int("output-dim", required=True)
        if input_dim <= 0 or output_dim <= 0:
            raise cfg.error("input-dim and output-dim must be > 0")
        if not offsets:
            raise cfg.error("time-offsets must be a non-empty list like -1,0,1")
        if len(set(offsets)) != len(offsets):
            raise cfg.error(f"repeated time-offsets: {offsets}")
        param_stddev = cfg.get_float("param-stddev", -1.0)
        bias_stddev = cfg.get_float("bias-stddev", 1.0)
        bias_mean = cfg.get_float("bias-mean", 0.0)
        use_bias = cfg.get_bool("use-bias", True)
        # (BaseFloat members in Kaldi: the values as float32 holds them)
        comp.orthonormal_constraint = f32(cfg.get_float("orthonormal-constraint", 0.0))
        comp.use_natural_gradient = cfg.get_bool("use-natural-gradient", True)
        rank_in = cfg.get_int("rank-in", -1)
        rank_out = cfg.get_int("rank-out", -1)
        comp.alpha_in = f32(cfg.get_float("alpha-in", 4.0))
        comp.alpha_out = f32(cfg.get_float("alpha-out", 4.0))
        comp.num_samples_history = f32(cfg.get_float("num-samples-history", 2000.0))
        cfg.check_all_used()

        spliced = input_dim * len(offsets)
        if param_stddev < 0.0:
            param_stddev = 1.0 / math.sqrt(spliced)
        comp.time_offsets = list(offsets)
        comp.linear_params = (param_stddev * rng.standard_normal((output_dim, spliced))
                              ).astype(np.float32)
        if use_bias:
            comp.bias_params = (bias_stddev * rng.standard_normal(output_dim) + bias_mean
                                ).astype(np.float32)
        comp.rank_in = rank_in if rank_in >= 0 else min(20, (spliced + 1) // 2)
        comp.rank_out = rank_out if rank_out >= 0 else min(80, (output_dim + 1) // 2)
        return comp

    kaldi_fields = (
        UPDATABLE_HEADER,
        Field("<TimeOffsets>", "time_offsets", "int_vector",
              convert=lambda v: [int(o) for o in v], check=_unique_offsets),
        Field("<LinearParams>", "linear_params", "matrix", finite="<LinearParams>",
              check=_columns_per_offset),
        Field("<BiasParams>", "bias_params", "vector", finite="<BiasParams>",
              check=_bias_empty_or_output_dim),
        Field("<OrthonormalConstraint>", "orthonormal_constraint", "float"),
        Field("<UseNaturalGradient>", "use_natural_gradient", "bool"),
        Field("<NumSamplesHistory>", "num_samples_history", "float"),
        Custom("_read_alphas", "_write_alphas"),
        *pair("<RankInOut>", "rank", "int"),
    )

    def _read_alphas(self, r) -> None:
        pos = r.pos
        tok = r.read_token()
        if tok == "<AlphaInOut>":
            self.alpha_in = r.read_float()
            self.alpha_out = r.read_float()
        elif tok == "<Alpha>":  # an older format Kaldi still reads
            self.alpha_in = self.alpha_out = r.read_float()
        else:
            raise r.error("expected <AlphaInOut>", token=tok, pos=pos)

    def _write_alphas(self, w) -> None:
        w.write_token("<AlphaInOut>")
        w.write_float(self.alpha_in)
        w.write_float(self.alpha_out)

    # -- parameters ------------------------------------------------------------------
    def params(self) -> dict[str, np.ndarray]:
        p = {"linear_params": self.linear_params}
        if self.use_bias:
            p["bias_params"] = self.bias_params
        return p

    # -- indexes ---------------------------------------------------------------------
    def input_indexes(self, output_indexes: np.ndarray) -> InputDeps:
        return time_offset_deps(output_indexes, self.time_offsets,
                                [True] * len(self.time_offsets))

    def output_time_bounds(self, input_bounds: tuple[float, float]) -> tuple[float, float]:
        """Bounds on the t of computable outputs when the computable inputs have
        ``input_bounds[0] <= t <= input_bounds[1]`` (every offset is required)."""
        lo, hi = input_bounds
        return (lo - min(self.time_offsets), hi - max(self.time_offsets))

    def precompute_indexes(self, input_indexes: np.ndarray, output_indexes: np.ndarray,
                           need_backprop: bool) -> OffsetGather:
        src = time_offset_sources(input_indexes, output_indexes, self.time_offsets)
        if src.size and src.min() < 0:
            k, j = np.argwhere(src < 0)[0]
            n, t, x = np.asarray(output_indexes)[j].tolist()
            raise ComputeError(
                f"{self.type_name}: output (n={n}, t={t}, x={x}) needs input "
                f"t={t + self.time_offsets[k]}, which is not among the input rows")
        return OffsetGather(src, len(input_indexes))

    def stretch_precomputed(self, mini_indexes: OffsetGather, input_indexes: np.ndarray,
                            output_indexes: np.ndarray, need_backprop: bool,
                            stretch_rows) -> OffsetGather | None:
        """Shortcut expansion's hook (:class:`pynnet3.cache.expand.RowMapStretch`):
        :meth:`precompute_indexes` for the expanded indexes, from the two-sequence
        computation's object. Each offset's sources are the rows (n, t + offset, x)
        of the same n, so they stretch along n like the index arrays. None (then
        :meth:`precompute_indexes` runs) when the mini object is not complete (the
        error is precompute_indexes') or its map does not have the stretchable form."""
        if not isinstance(mini_indexes, OffsetGather) or not mini_indexes.complete:
            return None
        return stretch_offset_gather(mini_indexes, input_indexes, output_indexes,
                                     stretch_rows)

    # -- math ------------------------------------------------------------------------
    def _spliced(self, indexes: OffsetGather, in_value):
        """[rows-out, input-dim * num-offsets]: the input rows of every offset side by side."""
        xp = namespace(in_value)
        n = indexes.num_out
        if indexes.starts is not None:
            if len(indexes.starts) == 1:  # a view: no copy at all
                return in_value[indexes.starts[0]:indexes.starts[0] + n]
            return xp.concatenate([in_value[s:s + n] for s in indexes.starts], axis=1)
        if indexes.complete:  # one gather of every offset's rows, then a reshape
            rows = xp.index(indexes.spliced_rows, like=in_value)
            return xp.take(in_value, rows).reshape(n, -1)
        return xp.concatenate([gather_offset(indexes, k, in_value)
                               for k in range(len(indexes.src))], axis=1)

    def propagate(self, indexes, in_value, out_value):
        xp = namespace(in_value)
        w = xp.param(self.linear_params, like=in_value)
        if indexes.starts is not None and len(indexes.starts) > 1:
            n = indexes.num_out
            blocks = [in_value[s:s + n] for s in indexes.starts]
            if self.use_bias and bias_first(out_value, self.bias_params):
                matmul_blocks_into(out_value, blocks, w, add=True, any_order=True)
                return None
            # (per time offset, as Kaldi's TdnnComponent sums them, forward-only or not)
            if matmul_blocks_into(out_value, blocks, w, add=not self.use_bias, any_order=True):
                if self.use_bias:
                    out_value += xp.param(self.bias_params, like=in_value)
                return None
        if self.use_bias and bias_first(out_value, self.bias_params):
            xp.gemm_acc(out_value, self._spliced(indexes, in_value), w.T)
            return None
        if self.use_bias:  # straight into the output: no product temporary
            xp.matmul(self._spliced(indexes, in_value), w.T, out=out_value)
            out_value += xp.param(self.bias_params, like=in_value)
        else:
            # PROPAGATE_ADDS in one BLAS call (into a zeroed output: the floats of the product)
            xp.gemm_acc(out_value, self._spliced(indexes, in_value), w.T)
        return None

    def propagate_overwrite(self, indexes, in_value, out_value):
        """:meth:`propagate` into an output of undefined contents, as if it were zero
        (the runtime skips the zeroing PROPAGATE_ADDS asks for): the first time
        offset's product is written, the others added; the same floats."""
        if self.use_bias:  # (no PROPAGATE_ADDS: propagate writes its output)
            return self.propagate(indexes, in_value, out_value)
        if type(self).propagate is not TdnnComponent.propagate:  # (a subclass's math)
            return overwrite_by_zeroing(self, indexes, in_value, out_value)
        xp = namespace(in_value)
        w = xp.param(self.linear_params, like=in_value)
        if indexes.starts is not None and len(indexes.starts) > 1:
            n = indexes.num_out
            blocks = [in_value[s:s + n] for s in indexes.starts]
            if matmul_blocks_into(out_value, blocks, w, add=False, any_order=True):
                return None
        xp.matmul(self._spliced(indexes, in_value), w.T, out=out_value)
        return None

    def backprop(self, indexes, in_value, out_value, out_deriv, memo, grad, in_deriv) -> None:
        xp = namespace(out_deriv)
        d = self.input_dim
        if grad is not None and preconditioners(grad) is not None:
            # a trainer's natural gradient (components/preconditioning.py)
            n = indexes.num_out  # (the offsets' row blocks, spliced once into the copy)
            x = [in_value[s:s + n] for s in indexes.starts] if indexes.starts is not None \
                else self._spliced(indexes, in_value)
            precondition_product(grad, "linear_params", "bias_params" if self.use_bias else None,
                                 x, out_deriv)
        elif grad is not None:
            g = grad["linear_params"]
            if indexes.starts is not None:  # per offset into its columns: no spliced copy
                n = indexes.num_out
                for k, s in enumerate(indexes.starts):
                    xp.gemm_acc(g[:, k * d:(k + 1) * d], out_deriv.T, in_value[s:s + n])
            else:
                xp.gemm_acc(g, out_deriv.T, self._spliced(indexes, in_value))
            if self.use_bias:
                gb = grad["bias_params"]
                gb += xp.astype(xp.sum(out_deriv, axis=0), gb.dtype)
        if in_deriv is not None:
            w = xp.param(self.linear_params, like=out_deriv)
            if indexes.starts is not None:
                n = indexes.num_out
                for k, s in enumerate(indexes.starts):  # BACKPROP_ADDS
                    xp.gemm_acc(in_deriv[s:s + n], out_deriv, w[:, k * d:(k + 1) * d])
                return
            for k in range(len(indexes.src)):  # BACKPROP_ADDS
                scatter_add_offset(indexes, k, in_deriv, out_deriv @ w[:, k * d:(k + 1) * d])
