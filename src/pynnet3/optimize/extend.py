"""Matrix extension (Kaldi's ExtendMatrices / MatrixExtender).

TDNN splicing copies a layer's output ``src`` (all columns, rows ``0:k``) into
the last rows of a column block of a wider matrix ``dst``; the last few rows of
``src`` are not needed there, so the copy's source is not the whole of ``src``
and variable merging cannot put ``src`` inside ``dst``. This pass makes such a
copy take all of ``src``, growing ``dst`` by the few missing rows (at most 25%,
Kaldi's 0.8 minimum proportion). The copy then has a whole-matrix source, and
variable merging can make the layer write straight into ``dst``.

Invariants: only ``dst`` matrices that are not user inputs or outputs grow; the
extra source rows read are defined (the source is an input, or it is zeroed as a
whole before the copy); a zeroing of all of a grown matrix still zeroes all of
it; debug indexes of the new rows repeat earlier rows with ``t`` = Kaldi's
kNoTime.
"""

from __future__ import annotations

import numpy as np

from ..analysis.accesses import AccessTable, build_access_table
from ..computation import CommandType as CT
from ..computation import NnetComputation
from .options import OptimizeOptions

_MIN_PROPORTION = 0.8
NO_TIME = int(np.iinfo(np.int32).min)


def extend_matrices(c: NnetComputation, nnet, options: OptimizeOptions | None = None) -> str:
    """Extend copy destinations so copies read whole source matrices."""
    cmds, subs, mats = c.commands, c.submatrices, c.matrices
    copies = []
    MC, SWAP, GOTO = CT.MATRIX_COPY, CT.SWAP_MATRIX, CT.GOTO_LABEL
    for i, cmd in enumerate(cmds):
        t = cmd.type
        if t is MC:
            if cmd.alpha == 1.0:
                copies.append(i)
        elif t is SWAP or t is GOTO:
            return ""  # Kaldi runs this before such commands exist
    if not copies:
        return ""
    orig_rows = [m.rows for m in mats]
    table = None  # built for the first copy that passes the cheap tests
    extended = 0
    for i in copies:
        cmd = cmds[i]
        d, s = subs[cmd.dst], subs[cmd.src]
        src_rows = mats[s.matrix].rows
        if not (s.row_offset == 0 and s.num_rows < src_rows) or d.matrix == s.matrix:
            continue  # most copies read a whole matrix
        if s.num_rows < _MIN_PROPORTION * orig_rows[s.matrix]:
            continue
        if not (s.col_offset == 0 and s.num_cols == mats[s.matrix].cols
                and d.row_offset + d.num_rows == orig_rows[d.matrix]):
            continue
        if table is None:
            table = build_access_table(c, nnet)
            is_io = (table.is_input | table.is_output).tolist()
            is_input = table.is_input.tolist()
            # first access of each matrix (-1: none); the table is in command order
            first = np.full(len(mats), -1, dtype=np.int64)
            ms, pos = np.unique(table.matrix, return_index=True)
            first[ms] = table.cmd[pos]
            first = first.tolist()
        if is_io[d.matrix]:
            continue
        if not _rows_defined(c, is_input[s.matrix], first[s.matrix], s.matrix,
                             orig_rows[s.matrix], i):
            continue
        info = mats[d.matrix]
        new_rows = d.row_offset + src_rows
        if new_rows > info.rows:
            info.rows = new_rows
        cmd.dst = c.new_submatrix(d.matrix, d.row_offset, src_rows, d.col_offset, d.num_cols)
        cmd.src = c.whole(s.matrix) if _is_whole(c, c.whole(s.matrix)) else \
            c.new_submatrix(s.matrix, 0, src_rows, 0, mats[s.matrix].cols)
        extended += 1
    if not extended:
        return ""
    _fix(c, orig_rows, table)
    return f"extended {extended} copies to whole source matrices"


def _is_whole(c: NnetComputation, s: int) -> bool:
    sm = c.submatrices[s]
    info = c.matrices[sm.matrix]
    return sm.row_offset == 0 and sm.col_offset == 0 and sm.num_rows == info.rows \
        and sm.num_cols == info.cols


def _rows_defined(c: NnetComputation, is_input: bool, first: int, matrix: int,
                  orig_rows: int, i: int) -> bool:
    """Whether every row of ``matrix`` holds defined data at command ``i``: it is a
    user input, or its first access ``first`` (before ``i``) sets all of it (the
    zeroing after allocation; :func:`_fix` makes that cover rows the matrix grows by)."""
    if is_input:
        return True
    if first == -1 or first >= i:
        return False
    cmd = c.commands[first]
    if cmd.type is not CT.SET_CONST:
        return False
    sm = c.submatrices[cmd.dst]
    return sm.row_offset == 0 and sm.col_offset == 0 and sm.num_rows == orig_rows \
        and sm.num_cols == c.matrices[matrix].cols


def _fix(c: NnetComputation, orig_rows: list[int], table: AccessTable) -> None:
    """Whole-matrix submatrices, zeroings and debug indexes of grown matrices
    (``table``: the access table from before they grew)."""
    grown = {m for m, (info, rows) in enumerate(zip(c.matrices, orig_rows, strict=True))
             if m and info.rows != rows}
    for m in grown:  # (in set order: it numbers the new submatrices)
        info = c.matrices[m]
        c._whole[m] = c.new_submatrix(m, 0, info.rows, 0, info.cols)
        if info.indexes is not None:
            old = info.indexes
            extra = info.rows - len(old)
            # repeat the last rows with no time (Kaldi's FixDebugInfo); extra <= rows/4
            new_rows = old[len(old) - extra:].copy()
            new_rows[:, 1] = NO_TIME
            info.indexes = np.concatenate([old, new_rows])
    # zeroings (SET_CONST 0, one table entry each) of all of a grown matrix as it was
    zi = np.flatnonzero(table.zeroing)
    sa = table.sub_array[table.sub[np.searchsorted(table.cmd, zi)]]
    whole_before = np.full((len(orig_rows), 5), -1, dtype=np.int64)
    for m in grown:
        whole_before[m] = (m, 0, orig_rows[m], 0, c.matrices[m].cols)
    sel = (sa == whole_before[sa[:, 0]]).all(axis=1)
    for i, m in zip(zi[sel].tolist(), sa[sel, 0].tolist(), strict=True):
        c.commands[i].dst = c._whole[m]
