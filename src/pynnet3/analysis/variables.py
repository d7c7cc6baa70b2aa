"""Computation variables: the pieces of matrices that the analysis tracks.

For each matrix, the row and column boundaries of every submatrix on it split the
matrix into a grid; each cell is a *variable* (Kaldi's ComputationVariables, with
row splits). Every submatrix is then an exact union of variables, so "which
commands touch which data" becomes a question about variable ids.

Variable ids of matrix ``m`` are ``base[m] + r * ncols[m] + c`` for row cell ``r``
and column cell ``c``; row cells are outer so that a row range maps to a
contiguous block of ids when the submatrix spans all columns.

Everything is computed for all matrices and submatrices at once with numpy (no
per-submatrix Python work): the variables of submatrix ``s`` are the slice
``sub_vars[sub_ptr[s]:sub_ptr[s + 1]]``.
"""

from __future__ import annotations

from itertools import chain
from operator import attrgetter

import numpy as np

from ..computation import NnetComputation
from ..index import unique_keys
from .session import current_session, read_submatrices

_SIZE = attrgetter("rows", "cols")


def submatrix_array(c: NnetComputation) -> np.ndarray:
    """``(num_submatrices, 5)`` int64 array of (matrix, row offset, rows, column
    offset, columns), row 0 the empty submatrix. Inside an optimizer session
    (:mod:`.session`) it is read-only and only changed submatrices are read again."""
    s = current_session(c)
    if s is not None:
        return s.submatrix_array(c.submatrices)
    return read_submatrices(c.submatrices)


def matrix_sizes(c: NnetComputation) -> np.ndarray:
    """``(num_matrices, 2)`` int64 array of (rows, columns), row 0 the empty matrix."""
    return np.fromiter(chain.from_iterable(map(_SIZE, c.matrices)), dtype=np.int64,
                       count=2 * len(c.matrices)).reshape(-1, 2)


def _cuts(nm: int, size: np.ndarray, mat: np.ndarray, lo: np.ndarray, hi: np.ndarray
          ) -> tuple[np.ndarray, np.ndarray, int]:
    """Sorted unique cut points of every matrix along one axis, as one array of
    ``matrix * scale + point`` keys, with the start of each matrix's run in it
    (``ptr``, length nm + 1) and the scale."""
    scale = int(max(int(size.max()) if len(size) else 0,
                    int(hi.max()) if len(hi) else 0)) + 1
    ms = np.arange(nm, dtype=np.int64)
    keys = np.concatenate([ms * scale, ms * scale + size, mat * scale + lo, mat * scale + hi])
    keys = unique_keys(keys)
    ptr = np.searchsorted(keys, np.arange(nm + 1, dtype=np.int64) * scale)
    return keys, ptr, scale


class ComputationVariables:
    """Variables of a computation and the map submatrix -> variable ids."""

    def __init__(self, c: NnetComputation, sub_array: np.ndarray | None = None):
        nm = len(c.matrices)
        sa = submatrix_array(c) if sub_array is None else sub_array
        sizes = matrix_sizes(c)
        mat, r0, nr, c0, nc = (sa[1:, k] for k in range(5))
        self._rkeys, self._rptr, self._rscale = _cuts(nm, sizes[:, 0], mat, r0, r0 + nr)
        self._ckeys, self._cptr, self._cscale = _cuts(nm, sizes[:, 1], mat, c0, c0 + nc)
        nrc = np.diff(self._rptr) - 1  # row cells per matrix
        ncc = np.diff(self._cptr) - 1
        counts = nrc * ncc
        counts[0] = 0
        self.ncell = ncc
        self.base = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.num_variables = int(self.base[-1])
        #: matrix of each variable
        self.matrix_of = np.repeat(np.arange(nm), counts)
        # cell ranges of each submatrix
        ri0 = np.searchsorted(self._rkeys, mat * self._rscale + r0) - self._rptr[mat]
        ri1 = np.searchsorted(self._rkeys, mat * self._rscale + r0 + nr) - self._rptr[mat]
        ci0 = np.searchsorted(self._ckeys, mat * self._cscale + c0) - self._cptr[mat]
        ci1 = np.searchsorted(self._ckeys, mat * self._cscale + c0 + nc) - self._cptr[mat]
        w = ci1 - ci0
        lens = np.concatenate([[0], (ri1 - ri0) * w])
        self.sub_ptr = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        total = int(self.sub_ptr[-1])
        seg = np.repeat(np.arange(len(mat)), lens[1:])
        j = np.arange(total, dtype=np.int64) - self.sub_ptr[1:-1][seg] if len(mat) else \
            np.zeros(0, dtype=np.int64)
        ws = w[seg]
        m = mat[seg]
        self.sub_vars = self.base[m] + (ri0[seg] + j // np.maximum(ws, 1)) * ncc[m] + \
            ci0[seg] + j % np.maximum(ws, 1)
        self._row_points = self._col_points = None

    @property
    def row_points(self) -> list[np.ndarray]:
        """Per matrix, its sorted row cut points (0 and its row count included)."""
        if self._row_points is None:
            pts = self._rkeys - np.repeat(np.arange(len(self._rptr) - 1) * self._rscale,
                                          np.diff(self._rptr))
            p = self._rptr.tolist()
            self._row_points = [pts[p[m]:p[m + 1]] for m in range(len(p) - 1)]
        return self._row_points

    @property
    def col_points(self) -> list[np.ndarray]:
        """Per matrix, its sorted column cut points."""
        if self._col_points is None:
            pts = self._ckeys - np.repeat(np.arange(len(self._cptr) - 1) * self._cscale,
                                          np.diff(self._cptr))
            p = self._cptr.tolist()
            self._col_points = [pts[p[m]:p[m + 1]] for m in range(len(p) - 1)]
        return self._col_points

    def submatrix_variables(self, s: int) -> np.ndarray:
        """Sorted variable ids making up submatrix ``s`` exactly."""
        return self.sub_vars[self.sub_ptr[s]:self.sub_ptr[s + 1]]

    def matrix_variables(self, m: int) -> np.ndarray:
        return np.arange(self.base[m], self.base[m + 1])

    def describe(self, v: int, c: NnetComputation | None = None) -> str:
        """Human-readable name: ``m3[rows 0:10, cols 5:20]``."""
        m = int(self.matrix_of[v])
        k = v - int(self.base[m])
        ncell = len(self.col_points[m]) - 1
        r, col = divmod(k, ncell)
        rp, cp = self.row_points[m], self.col_points[m]
        name = f"m{m}"
        if c is not None and c.matrices[m].node:
            name += f" ({c.matrices[m].node}{' deriv' if c.matrices[m].is_deriv else ''})"
        return f"{name}[rows {rp[r]}:{rp[r + 1]}, cols {cp[col]}:{cp[col + 1]}]"
