"""runtime.compression: sign-only codes are exact for ReLU backprop; int16 codes
stay within half a quantization step inside the range and clamp outside it."""

from __future__ import annotations

import numpy as np
import pytest

from pynnet3.errors import PynnetError
from pynnet3.runtime.compression import (
    INT8,
    INT16,
    UINT8,
    UINT16,
    bytes_per_element,
    compress,
    decompress,
)


def _roundtrip(x, kind, rng):
    obj = compress(x, kind, rng)
    out = np.empty_like(x)
    decompress(obj, out)
    return obj, out


@pytest.fixture()
def x():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((37, 11)).astype(np.float32) * 3
    a[::5] = 0.0  # exact zeros (ReLU outputs are full of them)
    a[1, :3] = [1e-30, -1e-30, 0.0]
    return a


def test_uint8_sign_is_exact_for_relu_backprop(x):
    y = np.maximum(x, 0)
    obj, back = _roundtrip(y, UINT8, 0.0)
    assert obj.data.dtype == np.uint8 and obj.nbytes == y.size
    assert np.array_equal(back, (y > 0).astype(np.float32))
    dy = np.random.default_rng(1).standard_normal(y.shape).astype(np.float32)
    # ReLU backprop reads only y > 0: bit-identical
    assert np.array_equal(dy * (back > 0), dy * (y > 0))


def test_int8_sign(x):
    _, back = _roundtrip(x, INT8, 0.0)
    assert np.array_equal(back, np.sign(x))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_int16_error_bound(x, dtype):
    x = (x * 2).astype(dtype)  # beyond +-10 in places
    obj, back = _roundtrip(x, INT16, 10.0)
    assert obj.data.dtype == np.int16 and obj.nbytes == 2 * x.size
    scale = 10.0 / 32767
    inside = np.abs(x) <= 10.0
    assert inside.any() and (~inside).any()
    err = np.abs(back.astype(np.float64) - x)[inside]
    assert err.max() <= scale / 2 * (1 + 1e-5) + 1e-6 * 10.0
    assert err.max() > scale / 10  # it really quantizes
    top = back[x > 10]
    assert np.all(top == top[0]) and abs(top[0] - 10.0) < 1e-5  # clamped to 32767 * scale
    assert np.all(np.abs(back[x < -10] + 10.0 + scale) < 1e-5)  # to -32768 * scale
    assert np.all(back[x == 0] == 0)  # exact zero stays zero


def test_unsigned_range_clamps_negatives():
    x = np.array([[-1.0, 0.0, 0.5, 1.0, 2.0]], dtype=np.float32)
    _, back = _roundtrip(x, UINT16, 1.0)
    np.testing.assert_allclose(back, [[0.0, 0.0, 0.5, 1.0, 1.0]], atol=1 / 65535)


def test_bytes_and_errors(x):
    assert [bytes_per_element(k) for k in (INT8, UINT8, INT16, UINT16)] == [1, 1, 2, 2]
    with pytest.raises(PynnetError, match="kind"):
        compress(x, 7, 0.0)
    with pytest.raises(PynnetError, match="range"):
        compress(x, INT16, -1.0)
    with pytest.raises(PynnetError, match="shape"):
        decompress(compress(x, UINT8, 0.0), np.empty((3, 3), np.float32))


def _compress_former(x, kind, rng):
    """compress as it was (a temporary per step)."""
    from pynnet3.runtime.compression import CompressedMatrix, _int_type

    itype = _int_type(kind)
    info = np.iinfo(itype)
    if rng == 0:
        codes = (x > 0) if info.min == 0 else np.sign(x)
        return CompressedMatrix(codes.astype(itype), 1.0)
    scale = float(np.float32(rng) / np.float32(info.max))
    q = np.rint(x * x.dtype.type(1.0 / scale)) if x.dtype.kind == "f" else np.rint(x / scale)
    return CompressedMatrix(np.clip(q, info.min, info.max).astype(itype), scale)


@pytest.mark.parametrize("kind", [INT8, UINT8, INT16, UINT16])
@pytest.mark.parametrize("rng_value", [0.0, 1.0, 10.0])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_compress_equals_former_formula(kind, rng_value, dtype):
    g = np.random.default_rng(kind)
    x = (g.standard_normal((9, 7)) * 8).astype(dtype)
    if dtype != np.int64:
        x[0, :4] = [0.0, -0.0, 0.5, -0.5]  # signs of zero, halves
        x[1, :2] = [1e6, -1e6]  # clamped
    x = x[:, 1:6]  # a strided view
    new, old = compress(x, kind, rng_value), _compress_former(x, kind, rng_value)
    assert new.data.dtype == old.data.dtype and new.scale == old.scale
    np.testing.assert_array_equal(new.data, old.data)
    out_new, out_old = np.empty(x.shape, np.float32), np.empty(x.shape, np.float32)
    decompress(new, out_new)
    decompress(old, out_old)
    np.testing.assert_array_equal(out_new, out_old)
