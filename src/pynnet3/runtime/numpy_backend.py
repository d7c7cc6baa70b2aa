"""The default backend: NumPy arrays, float32 (float64 on request)."""

from __future__ import annotations

import numpy as np

from ..index import unique_keys
from .backend import register_backend
from .matrix_pool import POOL


class NumpyBackend:
    name = "numpy"

    def zeros(self, rows, cols, dtype):
        arr = POOL.take(rows, cols, dtype)  # a freed matrix's warm pages (matrix_pool)
        if arr is None:
            return np.zeros((rows, cols), dtype=dtype)
        arr.fill(0)
        return arr

    def release_matrix(self, matrices: dict, key) -> None:
        """Drop ``matrices[key]`` (DEALLOC_MATRIX); its buffer goes to the pool
        when nothing else holds it, and when this backend's zeros() takes from it."""
        if type(self).zeros is NumpyBackend.zeros:
            POOL.release(matrices, key)
        else:
            matrices.pop(key, None)

    def from_numpy(self, array, dtype):
        return np.array(array, dtype=dtype, copy=True)

    def to_numpy(self, array):
        return np.asarray(array)

    def view(self, mat, row0, nrows, col0, ncols):
        return mat[row0:row0 + nrows, col0:col0 + ncols]

    def is_finite(self, array) -> bool:
        return bool(np.isfinite(array).all())

    def set_const(self, dst, value):
        dst[...] = value

    def copy(self, dst, src, alpha):
        if alpha == 1.0:
            dst[...] = src
        else:
            np.multiply(src, alpha, out=dst, casting="unsafe")

    def add(self, dst, src, alpha):
        if alpha == 1.0:
            dst += src
        else:
            dst += alpha * src

    def copy_rows(self, dst, src, table, alpha):
        ok = table >= 0
        vals = src[table[ok]]
        dst[ok] = vals if alpha == 1.0 else alpha * vals
        dst[~ok] = 0

    def add_rows(self, dst, src, table, alpha):
        ok = table >= 0
        vals = src[table[ok]]
        dst[ok] += vals if alpha == 1.0 else alpha * vals

    def _gather_multi(self, dst, sources, table):
        out = np.zeros_like(dst)
        for s in unique_keys(table[:, 0]).tolist():
            if s < 0:
                continue
            sel = table[:, 0] == s
            out[sel] = sources[s][table[sel, 1]]
        return out

    def copy_rows_multi(self, dst, sources, table, alpha):
        vals = self._gather_multi(dst, sources, table)
        dst[...] = vals if alpha == 1.0 else alpha * vals

    def add_rows_multi(self, dst, sources, table, alpha):
        vals = self._gather_multi(dst, sources, table)
        dst += vals if alpha == 1.0 else alpha * vals

    def add_row_ranges(self, dst, src, ranges, alpha):
        # Prefix sums in float64 keep long ranges (pooling over thousands of frames)
        # at float32 accuracy.
        cs = np.zeros((src.shape[0] + 1, src.shape[1]), dtype=np.float64)
        np.cumsum(src, axis=0, dtype=np.float64, out=cs[1:])
        sums = cs[ranges[:, 1]] - cs[ranges[:, 0]]
        dst += (alpha * sums).astype(dst.dtype)


register_backend("numpy", NumpyBackend)
