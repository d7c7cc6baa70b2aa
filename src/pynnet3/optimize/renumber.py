"""Drop no-op commands and everything no command refers to, renumbering the rest.

Kaldi's RemoveNoOps + RenumberComputation: after a pass has turned commands into
``NO_OPERATION`` or stopped using matrices, submatrices, index tables or
precomputed indexes, they are removed and the survivors renumbered in order.
Identical submatrices are merged. Matrix 0 / submatrix 0 / precomputed 0 keep
meaning "none". Input and output matrices named by I/O commands are referenced,
so they are kept.

The driver calls this after every pass that changed something, so it is written
to cost one pass over the commands to read their ids and one to write back the
ids that changed; everything in between is numpy over all ids at once. Inside the
driver's analysis session (:mod:`pynnet3.analysis.session`) the submatrix array
is read only where submatrices changed, and the renumbered one is left there for
the next pass's analysis.
"""

from __future__ import annotations

from collections import deque
from itertools import chain
from operator import attrgetter

import numpy as np

from ..analysis.session import current_session, read_submatrices
from ..analysis.variables import matrix_sizes, submatrix_array
from ..computation import SUBMATRIX_FIELDS, NnetComputation, replaced_submatrix
from ..computation import CommandType as CT

_SUB_FIELDS = SUBMATRIX_FIELDS
#: the fields read into the id array's columns (submatrices, matrices, table, precomputed)
_ID_FIELDS = (*_SUB_FIELDS, "matrix", "src_matrix", "table", "precomputed")
_ROWS_TABLE = (CT.COPY_ROWS, CT.ADD_ROWS)
_MULTI_TABLE = (CT.COPY_ROWS_MULTI, CT.ADD_ROWS_MULTI, CT.COPY_TO_ROWS_MULTI,
                CT.ADD_TO_ROWS_MULTI)
_PRE = (CT.PROPAGATE, CT.BACKPROP, CT.BACKPROP_NO_MODEL_UPDATE)
_READ = attrgetter(*_ID_FIELDS)
_NREAD = 10


def _table_kind(t: CT) -> int:
    """What kind of table a command type names when its ``table`` is set: 0 none,
    1 rows, 2 multi, 3 ranges, 4 input blocks (a propagate or backprop)."""
    if t in _ROWS_TABLE:
        return 1
    if t in _MULTI_TABLE:
        return 2
    if t in _PRE:  # a component command's table: its input blocks
        return 4
    return 3 if t is CT.ADD_ROW_RANGES else 0


def _first_occurrences(arr: np.ndarray) -> np.ndarray:
    """For each row of ``arr``, the index of the first row equal to it."""
    n = len(arr)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort(arr.T[::-1])  # stable: equal rows keep their order
    srt = arr[order]
    start = np.ones(n, dtype=bool)
    start[1:] = (srt[1:] != srt[:-1]).any(axis=1)
    group = np.cumsum(start) - 1
    first = order[start][group]
    out = np.empty(n, dtype=np.int64)
    out[order] = first
    return out


def drop_noops(c: NnetComputation) -> None:
    """In place: remove NO_OPERATION commands (and nothing else)."""
    NOOP = CT.NO_OPERATION
    c.commands = [cmd for cmd in c.commands if cmd.type is not NOOP]


def renumber(c: NnetComputation) -> None:
    """In place: remove NO_OPERATION commands and unreferenced objects."""
    NOOP = CT.NO_OPERATION
    c.commands = cmds = [cmd for cmd in c.commands if cmd.type is not NOOP]
    n = len(cmds)
    ids = np.fromiter(chain.from_iterable(map(_READ, cmds)), dtype=np.int64,
                      count=_NREAD * n).reshape(n, _NREAD)
    fields, mats_named = ids[:, :6], ids[:, 6:8]

    # tables and precomputed indexes the commands name (only commands with a table
    # / precomputed field set can name one)
    # -, rows, multi, ranges, blocks
    used_tab: tuple[set, ...] = (set(), set(), set(), set(), set())
    used_pre: set[int] = set()
    table_cmds: list[tuple[int, int, int]] = []  # (command, table kind, table)
    for i in np.flatnonzero(ids[:, 8] != -1).tolist():
        cmd = cmds[i]
        k = _table_kind(cmd.type)
        if k:
            used_tab[k].add(cmd.table)
            table_cmds.append((i, k, cmd.table))
    pre_cmds = np.flatnonzero(ids[:, 9] != 0).tolist()
    for i in pre_cmds:
        cmd = cmds[i]
        if cmd.type in _PRE:
            used_pre.add(cmd.precomputed)
    used_rows, used_multi, used_ranges, used_blocks = used_tab[1:]

    # submatrices: those commands name, plus those named inside multi tables
    ns = len(c.submatrices)
    used_sub = np.zeros(ns, dtype=bool)
    used_sub[fields.ravel()] = True
    for k in used_multi:
        subs = c.indexes_multi[k][:, 0]
        used_sub[subs[subs > 0]] = True
    for k in used_blocks:
        used_sub[c.indexes_blocks[k]] = True
    used_sub[0] = True

    # merge identical submatrices (first occurrence wins)
    sa = submatrix_array(c)
    used_idx = np.flatnonzero(used_sub)
    first = _first_occurrences(sa[used_idx])
    is_first = first == np.arange(len(used_idx))
    new_id = np.cumsum(is_first) - 1
    sub_map = np.zeros(ns, dtype=np.int64)
    sub_map[used_idx] = new_id[first]
    kept = used_idx[is_first]  # old ids of the surviving submatrices, in order

    # matrices: those a kept submatrix or a sizing command names
    used_mat = np.zeros(len(c.matrices), dtype=bool)
    used_mat[sa[kept, 0]] = True
    used_mat[mats_named.ravel()] = True
    used_mat[0] = True
    mat_map = np.cumsum(used_mat) - 1
    if not used_mat.all():
        c.matrices = [m for m, u in zip(c.matrices, used_mat.tolist(), strict=True) if u]
    old_subs = c.submatrices
    new_mat = mat_map[sa[kept, 0]]
    moved = new_mat != sa[kept, 0]
    new_subs = list(map(old_subs.__getitem__, kept.tolist()))
    if moved.any():
        for j, m in zip(np.flatnonzero(moved).tolist(), new_mat[moved].tolist(), strict=True):
            new_subs[j] = replaced_submatrix(new_subs[j], {"matrix": m})
    c.submatrices = new_subs

    # the whole-matrix submatrix of each matrix: the first such one, else a new one
    nsa = sa[kept]
    nsa[:, 0] = new_mat
    rows, cols = matrix_sizes(c).T
    whole = (nsa[:, 1] == 0) & (nsa[:, 3] == 0) & (nsa[:, 2] == rows[nsa[:, 0]]) \
        & (nsa[:, 4] == cols[nsa[:, 0]])
    whole[0] = False
    w_idx = np.flatnonzero(whole)
    w_mat = nsa[w_idx, 0]
    _, first_w = np.unique(w_mat, return_index=True)
    first_w = np.sort(first_w)
    c._whole = dict(zip(w_mat[first_w].tolist(), w_idx[first_w].tolist(), strict=True))
    if len(c._whole) < len(c.matrices) - 1:
        for m in range(1, len(c.matrices)):
            if m not in c._whole:
                c._whole[m] = c.new_submatrix(m, 0, c.matrices[m].rows, 0, c.matrices[m].cols)
    session = current_session(c)
    if session is not None:  # the next analysis need not read the submatrices again
        if len(c.submatrices) > len(nsa):
            nsa = np.concatenate([nsa, read_submatrices(c.submatrices[len(nsa):])])
        session.remember_submatrix_array(c.submatrices, nsa)

    def remap(tables, used):
        order = sorted(used)
        new = {old: i for i, old in enumerate(order)}
        if len(order) == len(tables):  # all used: keep the list
            return tables, new
        return [tables[k] for k in order], new

    c.indexes, rows_map = remap(c.indexes, used_rows)
    c.indexes_multi, multi_map = remap(c.indexes_multi, used_multi)
    c.indexes_ranges, ranges_map = remap(c.indexes_ranges, used_ranges)
    c.indexes_blocks, blocks_map = remap(c.indexes_blocks, used_blocks)
    identity_subs = len(kept) == ns
    if not identity_subs:
        c.indexes_blocks = [sub_map[tab] for tab in c.indexes_blocks]
        c.indexes_multi = list(c.indexes_multi)
        for k, tab in enumerate(c.indexes_multi):
            subs = tab[:, 0]
            pos = subs > 0
            if pos.any():
                tab = tab.copy()
                tab[pos, 0] = sub_map[subs[pos]]
                c.indexes_multi[k] = tab
    pre_order = sorted(used_pre)
    pre_map = {old: i + 1 for i, old in enumerate(pre_order)}
    identity_pre = pre_order == list(range(1, len(c.precomputed)))
    c.precomputed = [None] + [c.precomputed[k] for k in pre_order]

    # write back the ids that changed (command by command, for memory locality;
    # setattr mapped over them, without a Python-level loop body)
    old_ids = ids[:, :8]
    new_ids = np.concatenate([sub_map[fields], mat_map[mats_named]], axis=1)
    rows_, cols_ = np.nonzero(new_ids != old_ids)
    deque(map(setattr, map(cmds.__getitem__, rows_.tolist()),
              map(_ID_FIELDS.__getitem__, cols_.tolist()), new_ids[rows_, cols_].tolist()),
          maxlen=0)
    maps = (None, rows_map, multi_map, ranges_map, blocks_map)
    for i, k, t in table_cmds:
        if maps[k][t] != t:
            cmds[i].table = maps[k][t]
    if not identity_pre:
        for i in pre_cmds:
            cmd = cmds[i]
            cmd.precomputed = pre_map[cmd.precomputed]
