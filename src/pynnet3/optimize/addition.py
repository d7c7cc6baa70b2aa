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

from ..analysis.accesses import AccessTable, AccessType, build_access_table, command_types
from ..computation import CommandType as CT
from ..computation import NnetComputation
from .options import OptimizeOptions

_TO_COPY = {CT.MATRIX_ADD: CT.MATRIX_COPY, CT.ADD_ROWS: CT.COPY_ROWS,
            CT.ADD_ROWS_MULTI: CT.COPY_ROWS_MULTI, CT.ADD_TO_ROWS_MULTI: CT.COPY_TO_ROWS_MULTI}
_W = int(AccessType.WRITE)


def _first_used_there(t: AccessTable, cmd: np.ndarray, sub: np.ndarray) -> np.ndarray:
    """For each pair (command ``cmd[p]``, submatrix ``sub[p]``): whether the first
    access overlapping the submatrix that is not a zeroing is that command.

    Vectorized over the pairs: for each pair, the non-zeroing table entries of its
    matrix up to its command (entries sorted by matrix, then command) are tested
    for overlap with its rectangle, and the first overlapping one must be it."""
    sa = t.sub_array
    keep = ~t.zeroing[t.cmd]
    em, ec, es = t.matrix[keep], t.cmd[keep], t.sub[keep]
    n = t.num_commands + 1
    key = em * n + ec
    order = np.argsort(key, kind="stable")
    key, ec, es = key[order], ec[order], es[order]
    pm = sa[sub, 0]
    lo = np.searchsorted(key, pm * n)
    hi = np.searchsorted(key, pm * n + cmd, side="right")
    lens = hi - lo
    total = int(lens.sum())
    if not total:
        return np.zeros(len(cmd), dtype=bool)
    pair = np.repeat(np.arange(len(cmd)), lens)
    ends = np.cumsum(lens)
    idx = np.arange(total) + np.repeat(lo - (ends - lens), lens)
    r0, c0 = sa[sub, 1], sa[sub, 3]
    r1, c1 = r0 + sa[sub, 2], c0 + sa[sub, 4]
    e = sa[es[idx]]
    e0, f0 = e[:, 1], e[:, 3]
    over = (e0 < r1[pair]) & (r0[pair] < e0 + e[:, 2]) & (f0 < c1[pair]) & (c0[pair] < f0 + e[:, 4])
    first = np.full(len(cmd), -1, dtype=np.int64)
    some = lens > 0
    # entries come in command order within a pair: the least overlapping command
    first[some] = np.minimum.reduceat(np.where(over, ec[idx], n), (ends - lens)[some])
    return first == cmd


def convert_addition_to_assignment(c: NnetComputation, nnet, options: OptimizeOptions) -> str:
    """Turn additions into a region that only zeroing touched before into copies."""
    types = command_types(c)
    present = [t for t in _TO_COPY if t in types]  # scans in C
    if not present:
        return ""
    adds = [i for i, t in enumerate(types) if t in present]
    t = build_access_table(c, nnet)
    is_add = np.zeros(len(types), dtype=bool)
    is_add[adds] = True
    # (addition, submatrix it writes) pairs
    w = np.flatnonzero(is_add[t.cmd] & ((t.acc & _W) != 0))
    wc = t.cmd[w]
    ok = _first_used_there(t, wc, t.sub[w])
    writes = np.bincount(wc, minlength=len(types))
    fails = np.bincount(wc[~ok], minlength=len(types))
    converted = 0
    for i in adds:
        if not writes[i] or fails[i]:
            continue
        cmd = c.commands[i]
        if cmd.type is CT.ADD_TO_ROWS_MULTI and not _scatter_targets_unique(c, cmd):
            continue  # a copy would keep one of several sums into one row
        cmd.type = _TO_COPY[cmd.type]
        converted += 1
    return f"converted {converted} additions to copies" if converted else ""


def _scatter_targets_unique(c: NnetComputation, cmd) -> bool:
    tab = c.indexes_multi[cmd.table]
    tab = tab[tab[:, 0] >= 0]
    return len(np.unique(tab, axis=0)) == len(tab)
