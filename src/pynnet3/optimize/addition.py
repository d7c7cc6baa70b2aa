"""Addition to assignment (Kaldi's ConvertAdditionToAssignment).

An adding command (``MATRIX_ADD``, ``ADD_ROWS``, ``ADD_ROWS_MULTI``,
``ADD_TO_ROWS_MULTI``) whose destination held nothing but the zeros of its
initialization (the command is the first access to every written region that is
not a zeroing) computes ``0 + x``: it becomes the copying version. Copies are
cheaper, and they let variable merging remove the assignment and the zeroing
pass drop the zeroing.
"""

from __future__ import annotations

import numpy as np

from ..analysis.accesses import (
    AccessType,
    build_access_table,
    command_accesses,
    command_types,
    has_command_type,
)
from ..computation import CommandType as CT
from ..computation import NnetComputation
from .options import OptimizeOptions

_TO_COPY = {CT.MATRIX_ADD: CT.MATRIX_COPY, CT.ADD_ROWS: CT.COPY_ROWS,
            CT.ADD_ROWS_MULTI: CT.COPY_ROWS_MULTI, CT.ADD_TO_ROWS_MULTI: CT.COPY_TO_ROWS_MULTI}
_ADDS = tuple(_TO_COPY)


class _FirstUse:
    """First non-zeroing access overlapping a submatrix, from the access table; a
    matrix's entries (command order) are listed only when one of its submatrices
    is asked about."""

    def __init__(self, c: NnetComputation, nnet):
        t = build_access_table(c, nnet)
        self.c, self.t = c, t
        ent_m = t.matrix
        self.order = np.argsort(ent_m, kind="stable")
        ptr = np.zeros(len(c.matrices) + 1, dtype=np.int64)
        np.cumsum(np.bincount(ent_m, minlength=len(c.matrices)), out=ptr[1:])
        self.ptr = ptr.tolist()
        self.lists: dict[int, list] = {}
        self.n = len(c.commands)

    def _entries(self, m: int) -> list:
        got = self.lists.get(m)
        if got is None:
            t, sa = self.t, self.t.sub_array
            k = self.order[self.ptr[m]:self.ptr[m + 1]]
            sub, cmd = t.sub[k], t.cmd[k]
            keep = ~t.zeroing[cmd]
            sub, cmd = sub[keep], cmd[keep]
            r0, c0 = sa[sub, 1], sa[sub, 3]
            got = self.lists[m] = list(zip(cmd.tolist(), r0.tolist(), (r0 + sa[sub, 2]).tolist(),
                                           c0.tolist(), (c0 + sa[sub, 4]).tolist(),
                                           strict=True))
        return got

    def first_nontrivial_sub(self, s: int) -> int:
        """First command touching submatrix ``s`` other than a zeroing (n if none)."""
        sm = self.c.submatrices[s]
        r0, r1 = sm.row_offset, sm.row_offset + sm.num_rows
        c0, c1 = sm.col_offset, sm.col_offset + sm.num_cols
        for i, e0, e1, f0, f1 in self._entries(sm.matrix):
            if e0 < r1 and r0 < e1 and f0 < c1 and c0 < f1:
                return i
        return self.n


def convert_addition_to_assignment(c: NnetComputation, nnet, options: OptimizeOptions) -> str:
    """Turn additions into a region that only zeroing touched before into copies."""
    if not has_command_type(c, *_TO_COPY):
        return ""
    first = _FirstUse(c, nnet)
    converted = 0
    types = command_types(c)
    adds = [i for i, t in enumerate(types) if t in _ADDS]
    for i in adds:
        cmd = c.commands[i]
        new = _TO_COPY[cmd.type]
        if cmd.type is CT.ADD_TO_ROWS_MULTI and not _scatter_targets_unique(c, cmd):
            continue  # a copy would keep one of several sums into one row
        written = [s for s, a in command_accesses(c, nnet, cmd) if a & AccessType.WRITE]
        if written and all(first.first_nontrivial_sub(s) == i for s in written):
            cmd.type = new
            converted += 1
    return f"converted {converted} additions to copies" if converted else ""


def _scatter_targets_unique(c: NnetComputation, cmd) -> bool:
    tab = c.indexes_multi[cmd.table]
    tab = tab[tab[:, 0] >= 0]
    return len(np.unique(tab, axis=0)) == len(tab)
