"""The old (deprecated in Kaldi, still readable) 3-D convolution and max-pooling.

Both are *simple* components over rows that hold a vectorized 3-D tensor
(x, y, z) -- e.g. x = time offsets spliced by an Append descriptor, y = frequency,
z = channels. Each works by gathering input columns into *patches* (one gather
map, precomputed from the geometry), doing dense math on the patches, and for the
backward pass scatter-adding patch derivatives back into input columns.

Output layouts (Kaldi's):

* ConvolutionComponent: column ``(x_step * num_y_steps + y_step) * num_filters + f``
  (i.e. zyx with the filters as z).
* MaxpoolingComponent: column ``(x_pool * num_pools_y + y_pool) * num_pools_z + z_pool``
  (zyx); the input is assumed zyx.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .base import (
    Component,
    Flags,
    UpdatableComponent,
    register,
    require,
)
from .fields import UPDATABLE_HEADER, Custom, Field, positive
from .xp import namespace

YZX, ZYX = 0, 1  # Kaldi's TensorVectorizationType values (written as ints)
_ORDER_NAMES = {"yzx": YZX, "zyx": ZYX}


class _ColumnScatter:
    """Adds columns of a patch matrix into the input columns they were gathered from.

    ``column_map[j]`` is the input column of patch column j; several patch columns
    may map to one input column (overlapping patches). The entries are split into
    layers in which every input column occurs at most once, so each layer is one
    vectorized ``dst[:, cols] += src[:, idx]`` (Kaldi's RearrangeIndexes + AddCols).
    """

    def __init__(self, column_map: np.ndarray, num_cols: int):
        column_map = np.asarray(column_map, dtype=np.int64)
        order = np.argsort(column_map, kind="stable")
        dst_sorted = column_map[order]
        starts = np.searchsorted(dst_sorted, dst_sorted, side="left")
        rank = np.arange(len(order)) - starts  # occurrence number within its column
        self.layers: list[tuple[np.ndarray, np.ndarray]] = []
        for layer in range(int(rank.max()) + 1 if len(rank) else 0):
            sel = rank == layer
            self.layers.append((dst_sorted[sel], order[sel]))
        self.num_cols = num_cols

    def add_to(self, dst, src) -> None:
        xp = namespace(dst)
        for cols, idx in self.layers:
            dst[:, xp.index(cols, like=dst)] += src[:, xp.index(idx, like=src)]


def _vectorization(tag: str, value: int, comp) -> str | None:
    return None if value in (YZX, ZYX) else f"{tag} must be 0 (yzx) or 1 (zyx)"


def _filter_shape(tag: str, filters: np.ndarray, comp) -> str | None:
    if filters.shape[1] == comp.filter_dim and filters.shape[0]:
        return None
    return f"{tag} has shape {filters.shape}, expected [num-filters, {comp.filter_dim}]"


def _one_bias_per_filter(tag: str, bias: np.ndarray, comp) -> str | None:
    num_filters = comp.filter_params.shape[0]
    return None if bias.shape[0] == num_filters else (
        f"{tag} has dim {bias.shape[0]}, expected {num_filters}")


def _raise_at(r):
    """A ``fail(message)`` for the shared geometry checks: a FormatError here."""
    def fail(message: str):
        raise r.error(message)
    return fail


# ----------------------------------------------------------------------------------
@register
class ConvolutionComponent(UpdatableComponent):
    """2-D convolution of a 3-D tensor: filters span all of z and hop over x and y.

    ``filter_params`` [num_filters, filt_x_dim * filt_y_dim * input_z_dim] holds each
    filter vectorized zyx; ``bias_params`` [num_filters]. For each of the
    ``num_x_steps * num_y_steps`` filter positions, output = patch . filter + bias.
    Propagate and backprop ADD into their outputs (Kaldi's kPropagateAdds /
    kBackpropAdds).
    """

    type_name = "ConvolutionComponent"

    def __init__(self):
        super().__init__()
        self.input_x_dim = self.input_y_dim = self.input_z_dim = 0
        self.filt_x_dim = self.filt_y_dim = 0
        self.filt_x_step = self.filt_y_step = 1
        self.input_vectorization = ZYX
        self.filter_params = np.zeros((0, 0), dtype=np.float32)
        self.bias_params = np.zeros(0, dtype=np.float32)
        self._cache: tuple | None = None

    # -- geometry --------------------------------------------------------------------
    @property
    def num_x_steps(self) -> int:
        return 1 + (self.input_x_dim - self.filt_x_dim) // self.filt_x_step

    @property
    def num_y_steps(self) -> int:
        return 1 + (self.input_y_dim - self.filt_y_dim) // self.filt_y_step

    @property
    def num_filters(self) -> int:
        return self.filter_params.shape[0]

    @property
    def filter_dim(self) -> int:
        return self.filt_x_dim * self.filt_y_dim * self.input_z_dim

    @property
    def input_dim(self) -> int:
        return self.input_x_dim * self.input_y_dim * self.input_z_dim

    @property
    def output_dim(self) -> int:
        return self.num_x_steps * self.num_y_steps * self.num_filters

    def _geometry(self) -> tuple:
        return (self.input_x_dim, self.input_y_dim, self.input_z_dim, self.filt_x_dim,
                self.filt_y_dim, self.filt_x_step, self.filt_y_step, self.input_vectorization)

    def _patch_map(self) -> tuple[np.ndarray, _ColumnScatter]:
        """Input column of each patch column: patches ordered (x_step, y_step), each
        patch vectorized (x, y, z) with z fastest. Cached per geometry."""
        key = self._geometry()
        if self._cache is None or self._cache[0] != key:
            xs, ys = np.arange(self.num_x_steps), np.arange(self.num_y_steps)
            fx, fy, z = (np.arange(self.filt_x_dim), np.arange(self.filt_y_dim),
                         np.arange(self.input_z_dim))
            X = (xs[:, None, None, None, None] * self.filt_x_step + fx[None, None, :, None, None])
            Y = (ys[None, :, None, None, None] * self.filt_y_step + fy[None, None, None, :, None])
            Z = z[None, None, None, None, :]
            yz = self.input_y_dim * self.input_z_dim
            if self.input_vectorization == ZYX:
                cols = yz * X + self.input_z_dim * Y + Z
            else:
                cols = yz * X + self.input_y_dim * Z + Y
            column_map = np.broadcast_to(cols, (len(xs), len(ys), len(fx), len(fy), len(z)))
            column_map = column_map.reshape(-1).copy()
            self._cache = (key, column_map, _ColumnScatter(column_map, self.input_dim))
        return self._cache[1], self._cache[2]

    def properties(self) -> Flags:
        return (Flags.SIMPLE | Flags.UPDATABLE | Flags.BACKPROP_NEEDS_INPUT
                | Flags.BACKPROP_ADDS | Flags.PROPAGATE_ADDS)

    def info(self) -> str:
        return (f"{self.type_name}, input-dim={self.input_dim}, output-dim={self.output_dim}"
                + self.updatable_info()
                + f", input-x-dim={self.input_x_dim}, input-y-dim={self.input_y_dim}"
                f", input-z-dim={self.input_z_dim}, filt-x-dim={self.filt_x_dim}"
                f", filt-y-dim={self.filt_y_dim}, filt-x-step={self.filt_x_step}"
                f", filt-y-step={self.filt_y_step}"
                f", input-vectorization={self.input_vectorization}"
                f", num-filters={self.num_filters}")

    def _check_geometry(self, fail) -> None:
        """Kaldi's dimension rules; ``fail(message)`` raises the right error type."""
        for name in ("input_x_dim", "input_y_dim", "input_z_dim", "filt_x_dim", "filt_y_dim",
                     "filt_x_step", "filt_y_step"):
            if getattr(self, name) <= 0:
                fail(f"{name.replace('_', '-')} must be positive, got {getattr(self, name)}")
        if self.filt_x_dim > self.input_x_dim or self.filt_y_dim > self.input_y_dim:
            fail("filter is larger than the input")
        if (self.input_x_dim - self.filt_x_dim) % self.filt_x_step:
            fail("(input-x-dim - filt-x-dim) must be a multiple of filt-x-step")
        if (self.input_y_dim - self.filt_y_dim) % self.filt_y_step:
            fail("(input-y-dim - filt-y-dim) must be a multiple of filt-y-step")

    # -- config and files ------------------------------------------------------------
    @classmethod
    def from_config(cls, cfg, rng: np.random.Generator) -> ConvolutionComponent:
        comp = cls()
        comp.init_updatable_from_config(cfg)
        require(min(comp.learning_rate, comp.learning_rate_factor, comp.max_change,
                    comp.l2_regularize) >= 0.0, cfg, "learning rates etc. must be >= 0")
        comp.input_x_dim = cfg.get_int("input-x-dim", required=True)
        comp.input_y_dim = cfg.get_int("input-y-dim", required=True)
        comp.input_z_dim = cfg.get_int("input-z-dim", required=True)
        comp.filt_x_dim = cfg.get_int("filt-x-dim", required=True)
        comp.filt_y_dim = cfg.get_int("filt-y-dim", required=True)
        comp.filt_x_step = cfg.get_int("filt-x-step", required=True)
        comp.filt_y_step = cfg.get_int("filt-y-step", required=True)
        order = cfg.get_str("input-vectorization-order", "zyx")
        if order not in _ORDER_NAMES:
            raise cfg.error(f"input-vectorization-order={order!r}: accepted are 'yzx' "
                            "and 'zyx'")
        comp.input_vectorization = _ORDER_NAMES[order]

        def fail(message):
            raise cfg.error(message)

        comp._check_geometry(fail)
        filter_dim = comp.filter_dim
        matrix_file = cfg.get_str("matrix")
        if matrix_file is not None:
            # Filters and (last column) biases from a Kaldi matrix file.
            from ..io.kaldi_stream import make_reader

            try:
                data = Path(matrix_file).read_bytes()
            except OSError as e:
                raise cfg.error(f"matrix={matrix_file}: cannot read ({e})") from None
            mat = make_reader(data, matrix_file).read_matrix()
            if mat.shape[1] != filter_dim + 1 or mat.shape[0] == 0:
                raise cfg.error(f"matrix={matrix_file}: expected {filter_dim + 1} columns "
                                f"(filter dim + bias), got {mat.shape}")
            cfg.check_all_used()
            comp.filter_params = np.ascontiguousarray(mat[:, :filter_dim], dtype=np.float32)
            comp.bias_params = np.ascontiguousarray(mat[:, filter_dim], dtype=np.float32)
            return comp
        num_filters = cfg.get_int("num-filters", required=True)
        param_stddev = cfg.get_float("param-stddev", 1.0 / np.sqrt(filter_dim))
        bias_stddev = cfg.get_float("bias-stddev", 1.0)
        cfg.check_all_used()
        require(num_filters > 0, cfg, f"num-filters must be positive, got {num_filters}")
        require(param_stddev >= 0.0 and bias_stddev >= 0.0, cfg,
                "param-stddev and bias-stddev must be >= 0")
        comp.filter_params = (rng.standard_normal((num_filters, filter_dim))
                              * param_stddev).astype(np.float32)
        comp.bias_params = (rng.standard_normal(num_filters) * bias_stddev).astype(np.float32)
        return comp

    kaldi_fields = (
        UPDATABLE_HEADER,
        *(Field(tag, attr, "int", check=positive) for tag, attr in (
            ("<InputXDim>", "input_x_dim"), ("<InputYDim>", "input_y_dim"),
            ("<InputZDim>", "input_z_dim"), ("<FiltXDim>", "filt_x_dim"),
            ("<FiltYDim>", "filt_y_dim"), ("<FiltXStep>", "filt_x_step"),
            ("<FiltYStep>", "filt_y_step"))),
        Field("<InputVectorization>", "input_vectorization", "int", check=_vectorization),
        Custom(lambda comp, r: comp._check_geometry(_raise_at(r)), None),
        Field("<FilterParams>", "filter_params", "matrix", finite="<FilterParams>",
              check=_filter_shape),
        Field("<BiasParams>", "bias_params", "vector", finite="<BiasParams>",
              check=_one_bias_per_filter),
        # The trailing <IsGradient> is optional on reading; it overrides the header's.
        Field("<IsGradient>", "is_gradient", "bool", default=False),
    )

    # -- parameters ------------------------------------------------------------------
    def params(self) -> dict[str, np.ndarray]:
        return {"filter_params": self.filter_params, "bias_params": self.bias_params}

    # -- math ------------------------------------------------------------------------
    def _patches(self, in_value):
        """[rows, num_patches, filter_dim]: the gathered input."""
        column_map, _ = self._patch_map()
        cols = namespace(in_value).index(column_map, like=in_value)
        return in_value[:, cols].reshape(in_value.shape[0], -1, self.filter_dim)

    def propagate(self, indexes, in_value, out_value) -> None:
        xp = namespace(in_value)
        w = xp.param(self.filter_params, like=in_value)
        b = xp.param(self.bias_params, like=in_value)
        y = self._patches(in_value) @ w.T + b  # [rows, patches, filters]
        out_value += y.reshape(in_value.shape[0], -1)
        return None

    def backprop(self, indexes, in_value, out_value, out_deriv, memo, grad, in_deriv) -> None:
        xp = namespace(out_deriv)
        rows = out_deriv.shape[0]
        dy = out_deriv.reshape(rows, -1, self.num_filters)  # [rows, patches, filters]
        if in_deriv is not None:
            w = xp.param(self.filter_params, like=out_deriv)
            patch_deriv = (dy @ w).reshape(rows, -1)
            _, scatter = self._patch_map()
            scatter.add_to(in_deriv, patch_deriv)
        if grad is not None:
            patches = self._patches(in_value)
            grad["filter_params"] += xp.einsum("rpk,rpf->kf", dy, patches)
            grad["bias_params"] += xp.sum(dy, axis=(0, 1))


# ----------------------------------------------------------------------------------
@register
class MaxpoolingComponent(Component):
    """3-D max pooling over a zyx-vectorized tensor (pools may overlap).

    Backprop: every input element equal to its pool's maximum receives that pool's
    output derivative (ties all receive it), summed over the pools it is in; the
    result is ADDED to ``in_deriv`` (Kaldi's kBackpropAdds).
    """

    type_name = "MaxpoolingComponent"

    _FIELDS = ("input_x_dim", "input_y_dim", "input_z_dim", "pool_x_size", "pool_y_size",
               "pool_z_size", "pool_x_step", "pool_y_step", "pool_z_step")
    _TAGS = ("<InputXDim>", "<InputYDim>", "<InputZDim>", "<PoolXSize>", "<PoolYSize>",
             "<PoolZSize>", "<PoolXStep>", "<PoolYStep>", "<PoolZStep>")

    def __init__(self, **dims: int):
        for name in self._FIELDS:
            setattr(self, name, int(dims.get(name, 0)))
        self._cache: tuple | None = None

    def _num_pools(self) -> tuple[int, int, int]:
        return (1 + (self.input_x_dim - self.pool_x_size) // self.pool_x_step,
                1 + (self.input_y_dim - self.pool_y_size) // self.pool_y_step,
                1 + (self.input_z_dim - self.pool_z_size) // self.pool_z_step)

    @property
    def input_dim(self) -> int:
        return self.input_x_dim * self.input_y_dim * self.input_z_dim

    @property
    def output_dim(self) -> int:
        px, py, pz = self._num_pools()
        return px * py * pz

    @property
    def pool_size(self) -> int:
        return self.pool_x_size * self.pool_y_size * self.pool_z_size

    def properties(self) -> Flags:
        return (Flags.SIMPLE | Flags.BACKPROP_NEEDS_INPUT | Flags.BACKPROP_NEEDS_OUTPUT
                | Flags.BACKPROP_ADDS)

    def info(self) -> str:
        return self.type_name + "".join(
            f", {name.replace('_', '-')}={getattr(self, name)}" for name in self._FIELDS)

    def _check(self, fail) -> None:
        """Kaldi's MaxpoolingComponent::Check."""
        for name in self._FIELDS:
            if getattr(self, name) <= 0:
                fail(f"{name.replace('_', '-')} must be positive, got {getattr(self, name)}")
        for axis in "xyz":
            dim = getattr(self, f"input_{axis}_dim")
            size = getattr(self, f"pool_{axis}_size")
            step = getattr(self, f"pool_{axis}_step")
            if dim < size:
                fail(f"pool-{axis}-size {size} exceeds input-{axis}-dim {dim}")
            if size < step:
                fail(f"pool-{axis}-step {step} exceeds pool-{axis}-size {size}")
            if (dim - size) % step:
                fail(f"(input-{axis}-dim - pool-{axis}-size) must be a multiple of "
                     f"pool-{axis}-step")

    def _patch_map(self) -> tuple[np.ndarray, _ColumnScatter]:
        """Input column of each patch column, ordered (x, y, z) within the pool, then
        (x_pool, y_pool, z_pool): block q of ``num_pools`` columns holds the q-th member
        of every pool, in output order. Cached per geometry."""
        key = tuple(getattr(self, name) for name in self._FIELDS)
        if self._cache is None or self._cache[0] != key:
            npx, npy, npz = self._num_pools()
            x = np.arange(self.pool_x_size)[:, None, None, None, None, None]
            y = np.arange(self.pool_y_size)[None, :, None, None, None, None]
            z = np.arange(self.pool_z_size)[None, None, :, None, None, None]
            xp = np.arange(npx)[None, None, None, :, None, None]
            yp = np.arange(npy)[None, None, None, None, :, None]
            zp = np.arange(npz)[None, None, None, None, None, :]
            cols = ((xp * self.pool_x_step + x) * (self.input_y_dim * self.input_z_dim)
                    + (yp * self.pool_y_step + y) * self.input_z_dim
                    + (zp * self.pool_z_step + z))
            column_map = cols.reshape(-1).copy()
            self._cache = (key, column_map, _ColumnScatter(column_map, self.input_dim))
        return self._cache[1], self._cache[2]

    @classmethod
    def from_config(cls, cfg, rng: np.random.Generator | None = None) -> MaxpoolingComponent:
        dims = {name: cfg.get_int(name.replace("_", "-"), required=True)
                for name in cls._FIELDS}
        cfg.check_all_used()
        comp = cls(**dims)

        def fail(message):
            raise cfg.error(message)

        comp._check(fail)
        return comp

    kaldi_fields = (
        *(Field(tag, name, "int") for name, tag in zip(_FIELDS, _TAGS, strict=True)),
        Custom(lambda comp, r: comp._check(_raise_at(r)), None),
    )

    def _patches(self, in_value):
        column_map, _ = self._patch_map()
        cols = namespace(in_value).index(column_map, like=in_value)
        return in_value[:, cols].reshape(in_value.shape[0], self.pool_size, -1)

    def propagate(self, indexes, in_value, out_value) -> None:
        # Kaldi starts from -1e20, so that is the floor of the output (a Python float
        # takes the data's dtype, NEP 50).
        xp = namespace(in_value)
        xp.maximum(xp.amax(self._patches(in_value), axis=1), -1e20, out=out_value)
        return None

    def backprop(self, indexes, in_value, out_value, out_deriv, memo, grad, in_deriv) -> None:
        if in_deriv is None:
            return
        patches = self._patches(in_value)
        routed = (patches == out_value[:, None, :]) * out_deriv[:, None, :]
        _, scatter = self._patch_map()
        scatter.add_to(in_deriv, routed.reshape(in_value.shape[0], -1))


__all__ = ["ConvolutionComponent", "MaxpoolingComponent"]
