"""ReLU and BatchNorm (training mode) write straight into their outputs / input
derivatives: the results are bit-identical to the former formulas (a temporary,
then a copy), with in-place aliasing, strided views, float64, self-repair and
block-dim < dim."""

from __future__ import annotations

import numpy as np
import pytest

from pynnet3.components.nonlinear import NonlinearComponent
from tests.components.common import from_config


def _relu(extra: str = "", seed: int = 0):
    return from_config("component name=r type=RectifiedLinearComponent dim=6 " + extra, seed)


def _strided(rng, rows, cols, dtype):
    """A [rows, cols] view with a row stride wider than cols (a column block)."""
    return rng.standard_normal((rows, cols + 3)).astype(dtype)[:, 1:cols + 1]


def _with_zeros(a):
    a[::3, ::2] = 0.0  # exact zeros (ReLU's boundary) and -0.0 below
    a[1::5, 1::3] = -0.0
    return a


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("extra", ["", "self-repair-scale=1e-3",
                                   "block-dim=3 self-repair-scale=1e-2 "
                                   "self-repair-lower-threshold=0.4"])
def test_relu_matches_former_formula(dtype, extra):
    rng = np.random.default_rng(1)
    new, old = _relu(extra, seed=5), _relu(extra, seed=5)
    for step in range(6):
        x = _with_zeros(_strided(rng, 11, 6, dtype))
        y_new = np.full((11, 6), np.nan, dtype)
        y_old = y_new.copy()
        new.propagate(None, x, y_new)
        NonlinearComponent.propagate(old, None, x, y_old)
        np.testing.assert_array_equal(y_new, y_old)
        assert np.array_equal(np.signbit(y_new), np.signbit(y_old))
        for c in (new, old):  # stats for the self-repair
            c.store_stats(x, y_new, None)
        dy = _with_zeros(_strided(rng, 11, 6, dtype))
        dy[0, 0] = np.inf  # inf * 0 is NaN either way
        grad = {} if step % 2 else None
        d_new = np.full((11, 6), 5.0, dtype)
        d_old = d_new.copy()
        with np.errstate(invalid="ignore"):
            new.backprop(None, x, y_new, dy, None, grad, d_new)
            NonlinearComponent.backprop(old, None, x, y_old, dy, None, grad, d_old)
        np.testing.assert_array_equal(d_new, d_old)
        assert np.array_equal(np.signbit(d_new), np.signbit(d_old))
    assert new.num_dims_processed == old.num_dims_processed
    np.testing.assert_array_equal(new.oderiv_sumsq, old.oderiv_sumsq)


def test_relu_in_place_and_aliased_derivative():
    rng = np.random.default_rng(2)
    comp = _relu()
    x = rng.standard_normal((8, 6)).astype(np.float32)
    want = np.maximum(x, 0)
    comp.propagate(None, x, x)  # PROPAGATE_IN_PLACE
    np.testing.assert_array_equal(x, want)
    dy = rng.standard_normal((8, 6)).astype(np.float32)
    want = dy * (x > 0)
    comp.backprop(None, None, x, dy, None, None, dy)  # aliased: the former path
    np.testing.assert_array_equal(dy, want)


def _bn(dim=6, block=None):
    extra = f" block-dim={block}" if block else ""
    return from_config(f"component name=b type=BatchNormComponent dim={dim}{extra}")


def _bn_former(comp, x, out, dz, in_deriv):
    """BatchNorm training propagate/backprop as they were (temporaries, then copies)."""
    dt = x.dtype
    xb = x.reshape(-1, comp.block_dim)
    n = xb.shape[0]
    mean = xb.sum(axis=0) / dt.type(n)
    uvar = np.einsum("ij,ij->j", xb, xb) / dt.type(n)
    var_scale = dt.type(1.0 / (comp.target_rms * comp.target_rms))
    scaled_var = np.maximum((uvar - mean * mean) * var_scale, dt.type(0.0))
    scale = (scaled_var + var_scale * dt.type(comp.epsilon)) ** dt.type(-0.5)
    out[...] = ((xb - mean) * scale).reshape(out.shape)
    z, dzb = out.reshape(-1, comp.block_dim), dz.reshape(-1, comp.block_dim)
    coeff = dt.type(-1.0 / (comp.target_rms * comp.target_rms * n))
    vdm = coeff * np.einsum("ij,ij->j", z, dzb) * scale
    dx = (dzb - dzb.sum(axis=0) / dt.type(n)) * scale + z * vdm
    in_deriv[...] = dx.reshape(in_deriv.shape)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("layout", ["contiguous", "strided", "in-place", "blocks"])
def test_batchnorm_training_matches_former_formula(dtype, layout):
    rng = np.random.default_rng(3)
    for rows in (1, 2, 17):
        comp = _bn(6, 3 if layout == "blocks" else None)
        if layout == "strided":
            x = _strided(rng, rows, 6, dtype) * 3 + 1
        else:
            x = (rng.standard_normal((rows, 6)) * 3 + 1).astype(dtype)
        dz = rng.standard_normal((rows, 6)).astype(dtype)
        out_old, d_old = np.empty((rows, 6), dtype), np.empty((rows, 6), dtype)
        _bn_former(comp, x, out_old, dz, d_old)
        if layout == "in-place":  # PROPAGATE_IN_PLACE and BACKPROP_IN_PLACE
            out_new, d_new = x.copy(), dz.copy()
            memo = comp.propagate(None, out_new, out_new)
            comp.backprop(None, None, out_new, d_new, memo, None, d_new)
        else:
            out_new, d_new = np.empty((rows, 6), dtype), np.empty((rows, 6), dtype)
            memo = comp.propagate(None, x, out_new)
            comp.backprop(None, x, out_new, dz, memo, None, d_new)
        np.testing.assert_array_equal(out_new, out_old)
        np.testing.assert_array_equal(d_new, d_old)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("strided", [False, True])
def test_log_softmax_matches_former_formula(dtype, strided):
    rng = np.random.default_rng(9)
    new = from_config("component name=s type=LogSoftmaxComponent dim=6", 4)
    old = from_config("component name=s type=LogSoftmaxComponent dim=6", 4)
    for rows in (1, 13):
        x = _strided(rng, rows, 6, dtype) * 5 if strided else \
            (rng.standard_normal((rows, 6)) * 5).astype(dtype)
        y_new, y_old = np.empty((rows, 6), dtype), np.empty((rows, 6), dtype)
        new.propagate(None, x, y_new)
        NonlinearComponent.propagate(old, None, x, y_old)
        # (the row sums are a BLAS product now: another summation order)
        eps = np.finfo(dtype).eps
        np.testing.assert_allclose(y_new, y_old, rtol=0,
                                   atol=8 * eps * float(np.abs(y_old).max()))
        dy = _strided(rng, rows, 6, dtype)
        for grad in (None, {}):
            d_new, d_old = np.full((rows, 6), 3.0, dtype), np.full((rows, 6), 3.0, dtype)
            new.backprop(None, x, y_old, dy, None, grad, d_new)
            d_old[...] = old._diff(y_old, dy)
            if grad is not None:
                old.store_backprop_stats(dy)
            np.testing.assert_array_equal(d_new, d_old)
    np.testing.assert_array_equal(new.oderiv_sumsq, old.oderiv_sumsq)
    x = rng.standard_normal((5, 6)).astype(dtype)  # in place: the former path
    want = new._forward(x)
    new.propagate(None, x, x)
    np.testing.assert_array_equal(x, want)
