"""Computation variables: the pieces of matrices that the analysis tracks.

For each matrix, the row and column boundaries of every submatrix on it split the
matrix into a grid; each cell is a *variable* (Kaldi's ComputationVariables, with
row splits). Every submatrix is then an exact union of variables, so "which
commands touch which data" becomes a question about variable ids.

Variable ids of matrix ``m`` are ``base[m] + r * ncols[m] + c`` for row cell ``r``
and column cell ``c``; row cells are outer so that a row range maps to a
contiguous block of ids when the submatrix spans all columns.
"""

from __future__ import annotations

import numpy as np

from ..computation import NnetComputation


class ComputationVariables:
    """Variables of a computation and the map submatrix -> variable ids."""

    def __init__(self, c: NnetComputation):
        nm = len(c.matrices)
        row_pts: list[set] = [{0, m.rows} for m in c.matrices]
        col_pts: list[set] = [{0, m.cols} for m in c.matrices]
        for sm in c.submatrices[1:]:
            row_pts[sm.matrix].update((sm.row_offset, sm.row_offset + sm.num_rows))
            col_pts[sm.matrix].update((sm.col_offset, sm.col_offset + sm.num_cols))
        self.row_points = [np.array(sorted(p), dtype=np.int64) for p in row_pts]
        self.col_points = [np.array(sorted(p), dtype=np.int64) for p in col_pts]
        counts = np.array([(len(r) - 1) * (len(k) - 1) for r, k in
                           zip(self.row_points, self.col_points, strict=True)], dtype=np.int64)
        counts[0] = 0
        self.base = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.num_variables = int(self.base[-1])
        #: matrix of each variable
        self.matrix_of = np.repeat(np.arange(nm), counts)
        self._sub_vars: list[np.ndarray] = [np.zeros(0, dtype=np.int64)]
        for sm in c.submatrices[1:]:
            self._sub_vars.append(self._vars(sm.matrix, sm.row_offset, sm.num_rows,
                                             sm.col_offset, sm.num_cols))
        self._matrix_vars = [np.arange(self.base[m], self.base[m + 1]) for m in range(nm)]

    def _vars(self, m: int, r0: int, nr: int, c0: int, nc: int) -> np.ndarray:
        rp, cp = self.row_points[m], self.col_points[m]
        ri0, ri1 = np.searchsorted(rp, [r0, r0 + nr])
        ci0, ci1 = np.searchsorted(cp, [c0, c0 + nc])
        ncell = len(cp) - 1
        rows = np.arange(ri0, ri1)
        cols = np.arange(ci0, ci1)
        return (self.base[m] + rows[:, None] * ncell + cols[None, :]).ravel()

    def submatrix_variables(self, s: int) -> np.ndarray:
        """Sorted variable ids making up submatrix ``s`` exactly."""
        return self._sub_vars[s]

    def matrix_variables(self, m: int) -> np.ndarray:
        return self._matrix_vars[m]

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
