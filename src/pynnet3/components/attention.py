"""RestrictedAttentionComponent: multi-head self-attention over a window of frames.

Each head's input columns are ``[key (key_dim), value (value_dim), query
(key_dim + context_dim)]``, with ``context_dim = num_left + 1 + num_right``. The
output at ``(n, t, x)`` attends over the inputs at ``t + k * time_stride`` for
``k = -num_left .. num_right`` (context position ``j = k + num_left``):

    b[j] = key_scale * <query_key_part(t), key(t_j)> + query_context_part(t)[j]
    c    = softmax(b)
    out  = [sum_j c[j] * value(t_j), c (only when output-context)]

The query is the input row at the output's own time (always required). Inputs with
``-num_left_required <= k <= num_right_required`` are required; the others are
optional, and a missing optional input acts exactly as Kaldi's zero padding row:
its key and value are zero, so it still takes part in the softmax with score
``query_context_part[j]`` (it is NOT masked out), and its value adds nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import ComputeError
from ..index import KeySet, describe, pack
from . import device_stats
from .base import Component, Flags, InputDeps, check_finite, check_table_rows, register, require
from .fields import Custom, Field
from .precomputed import expect_fields, int_array, int_field, plain_indexes, same_rows
from .xp import namespace

# Kaldi's kNoTime: the t of the padding rows that reorder_indexes() adds.
NO_TIME = int(np.iinfo(np.int32).min)


@plain_indexes("RestrictedAttentionComponent")
@dataclass
class AttentionIndexes:
    """``context_rows[o, j]``: input row of output ``o``'s context position ``j``,
    or ``num_input_rows`` (a virtual zero row) when that optional input is absent.
    The query of output ``o`` is row ``context_rows[o, num_left]``."""

    context_rows: np.ndarray  # (rows_out, context_dim) int64
    num_input_rows: int

    # -- plain data (pynnet3.components.precomputed) -----------------------------------
    def to_data(self) -> dict:
        return {"context_rows": self.context_rows, "num_input_rows": self.num_input_rows}

    @classmethod
    def from_data(cls, data: dict) -> AttentionIndexes:
        expect_fields(data, {"context_rows", "num_input_rows"}, "AttentionIndexes")
        num_in = int_field(data, "num_input_rows")
        return cls(int_array(data, "context_rows", (None, None), 0, num_in + 1), num_in)

    def check_use(self, component, num_in: int | None, num_out: int) -> None:
        same_rows("AttentionIndexes input", self.num_input_rows, num_in)
        same_rows("AttentionIndexes output", len(self.context_rows), num_out)
        if self.context_rows.shape[1] != component.context_dim:
            raise ValueError(f"AttentionIndexes: context of {self.context_rows.shape[1]}, "
                             f"the component's is {component.context_dim}")
        if len(self.context_rows) and self.num_input_rows == 0:
            raise ValueError("AttentionIndexes: outputs without input rows")

    def tables(self, num_left: int) -> tuple[np.ndarray, np.ndarray]:
        """``(query rows, context rows flattened)``: host tables made once per object
        (``xp.index`` keeps one device copy of each)."""
        made = self.__dict__.get("_tables")
        if made is None or made[0] != num_left:  # (racing threads compute equal values)
            made = self.__dict__["_tables"] = (
                num_left, np.ascontiguousarray(self.context_rows[:, num_left]),
                np.ascontiguousarray(self.context_rows).reshape(-1))
        return made[1], made[2]


def _read_double_array(r, matrix: bool) -> np.ndarray:
    """A Kaldi ``Vector<double>`` / ``Matrix<double>`` at full double precision
    (the shared reader's read_vector/read_matrix give float32)."""
    if r.binary:
        start = r.pos
        tok = r.read_token()
        allowed = ("DM", "FM") if matrix else ("DV", "FV")
        if tok not in allowed:
            raise r.error(f"expected one of {list(allowed)}", token=tok, pos=start)
        shape = (r.read_int(), r.read_int()) if matrix else (r.read_int(),)
        if min(shape) < 0:
            raise r.error(f"negative size {shape}", pos=start)
        dtype = np.dtype("<f8" if tok[0] == "D" else "<f4")
        nbytes = int(np.prod(shape)) * dtype.itemsize
        if r.pos + nbytes > len(r.data):
            raise r.error("unexpected end of file while reading stats", pos=start)
        raw = r.data[r.pos:r.pos + nbytes]
        r.pos += nbytes
        return np.frombuffer(raw, dtype=dtype).astype(np.float64).reshape(shape)
    # Text: let the shared reader check the syntax and shape, then re-parse the
    # same bytes as float64 so that a read/write round trip is exact.
    start = r.pos
    arr32 = r.read_matrix() if matrix else r.read_vector()
    body = r.data[start:r.pos].replace(b"[", b" ").replace(b"]", b" ")
    return np.array(body.split(), dtype=np.float64).reshape(arr32.shape)


def _write_double_array(w, arr: np.ndarray) -> None:
    arr = np.asarray(arr, dtype=np.float64)
    if not w.binary:
        (w.write_matrix if arr.ndim == 2 else w.write_vector)(arr)
        return
    if arr.ndim == 2:
        w.write_token("DM")
        w.write_int(arr.shape[0])
        w.write_int(arr.shape[1])
    else:
        w.write_token("DV")
        w.write_int(arr.size)
    w.raw(np.ascontiguousarray(arr, dtype="<f8").tobytes())


def _finite(tag: str, value: float, comp) -> str | None:
    return None if math.isfinite(value) else f"non-finite {tag}"


@register
class RestrictedAttentionComponent(Component):
    """See the module docstring. Not updatable; stores attention statistics
    (per-head entropy and mean posteriors) when asked to.

    Invariants: num_heads, key_dim, value_dim, time_stride > 0; num_left,
    num_right >= 0 with a positive sum; 0 <= *_required <= the matching num_*;
    0 < key_scale; stats are empty or shaped (num_heads,), (num_heads, context_dim).
    """

    type_name = "RestrictedAttentionComponent"
    # float64 statistics a GPU run adds to on the device (components/device_stats.py)
    entropy_stats = device_stats.stats_attribute("entropy_stats")
    posterior_stats = device_stats.stats_attribute("posterior_stats")

    def __init__(self, num_heads: int, key_dim: int, value_dim: int, num_left_inputs: int,
                 num_right_inputs: int, time_stride: int = 1,
                 num_left_inputs_required: int | None = None,
                 num_right_inputs_required: int | None = None, output_context: bool = True,
                 key_scale: float | None = None):
        self.num_heads = int(num_heads)
        self.key_dim = int(key_dim)
        self.value_dim = int(value_dim)
        self.num_left_inputs = int(num_left_inputs)
        self.num_right_inputs = int(num_right_inputs)
        self.time_stride = int(time_stride)
        self.num_left_inputs_required = (self.num_left_inputs if num_left_inputs_required
                                         is None else int(num_left_inputs_required))
        self.num_right_inputs_required = (self.num_right_inputs if num_right_inputs_required
                                          is None else int(num_right_inputs_required))
        self.output_context = bool(output_context)
        self.key_scale = (1.0 / math.sqrt(self.key_dim) if key_scale is None
                          else float(key_scale))
        self.stats_count = 0.0
        self.entropy_stats = np.zeros(0, dtype=np.float64)
        self.posterior_stats = np.zeros((0, 0), dtype=np.float64)

    def _problem(self) -> str | None:
        if min(self.num_heads, self.key_dim, self.value_dim, self.time_stride) <= 0:
            return "num-heads, key-dim, value-dim and time-stride must be > 0"
        if self.num_left_inputs < 0 or self.num_right_inputs < 0:
            return "num-left-inputs and num-right-inputs must be >= 0"
        if self.num_left_inputs + self.num_right_inputs <= 0:
            return "num-left-inputs + num-right-inputs must be > 0"
        if not 0 <= self.num_left_inputs_required <= self.num_left_inputs:
            return "num-left-inputs-required must be in [0, num-left-inputs]"
        if not 0 <= self.num_right_inputs_required <= self.num_right_inputs:
            return "num-right-inputs-required must be in [0, num-right-inputs]"
        if not self.key_scale > 0.0:
            return "key-scale must be > 0"
        if self.stats_count < 0:
            return "stats count must be >= 0"
        if self.entropy_stats.size and self.entropy_stats.shape != (self.num_heads,):
            return f"<EntropyStats> must have dim {self.num_heads}"
        if self.posterior_stats.size and self.posterior_stats.shape != (
                self.num_heads, self.context_dim):
            return f"<PosteriorStats> must be {self.num_heads}x{self.context_dim}"
        return None

    # -- structure ------------------------------------------------------------------
    @property
    def context_dim(self) -> int:
        return self.num_left_inputs + 1 + self.num_right_inputs

    @property
    def input_dim_per_head(self) -> int:
        return 2 * self.key_dim + self.value_dim + self.context_dim

    @property
    def output_dim_per_head(self) -> int:
        return self.value_dim + (self.context_dim if self.output_context else 0)

    @property
    def input_dim(self) -> int:
        return self.num_heads * self.input_dim_per_head

    @property
    def output_dim(self) -> int:
        return self.num_heads * self.output_dim_per_head

    def properties(self) -> Flags:
        return (Flags.REORDERS_INDEXES | Flags.BACKPROP_NEEDS_INPUT | Flags.PROPAGATE_ADDS
                | Flags.BACKPROP_ADDS | Flags.STORES_STATS | Flags.USES_MEMO)

    def info(self) -> str:
        s = (f"type={self.type_name}, input-dim={self.input_dim}, "
             f"output-dim={self.output_dim}, num-heads={self.num_heads}, "
             f"time-stride={self.time_stride}, key-dim={self.key_dim}, "
             f"value-dim={self.value_dim}, num-left-inputs={self.num_left_inputs}, "
             f"num-right-inputs={self.num_right_inputs}, context-dim={self.context_dim}, "
             f"num-left-inputs-required={self.num_left_inputs_required}, "
             f"num-right-inputs-required={self.num_right_inputs_required}, "
             f"output-context={str(self.output_context).lower()}, "
             f"key-scale={self.key_scale:g}")
        if self.stats_count != 0.0:
            ent = ",".join(f"{v:g}" for v in self.entropy_stats / self.stats_count)
            s += f", entropy={ent}, stats-count={self.stats_count:g}"
        return s

    # -- construction and files ----------------------------------------------------
    @classmethod
    def from_config(cls, cfg, rng: np.random.Generator | None = None):
        mandatory = ("key-dim", "value-dim", "num-left-inputs", "num-right-inputs")
        missing = [k for k in mandatory if not cfg.has(k)]
        if missing:  # Kaldi names all four mandatory options together
            raise cfg.error(f"{cls.type_name}: key-dim, value-dim, num-left-inputs and "
                            f"num-right-inputs must all be given (missing "
                            f"{', '.join(k + '=' for k in missing)})")
        key_dim, value_dim, num_left, num_right = (cfg.get_int(k) for k in mandatory)
        num_heads = cfg.get_int("num-heads", 1)
        time_stride = cfg.get_int("time-stride", 1)
        left_req = cfg.get_int("num-left-inputs-required", -1)
        right_req = cfg.get_int("num-right-inputs-required", -1)
        output_context = cfg.get_bool("output-context", True)
        key_scale = cfg.get_float("key-scale", -1.0)
        cfg.check_all_used()
        require(key_dim > 0, cfg, f"{cls.type_name}: key-dim must be > 0")
        comp = cls(num_heads, key_dim, value_dim, num_left, num_right, time_stride,
                   num_left if left_req < 0 else left_req,
                   num_right if right_req < 0 else right_req, output_context,
                   None if key_scale < 0.0 else key_scale)
        problem = comp._problem()
        if problem is None and comp.key_scale > 1.0:
            problem = "key-scale must be <= 1"
        require(problem is None, cfg, f"{cls.type_name}: {problem}")
        return comp

    kaldi_fields = (
        *(Field(tag, attr, "int") for tag, attr in (
            ("<NumHeads>", "num_heads"), ("<KeyDim>", "key_dim"), ("<ValueDim>", "value_dim"),
            ("<NumLeftInputs>", "num_left_inputs"), ("<NumRightInputs>", "num_right_inputs"),
            ("<TimeStride>", "time_stride"),
            ("<NumLeftInputsRequired>", "num_left_inputs_required"),
            ("<NumRightInputsRequired>", "num_right_inputs_required"))),
        Field("<OutputContext>", "output_context", "bool"),
        Field("<KeyScale>", "key_scale", "float", check=_finite),
        Field("<StatsCount>", "stats_count", "double", check=_finite),
        Custom("_read_stats", "_write_stats"),
    )

    @classmethod
    def empty_for_read(cls) -> RestrictedAttentionComponent:
        return cls(0, 0, 0, 0, 0, key_scale=1.0)

    def _read_stats(self, r) -> None:
        """The entropy and posterior statistics: Kaldi keeps them in double."""
        r.expect_token("<EntropyStats>")
        pos = r.pos
        entropy = _read_double_array(r, matrix=False)
        check_finite(r, "<EntropyStats>", entropy, pos)
        r.expect_token("<PosteriorStats>")
        pos = r.pos
        posterior = _read_double_array(r, matrix=True)
        check_finite(r, "<PosteriorStats>", posterior, pos)
        self.entropy_stats = entropy
        self.posterior_stats = posterior

    def _write_stats(self, w) -> None:
        w.write_token("<EntropyStats>")
        _write_double_array(w, self.entropy_stats)
        w.write_token("<PosteriorStats>")
        _write_double_array(w, self.posterior_stats)

    def read_end(self, r) -> None:
        super().read_end(r)
        problem = self._problem()
        if problem is not None:
            raise r.error(f"invalid {self.type_name}: {problem}")

    # -- indexes ---------------------------------------------------------------------
    def _offsets(self) -> np.ndarray:
        """Time offset of each context position j (in frames)."""
        return np.arange(-self.num_left_inputs, self.num_right_inputs + 1) * self.time_stride

    def _required_mask(self) -> np.ndarray:
        k = np.arange(-self.num_left_inputs, self.num_right_inputs + 1)
        return (k >= -self.num_left_inputs_required) & (k <= self.num_right_inputs_required)

    def _context_indexes(self, output_indexes) -> np.ndarray:
        """(rows_out, context_dim, 3): the input index of every context position."""
        out = np.asarray(output_indexes, dtype=np.int64).reshape(-1, 3)
        ctx = np.repeat(out[:, None, :], self.context_dim, axis=1)
        ctx[:, :, 1] += self._offsets()[None, :]
        return ctx

    def input_indexes(self, output_indexes: np.ndarray) -> InputDeps:
        """Per output, context_dim dependencies in order of time: required for
        offsets within ``[-num_left_required, num_right_required] * time_stride``
        (which includes the query at offset 0), optional otherwise."""
        check_table_rows(len(output_indexes) * self.context_dim, "dependencies of an attention "
                         "context")
        ctx = self._context_indexes(output_indexes)
        k = len(ctx)
        owner = np.repeat(np.arange(k, dtype=np.int64), self.context_dim)
        required = np.tile(self._required_mask(), k)
        return InputDeps(owner, ctx.reshape(-1, 3), required)

    def precompute_indexes(self, input_indexes, output_indexes, need_backprop: bool):
        """Gather map for any row order. Absent optional inputs (and rows with
        ``t == NO_TIME``, Kaldi's padding) read as zero rows; output rows with
        ``t == NO_TIME`` are padding too: they attend over zero rows only."""
        inp = np.asarray(input_indexes, dtype=np.int64).reshape(-1, 3)
        out = np.asarray(output_indexes, dtype=np.int64).reshape(-1, 3)
        real_in = np.flatnonzero(inp[:, 1] != NO_TIME)
        real_out = out[:, 1] != NO_TIME
        ctx = self._context_indexes(out[real_out])
        rows = np.full((len(out), self.context_dim), -1, dtype=np.int64)
        found = KeySet.from_indexes(inp[real_in]).position(pack(ctx.reshape(-1, 3)))
        found = np.where(found >= 0, real_in[np.maximum(found, 0)], -1)
        rows[real_out] = found.reshape(len(ctx), self.context_dim)
        missing = (rows < 0) & self._required_mask()[None, :] & real_out[:, None]
        if np.any(missing):
            bad = out[np.any(missing, axis=1)]
            raise ComputeError(f"{self.type_name}: required inputs missing for outputs "
                               f"{describe(bad)}")
        rows[rows < 0] = len(inp)  # the virtual zero row
        return AttentionIndexes(rows, len(inp))

    def reorder_indexes(self, input_indexes, output_indexes) -> tuple[np.ndarray, np.ndarray]:
        """Kaldi's ReorderIndexes (optional for our compiler): the rows Kaldi's
        input and output matrices get. Both become a full time grid (t outer,
        sorted (n, x) pairs of the input inner) with step gcd(input t step, output
        t step, time_stride); the input grid runs from the first to the last
        *requested* context time, and grid points that are not among the given
        indexes get ``t = NO_TIME`` (zero rows). Matching this is only needed to
        reproduce Kaldi's matrix sizes; the math does not depend on it."""
        inp = np.asarray(input_indexes, dtype=np.int64).reshape(-1, 3)
        out = np.asarray(output_indexes, dtype=np.int64).reshape(-1, 3)
        nx = np.unique(inp[:, [0, 2]], axis=0)

        def t_grid(idx):
            t = np.unique(idx[idx[:, 1] != NO_TIME, 1])
            step = int(np.gcd.reduce(np.diff(t))) if len(t) > 1 else 0
            return int(t[0]), (step or self.time_stride), int(t[-1])

        start_in, step_in, _ = t_grid(inp)
        start_out, step_out, last_out = t_grid(out)
        step = math.gcd(math.gcd(step_out, step_in), self.time_stride)
        start_in = start_out - self.time_stride * self.num_left_inputs
        last_in = last_out + self.time_stride * self.num_right_inputs

        def layout(first, last, given):
            ts = np.arange(first, last + 1, step)
            grid = np.empty((len(ts) * len(nx), 3), dtype=np.int64)
            grid[:, 0] = np.tile(nx[:, 0], len(ts))
            grid[:, 1] = np.repeat(ts, len(nx))
            grid[:, 2] = np.tile(nx[:, 1], len(ts))
            present = KeySet.from_indexes(given[given[:, 1] != NO_TIME]).contains(pack(grid))
            grid[~present, 1] = NO_TIME
            return grid

        return layout(start_in, last_in, inp), layout(start_out, last_out, out)

    # -- math ------------------------------------------------------------------------
    def _split(self, values):
        """[rows, input_dim] -> views (keys, values, query key part, query context
        part), each [rows, heads, ...]."""
        x = values.reshape(len(values), self.num_heads, self.input_dim_per_head)
        kd, vd = self.key_dim, self.value_dim
        return x[..., :kd], x[..., kd:kd + vd], x[..., kd + vd:2 * kd + vd], x[..., 2 * kd + vd:]

    def _padded(self, in_value):
        """The input with one zero row appended (for absent optional inputs)."""
        xp = namespace(in_value)
        return xp.concatenate([in_value, xp.zeros((1, in_value.shape[1]), like=in_value)])

    def _context(self, indexes: AttentionIndexes, in_value):
        """(query rows, flat context rows) as index arrays, and the keys and values of
        every output's context, each [out, ctx, heads, dim]."""
        xp = namespace(in_value)
        qrows, flat = indexes.tables(self.num_left_inputs)
        qrows, flat = xp.index(qrows, like=in_value), xp.index(flat, like=in_value)
        ctx = xp.take(self._padded(in_value), flat)  # [out * ctx, input_dim]
        keys, vals, _, _ = self._split(ctx)
        shape = (len(indexes.context_rows), self.context_dim, self.num_heads)
        return qrows, flat, keys.reshape(*shape, -1), vals.reshape(*shape, -1)

    def propagate(self, indexes: AttentionIndexes, in_value, out_value):
        xp = namespace(in_value)
        qrows, _, k_ctx, v_ctx = self._context(indexes, in_value)
        _, _, q_key, q_ctx = self._split(xp.take(in_value, qrows))
        # (the scale rounded to the data's precision, as dtype.type(scale) did)
        scale = float(xp.scalar_type(in_value)(self.key_scale))
        b = scale * xp.einsum("ohk,ojhk->ohj", q_key, k_ctx) + q_ctx
        b -= xp.amax(b, axis=2, keepdims=True)
        c = xp.exp(b)
        c /= xp.sum(c, axis=2, keepdims=True)  # [out, heads, ctx]
        out = out_value.reshape(len(out_value), self.num_heads, self.output_dim_per_head)
        # Kaldi adds the weighted values (PROPAGATE_ADDS) but copies c.
        out[..., :self.value_dim] += xp.einsum("ohj,ojhv->ohv", c, v_ctx)
        if self.output_context:
            out[..., self.value_dim:] = c
        return c

    def backprop(self, indexes: AttentionIndexes, in_value, out_value, out_deriv, memo, grad,
                 in_deriv) -> None:
        if in_deriv is None:
            return
        c = memo  # [out, heads, ctx] softmax weights from propagate
        xp = namespace(in_value)
        qrows, flat, k_ctx, v_ctx = self._context(indexes, in_value)
        _, _, q_key, _ = self._split(xp.take(in_value, qrows))
        dout = out_deriv.reshape(len(out_deriv), self.num_heads, self.output_dim_per_head)
        d_val_out = dout[..., :self.value_dim]
        dc = xp.einsum("ohv,ojhv->ohj", d_val_out, v_ctx)
        if self.output_context:
            dc = dc + dout[..., self.value_dim:]
        db = c * (dc - xp.sum(c * dc, axis=2, keepdims=True))  # through the softmax
        scale = float(xp.scalar_type(in_value)(self.key_scale))
        # Everything is accumulated into a padded copy; the zero row's share is dropped.
        acc = xp.zeros((len(in_value) + 1, in_deriv.shape[1]), like=in_value)
        d_keys, d_vals, d_qkey, d_qctx = self._split(acc)
        heads = self.num_heads
        xp.add_at(d_qctx, qrows, db)
        xp.add_at(d_qkey, qrows, scale * xp.einsum("ohj,ojhk->ohk", db, k_ctx))
        xp.add_at(d_keys, flat, (scale * xp.einsum("ohj,ohk->ojhk", db, q_key)).reshape(
            -1, heads, self.key_dim))
        xp.add_at(d_vals, flat, xp.einsum("ohj,ohv->ojhv", c, d_val_out).reshape(
            -1, heads, self.value_dim))
        in_deriv += acc[:-1]

    def store_stats(self, in_value, out_value, memo) -> None:
        """Accumulate per-head posterior sums and entropies of the attention
        weights. (Kaldi samples one minibatch in three at random to save time;
        we use every minibatch, which has the same expected averages.)"""
        xp = namespace(memo)
        c = xp.astype(memo, xp.float64)  # [out, heads, ctx]
        if self._entropy_stats.shape != (self.num_heads,):  # (the host value's shape)
            self.entropy_stats = np.zeros(self.num_heads)
            self.posterior_stats = np.zeros((self.num_heads, self.context_dim))
            self.stats_count = 0.0
        # (summed on the arrays' device; on a GPU they stay there until read)
        device_stats.add(self, "posterior_stats", xp.sum(c, axis=0))
        device_stats.add(self, "entropy_stats",
                         -xp.sum(c * xp.log(xp.maximum(c, 1e-20)), axis=(0, 2)))
        self.stats_count += len(c)

    def zero_stats(self) -> None:
        self.entropy_stats = np.zeros_like(self.entropy_stats)
        self.posterior_stats = np.zeros_like(self.posterior_stats)
        self.stats_count = 0.0


__all__ = ["RestrictedAttentionComponent", "AttentionIndexes", "NO_TIME"]
