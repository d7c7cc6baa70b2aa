"""Drop no-op commands and everything no command refers to, renumbering the rest.

Kaldi's RemoveNoOps + RenumberComputation: after a pass has turned commands into
``NO_OPERATION`` or stopped using matrices, submatrices, index tables or
precomputed indexes, they are removed and the survivors renumbered in order.
Identical submatrices are merged. Matrix 0 / submatrix 0 / precomputed 0 keep
meaning "none". Input and output matrices named by I/O commands are referenced,
so they are kept.
"""

from __future__ import annotations

import numpy as np

from ..computation import CommandType as CT
from ..computation import NnetComputation

_SUB_FIELDS = ("dst", "src", "in_value", "out_value", "out_deriv", "in_deriv")
_ROWS_TABLE = (CT.COPY_ROWS, CT.ADD_ROWS)
_MULTI_TABLE = (CT.COPY_ROWS_MULTI, CT.ADD_ROWS_MULTI, CT.COPY_TO_ROWS_MULTI,
                CT.ADD_TO_ROWS_MULTI)


def renumber(c: NnetComputation) -> None:
    """In place: remove NO_OPERATION commands and unreferenced objects."""
    c.commands = [cmd for cmd in c.commands if cmd.type is not CT.NO_OPERATION]

    # submatrices: those commands name, plus those named inside multi tables
    used_sub = np.zeros(len(c.submatrices), dtype=bool)
    used_multi = set()
    used_rows = set()
    used_ranges = set()
    used_pre = set()
    for cmd in c.commands:
        for f in _SUB_FIELDS:
            s = getattr(cmd, f)
            if s:
                used_sub[s] = True
        t = cmd.type
        if t in _ROWS_TABLE:
            used_rows.add(cmd.table)
        elif t in _MULTI_TABLE:
            used_multi.add(cmd.table)
        elif t is CT.ADD_ROW_RANGES:
            used_ranges.add(cmd.table)
        elif t is CT.PROPAGATE or t in (CT.BACKPROP, CT.BACKPROP_NO_MODEL_UPDATE):
            if cmd.precomputed:
                used_pre.add(cmd.precomputed)
    for k in used_multi:
        subs = c.indexes_multi[k][:, 0]
        used_sub[subs[subs > 0]] = True
    used_sub[0] = True

    # merge identical submatrices (first occurrence wins)
    sub_map = np.zeros(len(c.submatrices), dtype=np.int64)
    new_subs = [c.submatrices[0]]
    seen = {c.submatrices[0]: 0}
    for s in range(1, len(c.submatrices)):
        if not used_sub[s]:
            continue
        sm = c.submatrices[s]
        if sm in seen:
            sub_map[s] = seen[sm]
        else:
            seen[sm] = len(new_subs)
            sub_map[s] = len(new_subs)
            new_subs.append(sm)

    # matrices: those a kept submatrix or a sizing command names
    used_mat = np.zeros(len(c.matrices), dtype=bool)
    for sm in new_subs[1:]:
        used_mat[sm.matrix] = True
    for cmd in c.commands:
        if cmd.matrix:
            used_mat[cmd.matrix] = True
        if cmd.src_matrix:
            used_mat[cmd.src_matrix] = True
    used_mat[0] = True
    mat_map = np.cumsum(used_mat) - 1
    c.matrices = [m for m, u in zip(c.matrices, used_mat, strict=True) if u]
    c.submatrices = [sm if i == 0 else type(sm)(int(mat_map[sm.matrix]), sm.row_offset,
                                                 sm.num_rows, sm.col_offset, sm.num_cols)
                     for i, sm in enumerate(new_subs)]
    c._whole = {}
    for i, sm in enumerate(c.submatrices):
        if i == 0:
            continue
        info = c.matrices[sm.matrix]
        if sm.row_offset == 0 and sm.col_offset == 0 and sm.num_rows == info.rows \
                and sm.num_cols == info.cols and sm.matrix not in c._whole:
            c._whole[sm.matrix] = i
    for m in range(1, len(c.matrices)):
        if m not in c._whole:
            c._whole[m] = c.new_submatrix(m, 0, c.matrices[m].rows, 0, c.matrices[m].cols)

    def remap(tables, used):
        order = sorted(used)
        new = {old: i for i, old in enumerate(order)}
        return [tables[k] for k in order], new

    c.indexes, rows_map = remap(c.indexes, used_rows)
    c.indexes_multi, multi_map = remap(c.indexes_multi, used_multi)
    c.indexes_ranges, ranges_map = remap(c.indexes_ranges, used_ranges)
    for k, tab in enumerate(c.indexes_multi):
        subs = tab[:, 0]
        if np.any(subs > 0):
            tab = tab.copy()
            pos = subs > 0
            tab[pos, 0] = sub_map[subs[pos]]
            c.indexes_multi[k] = tab
    pre_order = sorted(used_pre)
    pre_map = {old: i + 1 for i, old in enumerate(pre_order)}
    c.precomputed = [None] + [c.precomputed[k] for k in pre_order]

    for cmd in c.commands:
        for f in _SUB_FIELDS:
            s = getattr(cmd, f)
            if s:
                setattr(cmd, f, int(sub_map[s]))
        if cmd.matrix:
            cmd.matrix = int(mat_map[cmd.matrix])
        if cmd.src_matrix:
            cmd.src_matrix = int(mat_map[cmd.src_matrix])
        t = cmd.type
        if t in _ROWS_TABLE:
            cmd.table = rows_map[cmd.table]
        elif t in _MULTI_TABLE:
            cmd.table = multi_map[cmd.table]
        elif t is CT.ADD_ROW_RANGES:
            cmd.table = ranges_map[cmd.table]
        if cmd.precomputed:
            cmd.precomputed = pre_map[cmd.precomputed]
