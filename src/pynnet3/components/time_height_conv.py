"""TimeHeightConvolutionComponent: 2-D convolution where one axis is time (the t index).

A row of the input is an image column: ``height-in`` pixels, each with
``num-filters-in`` values (filter index has stride 1, i.e. column
``h * num_filters_in + f``); likewise the output with ``height-out`` and
``num-filters-out``. The kernel is a list of (time-offset, height-offset) pairs;
output row (n, t, x) at height h is::

    bias + sum_i W_i · input(n, t + time_offset_i, x)[h * height_subsample_out + height_offset_i]

with ``linear_params`` W = [W_0 | W_1 | ...] of shape [num-filters-out,
num-offsets * num-filters-in] (offset-major columns). Heights outside
[0, height-in) are zero padding. Time offsets not in ``required-time-offsets``
are optional: when the input row is absent it contributes zero (time padding).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import ComputeError
from .base import Flags, InputDeps, UpdatableComponent, register
from .fields import UPDATABLE_HEADER, Custom, Field, pair, read_fields, write_fields
from .preconditioning import precondition_two_sided, preconditioners
from .tdnn import (
    OffsetGather,
    stretch_offset_gather,
    time_offset_deps,
    time_offset_sources,
)
from .xp import namespace

_MODEL_FIELDS = (
    Field("<NumFiltersIn>", "num_filters_in", "int"),
    Field("<NumFiltersOut>", "num_filters_out", "int"),
    Field("<HeightIn>", "height_in", "int"),
    Field("<HeightOut>", "height_out", "int"),
    Field("<HeightSubsampleOut>", "height_subsample_out", "int"),
    Field("<Offsets>", "offsets", "int_pair_vector",
          convert=lambda v: [(int(a), int(b)) for a, b in v]),
    # Kaldi keeps these in a std::set: sorted, unique.
    Field("<RequiredTimeOffsets>", "required_time_offsets", "int_vector",
          convert=lambda v: sorted({int(t) for t in v})),
)


@dataclass
class ConvolutionModel:
    """The structure of a time-height convolution (Kaldi's ``ConvolutionModel``).

    Invariant (checked by :meth:`problem`): ``offsets`` sorted and unique (time
    major); ``required_time_offsets`` a non-empty subset of the time offsets; every
    output height sees at least one real input pixel through a required offset; every
    offset is used by some output height.
    """

    num_filters_in: int = 1
    num_filters_out: int = 1
    height_in: int = 1
    height_out: int = 1
    height_subsample_out: int = 1
    offsets: list[tuple[int, int]] = field(default_factory=lambda: [(0, 0)])
    required_time_offsets: list[int] = field(default_factory=lambda: [0])

    @property
    def all_time_offsets(self) -> list[int]:
        return sorted({t for t, _ in self.offsets})

    @property
    def input_dim(self) -> int:
        return self.height_in * self.num_filters_in

    @property
    def output_dim(self) -> int:
        return self.height_out * self.num_filters_out

    @property
    def param_shape(self) -> tuple[int, int]:
        return self.num_filters_out, len(self.offsets) * self.num_filters_in

    def problem(self) -> str | None:
        """Why the model is invalid (Kaldi's ``Check(false, true)``), or None."""
        if min(self.num_filters_in, self.num_filters_out, self.height_in, self.height_out,
               self.height_subsample_out) <= 0:
            return "filter counts, heights and height-subsample-out must be > 0"
        if not self.offsets or not self.required_time_offsets:
            return "offsets and required-time-offsets must be non-empty"
        if self.offsets != sorted(set(self.offsets)):
            return "offsets must be sorted and unique"
        if not set(self.required_time_offsets) <= set(self.all_time_offsets):
            return "required-time-offsets must be a subset of the time offsets"
        used = [False] * len(self.offsets)
        required = set(self.required_time_offsets)
        for h_out in range(0, self.height_out * self.height_subsample_out,
                           self.height_subsample_out):
            some_input = False
            for i, (t_off, h_off) in enumerate(self.offsets):
                if 0 <= h_out + h_off < self.height_in:
                    used[i] = True
                    some_input = some_input or t_off in required
            if not some_input:
                return (f"output height {h_out // self.height_subsample_out} sees no input "
                        f"when only the required time offsets are present")
        if not all(used):
            t_off, h_off = self.offsets[used.index(False)]
            return f"offset ({t_off},{h_off}) is never used"
        return None

    def read(self, r) -> None:
        pos = r.pos
        if r.peek_token() == "<ConvolutionModel>":  # Kaldi accepts the model without it
            r.read_token()
        read_fields(r, self, _MODEL_FIELDS)
        r.expect_token("</ConvolutionModel>")
        bad = self.problem()
        if bad is not None:
            raise r.error(f"invalid convolution model: {bad}", pos=pos)

    def write(self, w) -> None:
        w.write_token("<ConvolutionModel>")
        write_fields(w, self, _MODEL_FIELDS)
        w.write_token("</ConvolutionModel>")

    def info(self) -> str:
        offs = " ".join(f"{t},{h}" for t, h in self.offsets)
        req = ",".join(str(t) for t in self.required_time_offsets)
        return (f"num-filters-in={self.num_filters_in}, num-filters-out={self.num_filters_out}, "
                f"height-in={self.height_in}, height-out={self.height_out}, "
                f"height-subsample-out={self.height_subsample_out}, "
                f"{{time,height}}-offsets=[{offs}], required-time-offsets=[{req}]")


def _model_param_shape(tag: str, linear: np.ndarray, comp) -> str | None:
    rows, cols = comp.model.param_shape
    return None if linear.shape == (rows, cols) else f"{tag} must be {rows} x {cols} for this model"


def _one_per_filter(tag: str, bias: np.ndarray, comp) -> str | None:
    if bias.shape == (comp.model.num_filters_out,):
        return None
    return f"{tag} must have num-filters-out values"


@register
class TimeHeightConvolutionComponent(UpdatableComponent):
    """Convolution over (time, height) (see module docstring).

    Invariants: ``linear_params`` has ``model.param_shape``; ``bias_params`` has
    ``num_filters_out`` values.
    """

    type_name = "TimeHeightConvolutionComponent"

    def __init__(self, model: ConvolutionModel | None = None):
        super().__init__()
        self.model = model or ConvolutionModel()
        self.linear_params = np.zeros(self.model.param_shape, dtype=np.float32)
        self.bias_params = np.zeros(self.model.num_filters_out, dtype=np.float32)
        self.max_memory_mb = 200.0
        self.use_natural_gradient = True
        self.num_minibatches_history = 4.0
        self.alpha_in = 4.0
        self.alpha_out = 4.0
        self.rank_in = 1
        self.rank_out = 1

    # -- structure -------------------------------------------------------------------
    @property
    def input_dim(self) -> int:
        return self.model.input_dim

    @property
    def output_dim(self) -> int:
        return self.model.output_dim

    def properties(self) -> Flags:
        return (Flags.UPDATABLE | Flags.REORDERS_INDEXES | Flags.BACKPROP_ADDS
                | Flags.BACKPROP_NEEDS_INPUT | Flags.INPUT_CONTIGUOUS | Flags.OUTPUT_CONTIGUOUS)

    def info(self) -> str:
        return (super().info() + self.updatable_info() + ", " + self.model.info()
                + f", num-params={self.num_params()}")

    # -- construction ----------------------------------------------------------------
    @classmethod
    def from_config(cls, cfg, rng: np.random.Generator) -> TimeHeightConvolutionComponent:
        m = ConvolutionModel()
        m.num_filters_in = cfg.get_int("num-filters-in", required=True)
        m.num_filters_out = cfg.get_int("num-filters-out", required=True)
        m.height_in = cfg.get_int("height-in", required=True)
        m.height_out = cfg.get_int("height-out", required=True)
        m.height_subsample_out = cfg.get_int("height-subsample-out", 1)
        comp = cls(m)
        comp.init_updatable_from_config(cfg)
        comp.max_memory_mb = cfg.get_float("max-memory-mb", 200.0)
        if comp.max_memory_mb <= 0.0:
            raise cfg.error("max-memory-mb must be > 0")

        if cfg.has("offsets"):
            raw = cfg.get_str("offsets")
            pairs = []
            for piece in raw.split(";"):
                try:
                    t_off, h_off = (int(v) for v in piece.split(","))
                except ValueError:
                    raise cfg.error(f"bad offsets={raw!r}: expected t,h;t,h;...") from None
                pairs.append((t_off, h_off))
            if len(set(pairs)) != len(pairs):
                raise cfg.error(f"repeated offset in offsets={raw!r}")
            m.offsets = sorted(pairs)
        elif cfg.has("height-offsets") and cfg.has("time-offsets"):
            heights = cfg.get_int_list("height-offsets")
            times = cfg.get_int_list("time-offsets")
            for name, vals in (("height-offsets", heights), ("time-offsets", times)):
                if not vals or vals != sorted(set(vals)):
                    raise cfg.error(f"{name} must be non-empty, sorted and unique")
            m.offsets = [(t, h) for t in times for h in heights]
        else:
            raise cfg.error("expected either offsets=, or both height-offsets= and "
                            "time-offsets=")
        if cfg.has("required-time-offsets"):
            req = cfg.get_int_list("required-time-offsets")
            if not req or req != sorted(set(req)):
                raise cfg.error("required-time-offsets must be non-empty, sorted and unique")
            m.required_time_offsets = req
        else:
            m.required_time_offsets = m.all_time_offsets
        bad = m.problem()
        if bad is not None:
            raise cfg.error(f"convolution parameters do not make sense: {bad}")

        param_stddev = cfg.get_float("param-stddev", -1.0)
        bias_stddev = cfg.get_float("bias-stddev", 0.0)
        init_unit = cfg.get_bool("init-unit", False)
        comp.use_natural_gradient = cfg.get_bool("use-natural-gradient", True)
        rank_in = cfg.get_int("rank-in", -1)
        rank_out = cfg.get_int("rank-out", -1)
        comp.alpha_in = cfg.get_float("alpha-in", 4.0)
        comp.alpha_out = cfg.get_float("alpha-out", 4.0)
        comp.num_minibatches_history = cfg.get_float("num-minibatches-history", 4.0)
        cfg.check_all_used()

        rows, cols = m.param_shape
        if init_unit:
            if m.num_filters_in != m.num_filters_out:
                raise cfg.error("init-unit needs num-filters-in == num-filters-out")
            if (0, 0) not in m.offsets:
                raise cfg.error("init-unit needs the offset (0, 0) in the model")
            comp.linear_params = np.zeros((rows, cols), dtype=np.float32)
            k = m.offsets.index((0, 0)) * m.num_filters_in
            comp.linear_params[:, k:k + m.num_filters_in] = np.eye(rows, dtype=np.float32)
        else:
            if param_stddev < 0.0:
                param_stddev = 1.0 / math.sqrt(m.num_filters_in * len(m.offsets))
            comp.linear_params = (param_stddev * rng.standard_normal((rows, cols))
                                  ).astype(np.float32)
        comp.bias_params = (bias_stddev * rng.standard_normal(m.num_filters_out)
                            ).astype(np.float32)
        comp.rank_in = rank_in if rank_in >= 0 else min(80, (cols + 2) // 2)
        comp.rank_out = rank_out if rank_out >= 0 else min(80, (rows + 1) // 2)
        return comp

    kaldi_fields = (
        UPDATABLE_HEADER,
        Custom("_read_model", "_write_model"),
        Field("<LinearParams>", "linear_params", "matrix", finite="<LinearParams>",
              check=_model_param_shape),
        Field("<BiasParams>", "bias_params", "vector", finite="<BiasParams>",
              check=_one_per_filter),
        Field("<MaxMemoryMb>", "max_memory_mb", "float"),
        Field("<UseNaturalGradient>", "use_natural_gradient", "bool"),
        Field("<NumMinibatchesHistory>", "num_minibatches_history", "float"),
        *pair("<AlphaInOut>", "alpha", "float"),
        *pair("<RankInOut>", "rank", "int"),
    )

    def _read_model(self, r) -> None:
        r.expect_token("<Model>")
        self.model.read(r)

    def _write_model(self, w) -> None:
        w.write_token("<Model>")
        self.model.write(w)

    # -- parameters ------------------------------------------------------------------
    def params(self) -> dict[str, np.ndarray]:
        return {"linear_params": self.linear_params, "bias_params": self.bias_params}

    def export_gradient(self, grad: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Kaldi's Vectorize: linear params row-major, then the bias."""
        xp = namespace(grad["linear_params"])  # (the backend's arrays, on its device)
        return {"params_vectorized": xp.concatenate(
            [grad["linear_params"].reshape(-1), grad["bias_params"].reshape(-1)])}

    # -- indexes ---------------------------------------------------------------------
    def input_indexes(self, output_indexes: np.ndarray) -> InputDeps:
        times = self.model.all_time_offsets
        required = set(self.model.required_time_offsets)
        return time_offset_deps(output_indexes, times, [t in required for t in times])

    def precompute_indexes(self, input_indexes: np.ndarray, output_indexes: np.ndarray,
                           need_backprop: bool) -> OffsetGather:
        times = self.model.all_time_offsets
        src = time_offset_sources(input_indexes, output_indexes, times)
        required = set(self.model.required_time_offsets)
        for k, t_off in enumerate(times):
            if t_off in required and src[k].size and src[k].min() < 0:
                j = int(np.argmin(src[k]))
                n, t, x = np.asarray(output_indexes)[j].tolist()
                raise ComputeError(
                    f"{self.type_name}: output (n={n}, t={t}, x={x}) needs input "
                    f"t={t + t_off} (a required time offset), which is not among the input rows")
        return OffsetGather(src, len(input_indexes))

    def stretch_precomputed(self, mini_indexes, input_indexes: np.ndarray,
                            output_indexes: np.ndarray, need_backprop: bool,
                            stretch_rows) -> OffsetGather | None:
        """Shortcut expansion's hook (see TdnnComponent.stretch_precomputed): each
        time offset's sources lie in the output row's own sequence; -1 (an absent
        optional input) stays -1 in every sequence, and a required offset had none in
        the two-sequence object (its precompute_indexes would have raised)."""
        if not isinstance(mini_indexes, OffsetGather):
            return None
        return stretch_offset_gather(mini_indexes, input_indexes, output_indexes,
                                     stretch_rows)

    # -- math ------------------------------------------------------------------------
    def _pixel_tables(self, indexes: OffsetGather) -> tuple[np.ndarray, list[np.ndarray]]:
        """``(flat, columns)``: the input pixel each output pixel reads through each
        kernel offset, with the input seen as [rows_in * height_in, num_filters_in]
        pixels (number ``row * height_in + height``) and one zero pixel appended
        (number ``rows_in * height_in``) for time and height padding. ``flat`` runs
        over (output row, output height, offset); ``columns[i]`` is offset i's part,
        contiguous. Host tables made once per precomputed object and model, so that
        ``xp.index`` keeps one device copy of each."""
        m = self.model
        key = (m.height_in, m.height_out, m.height_subsample_out, tuple(m.offsets))
        tables = indexes._derived("_pixel_tables", dict)
        made = tables.get(key)
        if made is None:
            zero = indexes.num_in * m.height_in
            t_index = {t: k for k, t in enumerate(m.all_time_offsets)}
            h_out = np.arange(m.height_out) * m.height_subsample_out
            table = np.empty((indexes.num_out, m.height_out, len(m.offsets)), dtype=np.int64)
            for i, (t_off, h_off) in enumerate(m.offsets):
                rows = indexes.src[t_index[t_off]]
                h_in = h_out + h_off
                pix = rows[:, None] * m.height_in + h_in[None, :]
                pix[(rows < 0)[:, None] | ((h_in < 0) | (h_in >= m.height_in))[None, :]] = zero
                table[:, :, i] = pix
            table = table.reshape(-1, len(m.offsets))
            made = tables[key] = (table.reshape(-1), [np.ascontiguousarray(table[:, i])
                                                      for i in range(len(m.offsets))])
        return made

    def _patches(self, indexes: OffsetGather, in_value):
        """[rows-out * height-out, num-offsets * num-filters-in]: for each output pixel
        the input pixels its kernel sees (zero where padded): one gather."""
        m = self.model
        xp = namespace(in_value)
        flat, _ = self._pixel_tables(indexes)
        pixels = xp.concatenate([in_value.reshape(-1, m.num_filters_in),
                                 xp.zeros((1, m.num_filters_in), like=in_value)])
        return xp.take(pixels, xp.index(flat, like=in_value)).reshape(
            indexes.num_out * m.height_out, -1)

    def propagate(self, indexes, in_value, out_value):
        m = self.model
        xp = namespace(in_value)
        w = xp.param(self.linear_params, like=in_value)
        out = self._patches(indexes, in_value) @ w.T
        out += xp.param(self.bias_params, like=in_value)
        out_value[:] = out.reshape(len(out_value), m.height_out * m.num_filters_out)
        return None

    def backprop(self, indexes, in_value, out_value, out_deriv, memo, grad, in_deriv) -> None:
        m = self.model
        xp = namespace(out_deriv)
        num_out = len(out_deriv)
        dout = out_deriv.reshape(num_out * m.height_out, m.num_filters_out)
        if grad is not None and preconditioners(grad) is not None:  # a trainer's NG
            precondition_two_sided(grad, ("linear_params", "bias_params"), xp.concatenate([
                dout.T @ self._patches(indexes, in_value), xp.sum(dout, axis=0)[:, None]],
                axis=1))
        elif grad is not None:
            g = grad["linear_params"]
            g += xp.astype(dout.T @ self._patches(indexes, in_value), g.dtype)
            gb = grad["bias_params"]
            gb += xp.astype(xp.sum(dout, axis=0), gb.dtype)
        if in_deriv is not None:
            w = xp.param(self.linear_params, like=out_deriv)
            dpatch = (dout @ w).reshape(num_out * m.height_out, len(m.offsets),
                                        m.num_filters_in)
            flat, columns = self._pixel_tables(indexes)
            # per input pixel; the last row is the zero (padding) pixel, dropped after
            acc = xp.zeros((len(in_deriv) * m.height_in + 1, m.num_filters_in), like=in_deriv)
            if xp.is_numpy:
                # One kernel offset maps distinct output pixels to distinct input pixels
                # (only the padding pixel repeats, and it is dropped): a plain indexed
                # add per offset, 4x faster than np.add.at over all of them.
                for i, cols in enumerate(columns):
                    acc[cols] += dpatch[:, i]
            else:  # one accumulating scatter on the device
                xp.add_at(acc, xp.index(flat, like=acc),
                          dpatch.reshape(-1, m.num_filters_in))
            in_deriv += acc[:-1].reshape(len(in_deriv), -1)  # BACKPROP_ADDS
