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

from itertools import compress, count, repeat
from operator import attrgetter, is_

import numpy as np

from ..analysis.accesses import build_access_table
from ..computation import CommandType as CT
from ..computation import NnetComputation
from .options import OptimizeOptions

_MIN_PROPORTION = 0.8
NO_TIME = int(np.iinfo(np.int32).min)
_TYPE = attrgetter("type")


def _positions(types: list, t: CT) -> list[int]:
    """Indexes of the commands of type ``t`` (``types``: every command's type; the
    scan runs in C)."""
    return list(compress(count(), map(is_, types, repeat(t))))


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
    types = None  # every command's type, with the user input / output matrices (as
    # the access table's is_input / is_output), for the first copy that passes the
    # cheap tests
    table = None  # built only when the zeroing after allocation does not tell
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
        if types is None:
            types = list(map(_TYPE, cmds))
            inputs = {subs[cmds[j].dst].matrix for j in _positions(types, CT.ACCEPT_INPUT)}
            outputs = {subs[cmds[j].src].matrix for j in _positions(types, CT.PROVIDE_OUTPUT)}
            alloc_at = {cmds[j].matrix: j for j in _positions(types, CT.ALLOC_MATRIX)}
        if d.matrix in inputs or d.matrix in outputs:
            continue
        # Usually the command right after the source's allocation zeroes all of it:
        # that is then its first access (a valid computation allocates a matrix
        # once, before any use), so the access table need not be built.
        if not (s.matrix in inputs
                or _sets_all(c, alloc_at.get(s.matrix, -2) + 1, s.matrix,
                             orig_rows[s.matrix], i)):
            if table is None:
                table = build_access_table(c, nnet)
                # first access of each matrix (-1: none); the table is in command order
                first = np.full(len(mats), -1, dtype=np.int64)
                ms, pos = np.unique(table.matrix, return_index=True)
                first[ms] = table.cmd[pos]
                first = first.tolist()
            if not _sets_all(c, first[s.matrix], s.matrix, orig_rows[s.matrix], i):
                continue
        info = mats[d.matrix]
        new_rows = d.row_offset + src_rows
        if new_rows > info.rows:
            info.rows = new_rows
        cmd.dst = c.new_submatrix(d.matrix, d.row_offset, src_rows, d.col_offset, d.num_cols)
        cmd.src = c.whole(s.matrix) if c.is_whole(c.whole(s.matrix)) else \
            c.new_submatrix(s.matrix, 0, src_rows, 0, mats[s.matrix].cols)
        extended += 1
    if not extended:
        return ""
    _fix(c, orig_rows, [j for j in _positions(types, CT.SET_CONST) if cmds[j].alpha == 0.0])
    return f"extended {extended} copies to whole source matrices"


def _sets_all(c: NnetComputation, j: int, matrix: int, orig_rows: int, i: int) -> bool:
    """Whether command ``j`` (before ``i``; -1: none) sets every row of ``matrix`` (a
    SET_CONST over all of it as it was; :func:`_fix` makes that cover rows the
    matrix grows by). Called with the matrix's first access, this says its rows
    hold defined data at command ``i``."""
    if not 0 <= j < i:
        return False
    cmd = c.commands[j]
    if cmd.type is not CT.SET_CONST:
        return False
    sm = c.submatrices[cmd.dst]
    return sm.matrix == matrix and sm.row_offset == 0 and sm.col_offset == 0 \
        and sm.num_rows == orig_rows and sm.num_cols == c.matrices[matrix].cols


def _fix(c: NnetComputation, orig_rows: list[int], zeroings: list[int]) -> None:
    """Whole-matrix submatrices, zeroings and debug indexes of grown matrices
    (``zeroings``: the SET_CONST 0 commands)."""
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
    # zeroings of all of a grown matrix as it was
    cmds, subs, mats = c.commands, c.submatrices, c.matrices
    for i in zeroings:
        cmd = cmds[i]
        sm = subs[cmd.dst]
        m = sm.matrix
        if m in grown and sm.row_offset == 0 and sm.num_rows == orig_rows[m] \
                and sm.col_offset == 0 and sm.num_cols == mats[m].cols:
            cmd.dst = c._whole[m]
