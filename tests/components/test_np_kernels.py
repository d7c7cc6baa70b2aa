"""components/np_kernels.py: the faster NumPy forms give the plain forms' bits."""

from __future__ import annotations

import numpy as np
import pytest

from pynnet3.components import np_kernels

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # (inf - inf, 0 * inf)


def _special(rng, shape, dtype):
    x = rng.standard_normal(shape).astype(dtype)
    flat = x.reshape(-1)
    flat[::7] = -0.0
    flat[1::11] = 0.0
    flat[2::13] = np.nan
    flat[3::17] = -np.nan
    flat[4::19] = np.inf
    flat[5::23] = -np.inf
    flat[6::29] = np.finfo(dtype).tiny / 4  # subnormals
    flat[8::31] = -np.finfo(dtype).tiny / 4
    return x


def _bits(a):
    return a.view(np.int32 if a.dtype == np.float32 else np.int64)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (5120, 160), (100003,), (3, 9000), (4, 4096),
                                   (2, 3, 8192)])
def test_relu_bits_equal_maximum(dtype, shape):
    x = _special(np.random.default_rng(0), shape, dtype)
    want = np.maximum(x, 0.0)
    out = np.empty_like(x)
    np_kernels.relu(x, out)
    assert np.array_equal(_bits(out), _bits(want))
    np_kernels.relu(x, x)  # in place
    assert np.array_equal(_bits(x), _bits(want))


def test_relu_column_view_and_zeros_untouched():
    rng = np.random.default_rng(1)
    big = rng.standard_normal((64, 30)).astype(np.float32)
    view = big[:, 5:17]  # not contiguous
    want = np.maximum(view, 0.0)
    np_kernels.relu(view, view)
    assert np.array_equal(view, want)
    z = np_kernels.zeros_row(30, np.float32)
    assert not z.flags.writeable and not z.any()
    with pytest.raises(ValueError):
        z[0] = 1.0


@pytest.mark.parametrize("op", [np.subtract, np.multiply, np.add])
@pytest.mark.parametrize("shape", [(5120, 160), (4097, 192), (2560, 300), (31, 160), (700, 13),
                                   (9000, 1), (3, 8192), (0, 160)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rowwise_bits_equal_broadcast(op, shape, dtype):
    rng = np.random.default_rng(2)
    x = _special(rng, shape, dtype)
    v = _special(rng, (shape[1],), dtype)
    want = op(x, v)
    out = np.empty_like(x)
    np_kernels.rowwise(op, x, v, out)
    assert np.array_equal(_bits(out), _bits(want))
    y = x.copy()
    np_kernels.rowwise(op, y, v, y)  # in place
    assert np.array_equal(_bits(y), _bits(want))


def test_rowwise_falls_back_for_views_and_mixed_dtypes():
    rng = np.random.default_rng(3)
    big = rng.standard_normal((6000, 40)).astype(np.float32)
    x = big[:, 3:35]
    v = rng.standard_normal(32).astype(np.float32)
    out = np.empty((6000, 32), np.float32)
    np_kernels.rowwise(np.subtract, x, v, out)
    assert np.array_equal(out, x - v)
    v64 = v.astype(np.float64)
    out2 = np.empty((6000, 32), np.float32)
    np_kernels.rowwise(np.multiply, np.ascontiguousarray(x), v64, out2)
    assert np.array_equal(out2, np.multiply(x, v64, out=np.empty_like(out2)))
