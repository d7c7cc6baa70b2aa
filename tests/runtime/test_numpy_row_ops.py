"""NumPy backend copy_rows / add_rows: the fast paths (every row has a source) give
exactly what the masked formulas they replaced give, for contiguous and strided
destinations, overlapping source and destination, alpha != 1, -1 rows and empty
tables; an out-of-range row still raises."""

from __future__ import annotations

import numpy as np
import pytest

from pynnet3.runtime.numpy_backend import NumpyBackend


def _copy_former(dst, src, table, alpha):
    ok = table >= 0
    vals = src[table[ok]]
    dst[ok] = vals if alpha == 1.0 else alpha * vals
    dst[~ok] = 0


def _add_former(dst, src, table, alpha):
    ok = table >= 0
    vals = src[table[ok]]
    dst[ok] += vals if alpha == 1.0 else alpha * vals


def _case(rng, layout, rows, with_missing, dtype):
    base = rng.standard_normal((40, 9)).astype(dtype)
    if layout == "overlap":  # destination rows (contiguous) and source in one matrix
        src, where = base, np.s_[10:10 + rows]
    elif layout == "strided":
        src, where = rng.standard_normal((25, 5)).astype(dtype), np.s_[:rows, 3:8]
    else:
        src = rng.standard_normal((25, 5)).astype(dtype)
        base = rng.standard_normal((rows, 5)).astype(dtype)
        where = np.s_[:]
    table = rng.integers(0, src.shape[0], rows)
    if with_missing and rows:
        table[rng.random(rows) < 0.3] = -1
    return base, src, where, table


@pytest.mark.parametrize("op", ["copy", "add"])
@pytest.mark.parametrize("layout", ["contiguous", "strided", "overlap"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_row_ops_match_former_formulas(op, layout, dtype):
    rng = np.random.default_rng(11)
    be = NumpyBackend()
    new_op = be.copy_rows if op == "copy" else be.add_rows
    old_op = _copy_former if op == "copy" else _add_former
    for trial in range(60):
        rows = int(rng.integers(0, 20))
        base, src, where, table = _case(rng, layout, rows, trial % 3 == 0, dtype)
        alpha = [1.0, 0.5, -1.7, 1e-3][trial % 4]
        b_new, b_old = base.copy(), base.copy()
        if layout == "overlap":  # src is a view of the same matrix as dst
            new_op(b_new[where], b_new, table, alpha)
            old_op(b_old[where], b_old, table, alpha)
        else:
            new_op(b_new[where], src, table, alpha)
            old_op(b_old[where], src, table, alpha)
        np.testing.assert_array_equal(b_new, b_old)


def test_out_of_range_rows_still_raise():
    be = NumpyBackend()
    src = np.ones((4, 3), np.float32)
    dst = np.zeros((2, 3), np.float32)
    with pytest.raises(IndexError):
        be.copy_rows(dst, src, np.array([0, 4]), 1.0)
    with pytest.raises(IndexError):
        be.add_rows(dst, src, np.array([4, 0]), 1.0)
