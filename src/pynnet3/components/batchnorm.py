"""BatchNormComponent: batch normalization in Kaldi's two modes.

* Training mode (``test_mode`` False): each minibatch is normalized with its own
  per-column mean and variance; propagate returns a memo (mean, uncentered
  variance, scale) that backprop and ``store_stats`` use.
* Test mode: a fixed affine map ``y = x * scale + offset`` derived from the
  accumulated statistics (count, sum, sum of squares).

With ``block-dim < dim`` each row is seen as ``dim/block-dim`` rows of
``block-dim`` columns (spatial batch norm), so statistics are shared by blocks.

The file stores ``<Count>`` (double) and ``<StatsMean>`` / ``<StatsVar>``. Kaldi
reads the mean and variance as doubles (a text file's decimals straight into
float64), keeps count-scaled sums, and writes mean/variance again from the sums
in float32 arithmetic, which can move a value by a float rounding step. The sums
here are Kaldi's (so is the test-mode transform made from them); the file's
mean/variance are also kept and written back unchanged until the statistics change
(new stats, zeroing, invented test-mode stats) or :meth:`forget_file_stats` is
called, so a read->write round trip is byte-identical. The command-line tools call
it before writing: their files are the bytes Kaldi's tools write (``nnet3-copy``'s
output, checked against Kaldi's).
"""

from __future__ import annotations

import warnings

import numpy as np

from . import device_stats, np_kernels
from .affine import f32
from .base import Component, Flags, check_finite, register, require
from .device_stats import stats_attribute
from .fields import REPEATED_OPENING, Custom, Field, positive
from .xp import namespace


def _block_divides_dim(tag: str, block_dim: int, comp) -> str | None:
    if block_dim > 0 and comp.dim % block_dim == 0:
        return None
    return f"{tag} must be positive and divide <Dim> {comp.dim}"


@register
class BatchNormComponent(Component):
    """Batch normalization; see the module docstring for the modes and the file.
    On a GPU the statistics a training run adds stay there until read
    (components/device_stats.py)."""

    type_name = "BatchNormComponent"
    stats_sum = stats_attribute("stats_sum")
    stats_sumsq = stats_attribute("stats_sumsq")

    def __init__(self, dim: int, block_dim: int | None = None, epsilon: float = 1.0e-3,
                 target_rms: float = 1.0, test_mode: bool = False):
        self.dim = int(dim)
        self.block_dim = self.dim if block_dim is None else int(block_dim)
        self.epsilon = epsilon
        self.target_rms = target_rms
        self.test_mode = test_mode
        self.count = 0.0
        self.stats_sum = np.zeros(self.block_dim, np.float64)
        self.stats_sumsq = np.zeros(self.block_dim, np.float64)
        # (mean, var) exactly as read from a file; None once the stats changed.
        self._written_stats: tuple[np.ndarray, np.ndarray] | None = None
        self.offset: np.ndarray | None = None  # test mode only
        self.scale: np.ndarray | None = None

    @property
    def input_dim(self) -> int:
        return self.dim

    output_dim = input_dim

    def properties(self) -> Flags:
        flags = (Flags.SIMPLE | Flags.BACKPROP_NEEDS_OUTPUT | Flags.PROPAGATE_IN_PLACE
                 | Flags.BACKPROP_IN_PLACE)
        if self.block_dim < self.dim:
            flags |= Flags.INPUT_CONTIGUOUS | Flags.OUTPUT_CONTIGUOUS
        if not self.test_mode:
            flags |= Flags.USES_MEMO | Flags.STORES_STATS
        return flags

    # -- config and files ----------------------------------------------------------------
    @classmethod
    def from_config(cls, cfg, rng: np.random.Generator) -> BatchNormComponent:
        dim = cfg.get_int("dim", required=True)
        block_dim = cfg.get_int("block-dim", -1)
        epsilon = cfg.get_float("epsilon", 1.0e-3)
        target_rms = cfg.get_float("target-rms", 1.0)
        test_mode = cfg.get_bool("test-mode", False)
        require(dim > 0, cfg, "dim must be > 0")
        if block_dim == -1:
            block_dim = dim
        require(block_dim > 0 and dim % block_dim == 0, cfg,
                f"block-dim={block_dim} must be > 0 and divide dim={dim}")
        require(epsilon > 0 and target_rms > 0, cfg, "epsilon and target-rms must be > 0")
        cfg.check_all_used()
        comp = cls(dim, block_dim, f32(epsilon), f32(target_rms), test_mode)
        if test_mode:
            comp._compute_derived(rng)
        return comp

    kaldi_fields = (
        REPEATED_OPENING,
        Field("<Dim>", "dim", "int", check=positive),
        Field("<BlockDim>", "block_dim", "int", check=_block_divides_dim),
        Field("<Epsilon>", "epsilon", "float", check=positive),
        Field("<TargetRms>", "target_rms", "float", check=positive),
        Field("<TestMode>", "test_mode", "bool"),
        Field("<Count>", "count", "double"),
        Custom("_read_stats", "_write_stats"),
    )

    @classmethod
    def empty_for_read(cls) -> BatchNormComponent:
        return cls(0)

    def _read_stats(self, r) -> None:
        """<StatsMean> and <StatsVar>, as doubles (Kaldi reads them into double vectors):
        the sums are made from them in read_end, their float32 values kept for writing
        back."""
        stats = []
        for tag in ("<StatsMean>", "<StatsVar>"):
            r.expect_token(tag)
            pos = r.pos
            v = r.read_double_vector()  # (Kaldi's Vector<double>)
            check_finite(r, tag, v, pos)
            if v.shape[0] != self.block_dim:
                raise r.error(f"{tag} has dim {v.shape[0]}, expected {self.block_dim}",
                              pos=pos)
            stats.append(v)
        self._file_doubles = (stats[0], stats[1])

    def read_end(self, r) -> None:
        super().read_end(r)
        mean, var = self.__dict__.pop("_file_doubles")
        self._written_stats = (mean.astype(np.float32), var.astype(np.float32))
        # Kaldi's Read: sum = mean * count, sumsq = (var + mean^2) * count, in double
        self.stats_sum = mean * self.count
        self.stats_sumsq = (var + mean * mean) * self.count
        # In test mode with count 0 this invents random stats (and forgets the
        # file's mean/variance), as Kaldi does on reading such a file.
        self._compute_derived(None)

    def forget_file_stats(self) -> None:
        """Write mean/variance from the sums from now on, as Kaldi's Write does,
        instead of as they were read (see the module doc)."""
        self._written_stats = None

    def _write_stats(self, w) -> None:
        mean, var = self._written_stats or self._mean_var_from_sums()
        w.write_tagged("<StatsMean>", "vector", mean)
        w.write_tagged("<StatsVar>", "vector", var)

    def _mean_var_from_sums(self) -> tuple[np.ndarray, np.ndarray]:
        """Kaldi's Write: float32 copies of the sums, scaled by 1/count in float32."""
        mean = self.stats_sum.astype(np.float32)
        var = self.stats_sumsq.astype(np.float32)
        if self.count != 0:
            inv = np.float32(1.0 / self.count)
            mean = mean * inv
            var = var * inv - mean * mean
        return mean, var

    def info(self) -> str:
        return (f"type={self.type_name}, dim={self.dim}, block-dim={self.block_dim}, "
                f"epsilon={self.epsilon:g}, target-rms={self.target_rms:g}, "
                f"count={self.count:g}, test-mode={'true' if self.test_mode else 'false'}")

    # -- modes and statistics ------------------------------------------------------------
    def set_test_mode(self, test_mode: bool) -> None:
        self.test_mode = bool(test_mode)
        self._compute_derived(None)

    def test_transform(self) -> tuple[np.ndarray, np.ndarray]:
        """The test-mode map ``y = x * scale + offset`` as float32 ``(scale, offset)``
        of ``block-dim`` values each (what network-level folding uses)."""
        if not self.test_mode:
            raise ValueError("BatchNormComponent: test_transform() needs test mode")
        if self.scale is None:
            self._compute_derived(None)
        return self.scale, self.offset

    def _compute_derived(self, rng: np.random.Generator | None) -> None:
        """The test-mode transform from the stats (float32, in Kaldi's order)."""
        if not self.test_mode:
            self.offset = self.scale = None
            return
        if self.count == 0.0:
            # Kaldi invents random stats here (with a warning); so do we, from a fixed
            # seed (Kaldi's rand() is unseeded too): the same network gives the same
            # outputs in every process, so runs and its optimized copy agree.
            warnings.warn("BatchNormComponent: test mode is set but there are no "
                          "statistics (count 0): random ones are made up, which only "
                          "makes sense in tests", RuntimeWarning, stacklevel=2)
            rng = rng or np.random.default_rng(0)
            self.count = 1.0
            self.stats_sum = rng.standard_normal(self.block_dim)
            self.stats_sumsq = rng.standard_normal(self.block_dim) + self.stats_sum ** 2
            self._written_stats = None
        neg_mean = self.stats_sum.astype(np.float32) * np.float32(-1.0 / self.count)
        var = self.stats_sumsq.astype(np.float32) * np.float32(1.0 / self.count)
        var = np.maximum(var - neg_mean * neg_mean, np.float32(0.0))
        scale = (var + np.float32(self.epsilon)) ** np.float32(-0.5)
        self.scale = (scale * np.float32(self.target_rms)).astype(np.float32)
        self.offset = (neg_mean * self.scale).astype(np.float32)

    def store_stats(self, in_value, out_value, memo) -> None:
        if self.test_mode or memo is None:
            return  # no STORES_STATS in test mode
        n = memo["num_frames"]
        self.count += n
        # (n is exact in float32; on a GPU the sums stay there until read)
        xp = namespace(memo["mean"])
        for name, key in (("stats_sum", "mean"), ("stats_sumsq", "uvar")):
            device_stats.add(self, name, xp.astype(memo[key], xp.float64) * float(n),
                             in_place=False)
        self._written_stats = None

    def zero_stats(self) -> None:
        # Test mode keeps its stats: they define the transform.
        if not self.test_mode:
            self.count = 0.0
            self.stats_sum = np.zeros(self.block_dim, np.float64)
            self.stats_sumsq = np.zeros(self.block_dim, np.float64)
            self._written_stats = None

    # -- math ------------------------------------------------------------------------
    def _blocks(self, m: np.ndarray) -> np.ndarray:
        return m.reshape(-1, self.block_dim)

    def propagate(self, indexes, in_value, out_value):
        xp, dt = namespace(in_value), in_value.dtype
        x = self._blocks(in_value)
        if self.test_mode:
            if self.scale is None:
                self._compute_derived(None)
            scale, offset = xp.param(self.scale, in_value), xp.param(self.offset, in_value)
            if self.block_dim == self.dim:  # straight into the output: no temporaries
                xp.multiply(in_value, scale, out=out_value)
                out_value += offset
                return None
            y = x * scale + offset
            out_value[...] = y.reshape(out_value.shape)
            return None
        n = x.shape[0]
        # (constants rounded to the arrays' precision on the host, as dt.type(v) did)
        ft = xp.scalar_type(in_value)
        mean = xp.sum(x, axis=0) / float(ft(n))
        uvar = xp.einsum("ij,ij->j", x, x) / float(ft(n))
        var_scale = ft(1.0 / (self.target_rms * self.target_rms))
        # scale = (max(var, 0) + eps)^-0.5 * target-rms, computed as Kaldi does it.
        scaled_var = xp.maximum((uvar - mean * mean) * float(var_scale), 0.0)
        scale = (scaled_var + float(var_scale * ft(self.epsilon))) ** -0.5
        if out_value.shape == x.shape and out_value.dtype == dt and xp.is_numpy:
            # the same, with the row vectors tiled (np_kernels.rowwise: same floats)
            np_kernels.rowwise(np.subtract, x, mean, out_value)
            np_kernels.rowwise(np.multiply, out_value, scale, out_value)
        elif out_value.shape == x.shape and out_value.dtype == dt:
            # straight into the output (elementwise, so it may alias the input)
            xp.subtract(x, mean, out=out_value)
            out_value *= scale
        else:
            y = (x - mean) * scale  # computed before writing: out may alias in
            out_value[...] = y.reshape(out_value.shape)
        return {"num_frames": n, "mean": mean, "uvar": uvar, "scale": scale}

    def backprop(self, indexes, in_value, out_value, out_deriv, memo, grad, in_deriv) -> None:
        if in_deriv is None:
            return
        xp, dt = namespace(out_deriv), out_deriv.dtype
        dz = self._blocks(out_deriv)
        if self.test_mode:
            dx = dz * xp.param(self.scale, out_deriv)
        else:
            if memo is None:
                raise ValueError("BatchNormComponent (training mode): backprop needs the memo")
            z = self._blocks(out_value)
            n, scale = memo["num_frames"], xp.astype(memo["scale"], dt)
            ft = xp.scalar_type(out_deriv)
            coeff = float(ft(-1.0 / (self.target_rms * self.target_rms * n)))
            var_deriv_mod = coeff * xp.einsum("ij,ij->j", z, dz) * scale
            mean_deriv = xp.sum(dz, axis=0) / float(ft(n))
            if in_deriv.shape == dz.shape and in_deriv.dtype == dt and xp.is_numpy:
                # the same again, the row vectors tiled (np_kernels.rowwise)
                zterm = np.empty_like(z)
                np_kernels.rowwise(np.multiply, z, var_deriv_mod, zterm)
                np_kernels.rowwise(np.subtract, dz, mean_deriv, in_deriv)
                np_kernels.rowwise(np.multiply, in_deriv, scale, in_deriv)
                in_deriv += zterm
                return
            if in_deriv.shape == dz.shape and in_deriv.dtype == dt:
                # the same float ops, into in_deriv (which may alias out_deriv: dz is
                # not read after the subtraction)
                zterm = z * var_deriv_mod
                xp.subtract(dz, mean_deriv, out=in_deriv)
                in_deriv *= scale
                in_deriv += zterm
                return
            dx = (dz - mean_deriv) * scale + z * var_deriv_mod
        in_deriv[...] = dx.reshape(in_deriv.shape)
