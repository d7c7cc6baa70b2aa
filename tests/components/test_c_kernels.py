"""The compiled kernels (components/_kernels.c through c_kernels): built where the
install had a C compiler and the CPU has AVX2+FMA or AVX-512; checked against
float64 math (not against our NumPy code's bits: the kernel's tanh is its own)."""

from __future__ import annotations

import os
import platform
import shutil
import sysconfig

import numpy as np
import pytest

from pynnet3.components import c_kernels
from pynnet3.components.recurrent import _lstm_forward_numpy

needs_kernels = pytest.mark.skipif(not c_kernels.available(),
                                   reason="compiled kernels not built or CPU without AVX2")


def test_kernels_are_built_where_they_can_be():
    """An install on x86-64 with a C compiler builds them (setup.py), and a CPU with
    AVX2+FMA runs them: a silent fallback to NumPy would hide a broken build."""
    if platform.machine() not in ("x86_64", "AMD64") or not shutil.which(
            sysconfig.get_config_var("CC").split()[0] if sysconfig.get_config_var("CC")
            else "cc"):
        pytest.skip("no x86-64 C toolchain here")
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        pytest.skip("no /proc/cpuinfo to read the CPU's flags from")
    if " avx2 " not in flags or " fma " not in flags:
        pytest.skip("CPU without AVX2+FMA")
    if os.environ.get("PYNNET3_NO_C_KERNELS", "") not in ("", "0"):
        pytest.skip("PYNNET3_NO_C_KERNELS set: the NumPy paths are under test")
    assert c_kernels._library_path() is not None, "the extension was not built"
    assert c_kernels.level() in ("avx512", "avx2")


def _ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    return np.abs(got.astype(np.float64) - want) / np.spacing(
        np.abs(want).astype(np.float32)).astype(np.float64)


@needs_kernels
def test_tanh_is_within_a_few_ulps_everywhere():
    """Every float32 in [-12, 12] at a stride, plus tiny, huge and special values."""
    grid = np.arange(np.float32(0).view(np.int32), np.float32(12).view(np.int32), 997,
                     dtype=np.int32).view(np.float32)
    x = np.concatenate([grid, -grid, np.float32([1e-30, -1e-30, 1e-40, 3e38, -3e38, 9.0,
                                                  -9.0, 8.999999])]).astype(np.float32)
    y = np.empty_like(x)
    assert c_kernels.tanh(x, y)
    ulps = _ulps(y, np.tanh(x.astype(np.float64)))
    assert ulps.max() <= 6.0, (x[ulps.argmax()], ulps.max())
    assert np.all(np.abs(y) <= 1.0)
    assert np.array_equal(np.sign(y), np.sign(x))  # (odd; 0 for +-0)
    assert c_kernels.tanh(np.float32([np.inf, -np.inf]), y[:2]) and list(y[:2]) == [1, -1]
    special = np.float32([np.nan, 0.0, -0.0])
    out = np.empty(3, np.float32)
    c_kernels.tanh(special, out)
    assert np.isnan(out[0]) and out[1] == 0 and out[2] == 0


def _lstm64(x: np.ndarray, w: np.ndarray, c: int, c_prev=None, scale=1.0):
    x, w = x.astype(np.float64), w.astype(np.float64)
    cp = (x[:, 4 * c:5 * c] if c_prev is None else c_prev.astype(np.float64)) * scale

    def sig(v):
        return 1.0 / (1.0 + np.exp(-v))
    i_t = sig(x[:, :c] + w[0] * cp)
    f_t = sig(x[:, c:2 * c] + w[1] * cp)
    c_t = f_t * cp + i_t * np.tanh(x[:, 2 * c:3 * c])
    o_t = sig(x[:, 3 * c:4 * c] + w[2] * c_t)
    return np.hstack([c_t, o_t * np.tanh(c_t)])


def _bound(x, w, c, c_prev=None, scale=1.0):
    """The float32 rounding bound of each output: a few ulps of the terms it sums."""
    cp = np.abs((x[:, 4 * c:5 * c] if c_prev is None else c_prev).astype(np.float64)) * scale
    terms = cp + 1.0 + np.abs(w[2]).astype(np.float64) * (cp + 1.0)
    return 8 * np.finfo(np.float32).eps * np.hstack([terms, terms])


@needs_kernels
@pytest.mark.parametrize("c", [1, 8, 128, 300])
def test_lstm_forward_matches_float64(c):
    """c=300: more cells than the kernel's chunk (256)."""
    rng = np.random.default_rng(c)
    x = (rng.standard_normal((37, 5 * c)) * 3).astype(np.float32)
    w = rng.standard_normal((3, c)).astype(np.float32)
    out = np.full((37, 2 * c), np.nan, np.float32)
    assert c_kernels.lstm_forward(x, w, c, out)
    want = _lstm64(x, w, c)
    assert np.all(np.abs(out - want) <= _bound(x, w, c))
    # (the NumPy path: the same bound, so neither is closer than float32 allows)
    ref = np.empty_like(out)
    _lstm_forward_numpy(x, w, c, ref)
    assert np.all(np.abs(ref - want) <= _bound(x, w, c))


@needs_kernels
def test_lstm_forward_on_views_and_a_separate_scaled_c_prev():
    """x a column block of a wider matrix (row stride != 5c), the output rows
    strided, and c_prev given apart with a scale: the value ``scale * c_prev`` is
    used, exactly as a scaled copy into x's last block would give."""
    c, rows = 16, 23
    rng = np.random.default_rng(5)
    wide = (rng.standard_normal((rows, 7 * c)) * 2).astype(np.float32)
    x = wide[:, c:6 * c]
    w = rng.standard_normal((3, c)).astype(np.float32)
    prev = (rng.standard_normal((rows, 3 * c))).astype(np.float32)[:, c:2 * c]
    out_wide = np.zeros((rows, 3 * c), np.float32)
    out = out_wide[:, :2 * c]
    assert c_kernels.lstm_forward(x, w, c, out, c_prev=prev, c_prev_scale=0.85)
    copied = x.copy()
    copied[:, 4 * c:] = np.float32(0.85) * prev
    want = np.empty_like(out)
    assert c_kernels.lstm_forward(copied, w, c, want)
    np.testing.assert_array_equal(out, want)
    assert not out_wide[:, 2 * c:].any()  # (nothing written outside the output)


@needs_kernels
def test_lstm_forward_c_prev_may_be_its_own_output():
    """An LSTM step whose output buffer holds its c_prev (c_t of the step before):
    each row reads its c_prev before writing that row."""
    c, rows = 8, 11
    rng = np.random.default_rng(6)
    x = rng.standard_normal((rows, 5 * c)).astype(np.float32)
    w = rng.standard_normal((3, c)).astype(np.float32)
    out = rng.standard_normal((rows, 2 * c)).astype(np.float32)
    prev = out[:, :c].copy()
    want = np.empty_like(out)
    assert c_kernels.lstm_forward(x, w, c, want, c_prev=prev, c_prev_scale=0.5)
    assert c_kernels.lstm_forward(x, w, c, out, c_prev=out[:, :c], c_prev_scale=0.5)
    np.testing.assert_array_equal(out, want)


@needs_kernels
def test_lstm_forward_declines_what_it_cannot_do():
    c = 4
    x = np.zeros((3, 5 * c), np.float32)
    w = np.zeros((3, c), np.float32)
    out = np.zeros((3, 2 * c), np.float32)
    assert not c_kernels.lstm_forward(x.astype(np.float64), w, c, out)  # dtype
    assert not c_kernels.lstm_forward(x, w, c, np.zeros((3, 2 * c)))
    assert not c_kernels.lstm_forward(x, w[:2], c, out)  # params shape
    assert not c_kernels.lstm_forward(x[:, ::-1], w, c, out)  # columns not contiguous
    assert not c_kernels.lstm_forward(x, w, c, x[:, :2 * c])  # output overlaps input
    assert not c_kernels.lstm_forward(x, w, c, out, c_prev=out[:, 1:c + 1])  # shifted alias
    assert not c_kernels.lstm_forward(x, w, c, out[:2])  # rows


@needs_kernels
def test_lstm_forward_non_finite_values():
    """NaN in a gate gives NaN in what it reaches; +-inf pre-activations saturate the
    gates as the NumPy path's (0.5 tanh(0.5 v) + 0.5 is exactly 0 or 1 there)."""
    c = 4
    x = np.zeros((4, 5 * c), np.float32)
    w = np.zeros((3, c), np.float32)
    x[0, 0] = np.nan  # i gate of cell 0: c_t and m_t of cell 0
    x[1, c + 1] = np.inf  # f gate of cell 1 saturates at 1
    x[1, 4 * c + 1] = 2.0
    x[2, 2] = -np.inf  # i gate of cell 2 at 0: c_t = f c_prev only
    x[2, 4 * c + 2] = 3.0
    x[3, 3 * c + 3] = np.nan  # o gate of cell 3: m_t only
    out = np.empty((4, 2 * c), np.float32)
    ref = np.empty_like(out)
    assert c_kernels.lstm_forward(x, w, c, out)
    _lstm_forward_numpy(x, w, c, ref)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    assert np.isnan(out[0, 0]) and np.isnan(out[0, c]) and np.isnan(out[3, c + 3])
    assert not np.isnan(out[3, 3])
    assert out[1, 1] == 2.0 * 1.0 + 0.5 * 0.0  # f = 1, i = 0.5, tanh(0) = 0
    assert out[2, 2] == 0.5 * 3.0  # f = sigmoid(0) = 0.5, i = 0
    finite = ~np.isnan(ref)
    np.testing.assert_allclose(out[finite], ref[finite], rtol=0, atol=1e-6)


def test_disabled_by_environment(monkeypatch):
    """PYNNET3_NO_C_KERNELS makes every kernel decline (the NumPy code runs)."""
    monkeypatch.setenv("PYNNET3_NO_C_KERNELS", "1")
    monkeypatch.setattr(c_kernels, "_lib", c_kernels._UNLOADED)
    assert not c_kernels.available() and c_kernels.level() is None
    c = 2
    assert not c_kernels.lstm_forward(np.zeros((1, 5 * c), np.float32),
                                      np.zeros((3, c), np.float32), c,
                                      np.zeros((1, 2 * c), np.float32))
    monkeypatch.delenv("PYNNET3_NO_C_KERNELS")
    monkeypatch.setattr(c_kernels, "_lib", c_kernels._UNLOADED)


@needs_kernels
def test_exp_is_within_two_ulps_where_log_softmax_uses_it():
    """Arguments in [-87, 0] (log-softmax's x - max) and a NaN."""
    x = np.concatenate([np.linspace(-87, 0, 400_001), [-1e-30, -0.0, 0.0]]).astype(np.float32)
    y = np.empty_like(x)
    assert c_kernels.exp(x, y)
    want = np.exp(x.astype(np.float64))
    assert _ulps(y, want).max() <= 2.0
    assert y[-1] == 1.0 and y[-2] == 1.0
    out = np.empty(2, np.float32)
    assert c_kernels.exp(np.float32([np.nan, -np.inf]), out)
    assert np.isnan(out[0]) and 0 <= out[1] < 1e-37  # (exp(-87) stands for 0: no row sum notices)


def _log_softmax64(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    s = x - x.max(axis=1, keepdims=True)
    return s - np.log(np.exp(s).sum(axis=1, keepdims=True))


@needs_kernels
@pytest.mark.parametrize("cols", [1, 7, 200, 3001])
def test_log_softmax_matches_float64(cols):
    rng = np.random.default_rng(cols)
    x = (rng.standard_normal((53, cols)) * 4).astype(np.float32)
    out = np.full_like(x, np.nan)
    assert c_kernels.log_softmax(x, out)
    want = _log_softmax64(x)
    # (float32 rounding of x - max and of log(sum): a few ulps of the larger)
    bound = 4 * np.finfo(np.float32).eps * (np.abs(want) + np.log(cols) + 1)
    assert np.all(np.abs(out - want) <= bound)


@needs_kernels
def test_log_softmax_in_place_on_views_and_non_finite_rows():
    """In place, on a column block of a wider matrix; a row with a NaN, a row with
    +inf and a row of -inf end all NaN (as NumPy's path: NaN - max, inf - inf); a
    row with a -inf entry gives -inf there and finite values elsewhere."""
    rng = np.random.default_rng(3)
    wide = rng.standard_normal((6, 12)).astype(np.float32)
    x = wide[:, 2:10]
    x[1, 3] = np.nan
    x[2, 0] = np.inf
    x[3, :] = -np.inf
    x[4, 5] = -np.inf
    before = wide.copy()
    want = np.empty_like(x)
    from pynnet3.components.nonlinear import _log_softmax_blocked
    _log_softmax_blocked(np.ascontiguousarray(x), want)
    assert c_kernels.log_softmax(x, x)
    np.testing.assert_array_equal(wide[:, :2], before[:, :2])  # (outside: untouched)
    np.testing.assert_array_equal(wide[:, 10:], before[:, 10:])
    np.testing.assert_array_equal(np.isnan(x), np.isnan(want))
    assert np.isnan(x[1:4]).all() and x[4, 5] == -np.inf
    finite = np.isfinite(want)
    np.testing.assert_allclose(x[finite], want[finite], rtol=1e-6, atol=1e-6)
    assert not c_kernels.log_softmax(x, wide[:, 1:9])  # (a shifted alias: declined)
