"""COPY_ROWS / ADD_ROWS on the NumPy backend against a row-by-row reference, for
tables that form a grid (copied through strided views: an n-major input read at a
time offset in t-major order, an iVector repeated per frame, reversed runs) and
tables that do not, into whole matrices and column blocks, scaled or not."""

import numpy as np
import pytest

from pynnet3.runtime.numpy_backend import NumpyBackend, _grid


def reference(dst, src, table, alpha, add):
    out = dst.copy()
    for i, r in enumerate(table.tolist()):
        v = alpha * src[r] if r >= 0 else 0.0
        if add:
            out[i] += v
        else:
            out[i] = v
    return out


def grid_table(start, p, q, a, b):
    i, j = np.meshgrid(np.arange(p), np.arange(q), indexing="ij")
    return (start + a * i + b * j).reshape(-1).astype(np.int32)


N, T = 3, 10  # three sequences of ten frames, n-major
TABLES = {
    "offset, t-major": grid_table(2, 6, N, 1, T),  # (t, n) <- n * T + t + 2
    "ivector per frame": grid_table(0, 8, N, 0, 1),
    "reversed": grid_table(25, 1, 20, 0, -1),
    "one run": np.arange(4, 24, dtype=np.int32),
    "not a grid": np.array([0, 1, 2, 4, 5, 6, 9, 3, 3, 7], np.int32),
    "with -1": np.array([0, 1, -1, 4, 5, 6, 9, 3, 3, 7], np.int32),
}


@pytest.mark.parametrize("name", list(TABLES))
@pytest.mark.parametrize("add", [False, True])
@pytest.mark.parametrize("alpha", [1.0, -2.0])
@pytest.mark.parametrize("block", [False, True])
def test_matches_row_by_row(name, add, alpha, block):
    table = TABLES[name]
    rng = np.random.default_rng(len(table))
    src = rng.standard_normal((N * T, 4)).astype(np.float32)
    whole = rng.standard_normal((len(table), 9)).astype(np.float32)
    dst = whole[:, 2:6] if block else whole[:, :4].copy()
    want = reference(dst, src, table, alpha, add)
    before = whole.copy()
    (NumpyBackend().add_rows if add else NumpyBackend().copy_rows)(dst, src, table, alpha)
    np.testing.assert_allclose(dst, want, rtol=1e-6, atol=1e-6)
    if block:  # the other columns are untouched
        np.testing.assert_array_equal(whole[:, :2], before[:, :2])
        np.testing.assert_array_equal(whole[:, 6:], before[:, 6:])


def test_grid_detection():
    assert _grid(TABLES["offset, t-major"]) == (2, 6, N, 1, T)
    assert _grid(TABLES["ivector per frame"]) == (0, 8, N, 0, 1)
    assert _grid(TABLES["not a grid"]) is None
    assert _grid(np.array([0, 2, 4, 6, 9], np.int32)) is None  # 5 rows: no p x q


def test_overlapping_destination_falls_back():
    rng = np.random.default_rng(3)
    big = rng.standard_normal((12, 3)).astype(np.float32)
    table = np.arange(2, 8, dtype=np.int32)
    dst, src = big[0:6], big[0:12]
    want = reference(dst, src, table, 1.0, False)
    NumpyBackend().copy_rows(dst, src, table, 1.0)
    np.testing.assert_allclose(dst, want)
