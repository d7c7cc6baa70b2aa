"""Review of the compiled kernels' argument checks (components/c_kernels.py): every
array layout they accept must be one the C code handles correctly; the rest must be
declined (False / None) so the NumPy path runs."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

from pynnet3.components import c_kernels
from pynnet3.components.recurrent import _lstm_forward_numpy

needs_kernels = pytest.mark.skipif(not c_kernels.available(),
                                   reason="compiled kernels not built or CPU without AVX2")


def _lstm_args(c=4, rows=3, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((rows, 5 * c)).astype(np.float32),
            rng.standard_normal((3, c)).astype(np.float32))


@needs_kernels
def test_read_only_outputs_are_declined():
    """A read-only ``out`` (e.g. np.frombuffer over an immutable bytes object) must
    not be written: the kernels declined it, NumPy's path raises."""
    c = 4
    x, w = _lstm_args(c)
    out = np.zeros((3, 2 * c), np.float32)
    out.setflags(write=False)
    assert not c_kernels.lstm_forward(x, w, c, out)
    assert c_kernels.lstm_call(x, w, c, out) is None
    assert not out.any()
    frozen = bytes(4 * 3 * 2 * c)
    assert not c_kernels.lstm_forward(x, w, c,
                                      np.frombuffer(frozen, np.float32).reshape(3, 2 * c))
    assert not any(frozen)
    ls_out = np.zeros((3, 5), np.float32)
    ls_out.setflags(write=False)
    assert not c_kernels.log_softmax(x[:, :5], ls_out)
    assert not ls_out.any()
    y = np.zeros(4, np.float32)
    y.setflags(write=False)
    assert not c_kernels.tanh(np.ones(4, np.float32), y)
    assert not c_kernels.exp(np.ones(4, np.float32), y)
    assert not y.any()


def _unaligned(shape):
    buf = bytearray(4 * int(np.prod(shape)) + 1)
    a = np.frombuffer(buf, np.float32, offset=1, count=int(np.prod(shape))).reshape(shape)
    assert not a.flags.aligned
    return a


@needs_kernels
def test_unaligned_arrays_are_declined():
    """float* to data that is not 4-byte aligned is undefined behaviour in C (and
    vector code may fault on it): declined, NumPy handles such arrays."""
    c = 4
    x, w = _lstm_args(c)
    out = np.zeros((3, 2 * c), np.float32)
    xu = _unaligned(x.shape)
    xu[...] = x
    assert not c_kernels.lstm_forward(xu, w, c, out)
    wu = _unaligned(w.shape)
    wu[...] = w
    assert not c_kernels.lstm_forward(x, wu, c, out)
    assert not c_kernels.lstm_forward(x, w, c, _unaligned(out.shape))
    assert not c_kernels.lstm_forward(x, w, c, out, c_prev=_unaligned((3, c)))
    assert not c_kernels.log_softmax(xu, np.zeros_like(x))
    assert not c_kernels.log_softmax(x, _unaligned(x.shape))
    assert not c_kernels.tanh(_unaligned((8,)), np.zeros(8, np.float32))


@needs_kernels
def test_outputs_whose_rows_overlap_are_declined():
    """A writeable ``out`` whose rows overlap one another (a zero or short row stride,
    as as_strided makes): rows written one after another give other values than
    NumPy's path (which reads all of c_prev first), so declined."""
    c = 4
    x, w = _lstm_args(c)
    base = np.ones(2 * c, np.float32)
    out = as_strided(base, (3, 2 * c), (0, 4))
    assert out.flags.writeable
    assert not c_kernels.lstm_forward(x, w, c, out, c_prev=out[:, :c])
    assert not c_kernels.lstm_forward(x, w, c, out)
    short = as_strided(np.ones(4 * c, np.float32), (3, 2 * c), (4 * c, 4))
    assert not c_kernels.lstm_forward(x, w, c, short, c_prev=short[:, :c])
    ls = as_strided(np.zeros(5, np.float32), (3, 5), (0, 4))
    assert not c_kernels.log_softmax(x[:, :5], ls)
    # (one row, or rows apart by a full row or more: accepted as before)
    assert c_kernels.lstm_forward(x[:1], w, c, as_strided(base, (1, 2 * c), (0, 4)))
    assert c_kernels.lstm_forward(x, w, c, np.zeros((3, 2 * c), np.float32)[::-1])


@needs_kernels
def test_elementwise_partial_overlap_is_declined():
    """tanh / exp: ``out`` overlapping ``x`` would be read after being written (and
    the C loops take restrict pointers): declined."""
    buf = np.linspace(-2, 2, 65).astype(np.float32)
    assert not c_kernels.tanh(buf[:64], buf[1:])
    assert not c_kernels.exp(buf[1:], buf[:64])
    assert not c_kernels.tanh(buf, buf)
    y = np.empty_like(buf)
    assert c_kernels.tanh(buf, y)
    assert np.abs(y - np.tanh(buf.astype(np.float64))).max() < 1e-6


@needs_kernels
def test_lstm_call_keeps_its_arrays_alive():
    """The bound call holds raw pointers: it must hold the arrays too, or a caller
    that keeps only the call (the arena runtime's kernels) reads and writes freed
    memory once a temporary it was given is collected."""
    c = 4
    x, w = _lstm_args(c)
    out = np.zeros((3, 2 * c), np.float32)
    x_tmp, w_tmp, out_tmp, prev_tmp = x.copy(), w.copy(), out.copy(), x[:, 4 * c:].copy()
    refs = [weakref.ref(a) for a in (x_tmp, w_tmp, out_tmp, prev_tmp)]
    call = c_kernels.lstm_call(x_tmp, w_tmp, c, out_tmp, c_prev=prev_tmp)
    assert call is not None
    del x_tmp, w_tmp, out_tmp, prev_tmp
    gc.collect()
    assert all(r() is not None for r in refs)
    call()
    want = np.empty_like(out)
    _lstm_forward_numpy(x, w, c, want)
    np.testing.assert_allclose(refs[2](), want, rtol=1e-5, atol=1e-6)
