"""components/blas.gemm_acc (``c += alpha a @ b`` in one BLAS call) and the
backprops that use it (affine / linear with the input as column blocks, TDNN per
time offset): the same floats as the NumPy expressions they replaced when the
accumulator starts at zero, float32 rounding otherwise; the NumPy fallback
(another library, a layout BLAS cannot take, overlapping operands) is the
expression itself."""

from __future__ import annotations

import numpy as np
import pytest

from pynnet3.components import blas
from pynnet3.components.affine import gather_blocks
from tests.blas_probe import assert_same_floats_if, matmul_keeps_column_blocks
from tests.components.common import from_config


def _operand(rng, shape, kind, dtype):
    r, c = shape
    if kind == "c":
        return rng.standard_normal(shape).astype(dtype)
    if kind == "f":
        return np.asfortranarray(rng.standard_normal(shape).astype(dtype))
    if kind == "strided":  # a column block of a wider matrix
        return rng.standard_normal((r, c + 5)).astype(dtype)[:, 2:c + 2]
    return rng.standard_normal((c + 4, r)).astype(dtype)[1:c + 1].T  # a transposed block


KINDS = ["c", "f", "strided", "transposed"]


@pytest.fixture(autouse=True)
def direct_for_all_sizes(monkeypatch):
    """The small shapes here take the direct BLAS call too (not the NumPy expression
    that gemm_acc uses below MIN_DIRECT_ENTRIES)."""
    monkeypatch.setattr(blas, "MIN_DIRECT_ENTRIES", 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gemm_acc_equals_the_numpy_expression(dtype):
    rng = np.random.default_rng(21)
    for trial in range(300):
        m, n, k = (int(v) for v in rng.integers(1, 30, 3))
        ka, kb, kc = (KINDS[int(i)] for i in rng.integers(0, 4, 3))
        a, b = _operand(rng, (m, k), ka, dtype), _operand(rng, (k, n), kb, dtype)
        c = _operand(rng, (m, n), kc, dtype)
        alpha = [1.0, -0.5, 3.0][trial % 3]
        zero = trial % 2 == 0
        if zero:
            c[...] = 0
        want = c + alpha * (a @ b) if alpha != 1.0 else c + a @ b
        got = c.copy(order="K") if kc != "strided" else c
        blas.gemm_acc(got, a, b, alpha)
        np.testing.assert_allclose(got, want, rtol=2e-6 if dtype == np.float32 else 1e-13,
                                   atol=1e-5 if dtype == np.float32 else 1e-12)
        if (zero and alpha == 1.0 and min(m, n) > 1 and kc not in ("f", "transposed")
                and blas.available()):
            # the same sgemm/dgemm as matmul (a column-major c, "f" or a transposed
            # block, is computed transposed, which rounds differently on some kernels)
            np.testing.assert_array_equal(got, want)


def test_gemm_acc_edge_cases(monkeypatch):
    rng = np.random.default_rng(2)
    c = np.ones((3, 4), np.float32)
    blas.gemm_acc(c, np.zeros((3, 0), np.float32), np.zeros((0, 4), np.float32))
    assert np.array_equal(c, np.ones((3, 4)))  # empty inner dimension: unchanged
    with pytest.raises(ValueError):
        blas.gemm_acc(c, np.ones((3, 2), np.float32), np.ones((3, 4), np.float32))
    # overlapping operands: the NumPy expression (a temporary first)
    m = rng.standard_normal((6, 6)).astype(np.float32)
    want = m.copy()
    want[:, :3] += m[:, 3:] @ m[3:, 3:]
    blas.gemm_acc(m[:, :3], m[:, 3:], m[3:, 3:])
    np.testing.assert_array_equal(m, want)
    # no direct BLAS: the NumPy expression exactly, also for mixed dtypes
    monkeypatch.setattr(blas, "_GEMM", {})
    a, b = rng.standard_normal((5, 3)), rng.standard_normal((3, 4)).astype(np.float32)
    c = rng.standard_normal((5, 4)).astype(np.float32)
    want = c.copy()
    want += a @ b
    blas.gemm_acc(c, a, b)
    np.testing.assert_array_equal(c, want)


def _affine(kind):
    if kind == "LinearComponent":
        return from_config("component name=a type=LinearComponent input-dim=12 output-dim=7")
    return from_config(f"component name=a type={kind} input-dim=12 output-dim=7")


@pytest.mark.parametrize("kind", ["AffineComponent", "NaturalGradientAffineComponent",
                                  "LinearComponent"])
def test_block_backprop_equals_gathered_input(kind):
    rng = np.random.default_rng(4)
    comp = _affine(kind)
    big = rng.standard_normal((30, 9)).astype(np.float32)
    blocks = [big[0:20, :5], big[3:23, 2:6], big[8:28, 6:9]]  # 5 + 4 + 3 = 12 columns
    x = gather_blocks(blocks)
    od = rng.standard_normal((20, 7)).astype(np.float32)
    w = comp.linear_params if kind != "LinearComponent" else comp.params_
    for start_at_zero in (True, False):
        grad = {k: np.zeros_like(v) for k, v in comp.params().items()}
        if not start_at_zero:
            for v in grad.values():
                v += rng.standard_normal(v.shape).astype(np.float32)
        want = {k: v.copy() for k, v in grad.items()}
        d_old = rng.standard_normal((20, 12)).astype(np.float32)[:, ::1]
        d_new = d_old.copy()
        d_old += od @ w  # the former formulas
        for key in want:
            want[key] += od.T @ x if want[key].ndim == 2 else od.sum(axis=0)
        comp.backprop_blocks(None, blocks, None, od, None, grad, d_new)
        if start_at_zero:
            # one product per block: the whole product's floats where this BLAS keeps
            # a product's column blocks (tests/blas_probe.py), its rounding elsewhere
            exact = matmul_keeps_column_blocks(od.T, x, [5, 4, 3])
            for key in want:
                assert_same_floats_if(exact or want[key].ndim == 1, grad[key], want[key])
        else:
            for key in want:
                np.testing.assert_allclose(grad[key], want[key], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(d_new, d_old)


@pytest.mark.parametrize("use_bias", [True, False])
def test_tdnn_backprop_per_offset_equals_spliced(use_bias):
    rng = np.random.default_rng(6)
    comp = from_config("component name=c type=TdnnComponent input-dim=6 output-dim=5 "
                       f"time-offsets=-2,0,3 use-bias={str(use_bias).lower()}")
    t_in, t_out = np.arange(-2, 23), np.arange(0, 20)
    in_idx = np.stack([np.zeros_like(t_in), t_in, np.zeros_like(t_in)], 1)
    out_idx = np.stack([np.zeros_like(t_out), t_out, np.zeros_like(t_out)], 1)
    idx = comp.precompute_indexes(in_idx, out_idx, True)
    assert idx.starts is not None  # the per-offset (slice) path
    x = rng.standard_normal((len(in_idx), 6)).astype(np.float32)
    od = rng.standard_normal((len(out_idx), 5)).astype(np.float32)
    spliced = np.concatenate([x[s:s + len(out_idx)] for s in idx.starts], axis=1)
    grad = {k: np.zeros_like(v) for k, v in comp.params().items()}
    d_new = np.zeros_like(x)
    comp.backprop(idx, x, None, od, None, grad, d_new)
    assert_same_floats_if(matmul_keeps_column_blocks(od.T, spliced, [6, 6, 6]),
                          grad["linear_params"], od.T @ spliced)
    d_old = np.zeros_like(x)
    for k, s in enumerate(idx.starts):
        d_old[s:s + len(out_idx)] += od @ comp.linear_params[:, 6 * k:6 * (k + 1)]
    np.testing.assert_array_equal(d_new, d_old)
    comp.backprop(idx, x, None, od, None, grad, d_new)  # accumulates
    np.testing.assert_allclose(grad["linear_params"], 2 * (od.T @ spliced), rtol=1e-6)
    np.testing.assert_allclose(d_new, 2 * d_old, rtol=1e-6)


def test_propagate_adds_in_one_gemm():
    """LinearComponent and a bias-free TDNN add their product into the output: into
    zeros, exactly the product (the TDNN: one product per time offset, accumulated as
    Kaldi's layer does, so the spliced product to float32 rounding); into other
    values, the sum to float32 rounding."""
    rng = np.random.default_rng(8)
    lin = from_config("component name=l type=LinearComponent input-dim=40 output-dim=24")
    tdnn = from_config("component name=c type=TdnnComponent input-dim=20 output-dim=24 "
                       "time-offsets=-1,0 use-bias=false")
    t_in, t_out = np.arange(-1, 30), np.arange(0, 30)
    in_idx = np.stack([np.zeros_like(t_in), t_in, np.zeros_like(t_in)], 1)
    out_idx = np.stack([np.zeros_like(t_out), t_out, np.zeros_like(t_out)], 1)
    tidx = tdnn.precompute_indexes(in_idx, out_idx, True)
    x_lin = rng.standard_normal((30, 40)).astype(np.float32)
    x_tdnn = rng.standard_normal((31, 20)).astype(np.float32)
    spliced = np.concatenate([x_tdnn[s:s + 30] for s in tidx.starts], axis=1)
    cases = [(lin, None, x_lin, x_lin @ lin.params_.T),
             (tdnn, tidx, x_tdnn, spliced @ tdnn.linear_params.T)]
    for comp, idx, x, prod in cases:
        out = np.zeros((30, 24), np.float32)
        comp.propagate(idx, x, out)
        if comp is lin:
            np.testing.assert_array_equal(out, prod)
        else:
            want = sum(x_tdnn[s:s + 30] @ tdnn.linear_params[:, 20 * k:20 * (k + 1)].T
                       for k, s in enumerate(tidx.starts))
            np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(out, prod, rtol=1e-5, atol=1e-5)
        base = rng.standard_normal((30, 24)).astype(np.float32)
        out = base.copy()
        comp.propagate(idx, x, out)
        np.testing.assert_allclose(out, base + prod, rtol=1e-5, atol=1e-5)


def test_unaligned_and_broadcast_operands_use_the_numpy_expression():
    rng = np.random.default_rng(3)
    raw = np.zeros(4 * 12 + 1, np.uint8)[1:].view(np.float32).reshape(4, 3)  # unaligned
    raw[...] = rng.standard_normal((4, 3))
    assert not raw.flags.aligned
    b = np.broadcast_to(rng.standard_normal((1, 5)).astype(np.float32), (3, 5))  # stride 0
    c = rng.standard_normal((4, 5)).astype(np.float32)
    want = c + raw @ b
    blas.gemm_acc(c, raw, b)
    np.testing.assert_allclose(c, want, rtol=1e-6, atol=1e-6)


def test_small_products_use_the_numpy_expression(monkeypatch):
    monkeypatch.setattr(blas, "MIN_DIRECT_ENTRIES", 100)
    calls = []
    fake = {dt: (lambda *args, f=fn: (calls.append(1), f(*args))[1])
            for dt, fn in blas._GEMM.items()}
    monkeypatch.setattr(blas, "_GEMM", fake)
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((9, 4)).astype(np.float32), \
        rng.standard_normal((4, 11)).astype(np.float32)
    c = np.zeros((9, 11), np.float32)  # 99 entries: NumPy
    blas.gemm_acc(c, a, b)
    np.testing.assert_array_equal(c, a @ b)
    assert not calls
    c = np.zeros((10, 11), np.float32)
    a = rng.standard_normal((10, 4)).astype(np.float32)
    blas.gemm_acc(c, a, b)  # 110 entries: BLAS (where available)
    assert len(calls) == (1 if fake else 0)
