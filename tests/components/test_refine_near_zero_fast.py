"""refine_near_zero's cheap first pass (float32 norms with slack, a flat nonzero)
refines exactly the entries the float64-norm formula it replaced did: the results
are bit-identical to that formula, on contiguous and strided inputs."""

from __future__ import annotations

import numpy as np
import pytest

from pynnet3.components.affine import refine_near_zero


def _former(out, x, w, b=None):
    """refine_near_zero as it was (float64 norms of every row, 2-D nonzero)."""
    if out.size == 0:
        return
    k = x.shape[1]
    xn = np.sqrt(np.einsum("ij,ij->i", x, x, dtype=np.float64))
    wn = np.sqrt(np.einsum("ij,ij->i", w, w, dtype=np.float64))
    c = 4.0 * float(np.finfo(np.float32).eps) * np.sqrt(k)
    rows, cols = np.nonzero(np.abs(out) <= c * xn.max() * wn.max())
    if not len(rows):
        return
    keep = np.abs(out[rows, cols]) <= c * xn[rows] * wn[cols]
    rows, cols = rows[keep], cols[keep]
    if not len(rows):
        return
    exact = np.einsum("ij,ij->i", x[rows].astype(np.float64), w[cols].astype(np.float64))
    if b is not None:
        exact += b[cols]
    out[rows, cols] = exact


def _case(rng, rows, k, o, strided, near):
    x = rng.standard_normal((rows, k + 3)).astype(np.float32)
    x = x[:, 1:k + 1] if strided else np.ascontiguousarray(x[:, :k])
    w = (rng.standard_normal((o, k)) * rng.uniform(0.01, 3)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    if near and rows and o:  # put some outputs within rounding distance of zero
        i = rng.integers(0, rows, size=min(o, 6))
        j = rng.permutation(o)[:len(i)]
        b[j] = (-exact[i, j]).astype(np.float32)
    out = x @ w.T + b
    return out, x, w, b


@pytest.mark.parametrize("strided", [False, True])
def test_same_entries_refined_as_the_former_formula(strided):
    rng = np.random.default_rng(17 + strided)
    refined = 0
    for trial in range(150):
        rows, k, o = int(rng.integers(0, 60)), int(rng.integers(1, 300)), int(rng.integers(1, 40))
        out, x, w, b = _case(rng, rows, k, o, strided, near=trial % 3 != 0)
        old = out.copy()
        _former(old, x, w, b if trial % 2 else None)
        new = out.copy()
        refine_near_zero(new, x, w, b if trial % 2 else None)
        np.testing.assert_array_equal(new, old)
        refined += int((new != out).sum())
    assert refined > 0  # the cases do exercise the refinement


def test_extreme_values():
    x = np.array([[1e19, 1.0], [0.0, 0.0]], np.float32)  # float32 sums of squares overflow
    w = np.array([[1.0, -1e19], [0.0, 1.0]], np.float32)
    out = x @ w.T
    old, new = out.copy(), out.copy()
    with np.errstate(over="ignore", invalid="ignore"):
        _former(old, x, w)
        refine_near_zero(new, x, w)
    np.testing.assert_array_equal(new, old)
    x = np.array([[np.nan, 1.0]], np.float32)
    out = x @ w.T
    new = out.copy()
    refine_near_zero(new, x, w)
    np.testing.assert_array_equal(new, out)


@pytest.mark.parametrize("layout", ["windows", "separate", "mixed"])
def test_blocks_refine_the_same_entries(layout):
    """Given x's column blocks (row windows of one matrix, as a TDNN-style spliced
    input; separate arrays; or both), the first pass bounds the rows' norms from the
    blocks, and the same entries as the former formula on x are refined."""
    rng = np.random.default_rng({"windows": 5, "separate": 6, "mixed": 7}[layout])
    refined = 0
    for trial in range(60):
        d, o, n = int(rng.integers(1, 50)), int(rng.integers(1, 30)), int(rng.integers(0, 40))
        starts = sorted(int(s) for s in rng.integers(0, 12, size=int(rng.integers(2, 5))))
        base = rng.standard_normal((n + max(starts), d)).astype(np.float32)
        blocks = [base[s:s + n] for s in starts]
        if layout == "separate":
            blocks = [blk.copy() for blk in blocks]
        elif layout == "mixed":
            blocks[0] = blocks[0].copy()
        x = np.concatenate(blocks, axis=1)
        k = x.shape[1]
        w = (rng.standard_normal((o, k)) * rng.uniform(0.01, 3)).astype(np.float32)
        b = rng.standard_normal(o).astype(np.float32)
        if n and trial % 3:  # outputs within rounding distance of zero
            exact = x.astype(np.float64) @ w.astype(np.float64).T
            i = rng.integers(0, n, size=min(o, 6))
            j = rng.permutation(o)[:len(i)]
            b[j] = (-exact[i, j]).astype(np.float32)
        out = x @ w.T + b
        old, new = out.copy(), out.copy()
        _former(old, x, w, b)
        refine_near_zero(new, x, w, b, blocks)
        np.testing.assert_array_equal(new, old)
        refined += int((new != out).sum())
    assert refined > 0


def test_affine_block_input_same_bits_as_spliced():
    """AffineComponent with its input as row windows of one matrix (a spliced
    input left unmaterialized, in training) writes the bits of the spliced
    matrix's propagate, near-zero refinement included."""
    from pynnet3.components.affine import AffineComponent, _row_window

    rng = np.random.default_rng(23)
    d, o, n, starts = 24, 16, 200, (0, 3, 7)
    base = rng.standard_normal((n + max(starts), d)).astype(np.float32)
    blocks = [base[s:s + n] for s in starts]
    assert all(_row_window(blk)[0] is base for blk in blocks)  # the one-pass norms
    x = np.concatenate(blocks, axis=1)
    w = rng.standard_normal((o, 3 * d)).astype(np.float32)
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    b = rng.standard_normal(o).astype(np.float32)
    b[:6] = (-exact[rng.integers(0, n, 6), np.arange(6)]).astype(np.float32)
    comp = AffineComponent(w, b)
    want, got = np.empty((n, o), np.float32), np.empty((n, o), np.float32)
    comp.propagate(None, x, want)
    comp.propagate_blocks(None, blocks, got)
    np.testing.assert_array_equal(got, want)
    plain = x @ w.T + b
    assert (want != plain).any()  # the refinement did change entries


@pytest.mark.parametrize("n", [0, 7, 4096, 4104, 5120 * 160, 4099])
@pytest.mark.parametrize("density", [0.0, 1e-4, 0.01, 0.5, 1.0])
def test_flat_true_is_flatnonzero(n, density):
    from pynnet3.components.affine import _flat_true

    rng = np.random.default_rng(n)
    mask = rng.random(n) < density
    if n and density:
        mask[-1] = True  # (the last byte of the last word)
        mask[0] = True
    got = _flat_true(mask.reshape(-1, 8) if n % 8 == 0 and n else mask)
    np.testing.assert_array_equal(got, np.flatnonzero(mask))
    assert got.dtype == np.flatnonzero(mask).dtype
