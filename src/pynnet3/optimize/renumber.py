"""Drop no-op commands and everything no command refers to, renumbering the rest.

Kaldi's RemoveNoOps + RenumberComputation: after a pass has turned commands into
``NO_OPERATION`` or stopped using matrices, submatrices, index tables or
precomputed indexes, they are removed and the survivors renumbered in order.
Identical submatrices are merged. Matrix 0 / submatrix 0 / precomputed 0 keep
meaning "none". Input and output matrices named by I/O commands are referenced,
so they are kept.

The driver calls this after every pass that changed something, so it is written
to cost one C-level pass over the command types, one that reads only the id fields
each command's type uses and one that writes back the ids that changed;
everything in between is numpy over all ids at once. Inside the
driver's analysis session (:mod:`pynnet3.analysis.session`) the submatrix array
is read only where submatrices changed, and the renumbered one is left there for
the next pass's analysis.
"""

from __future__ import annotations

from collections import deque
from itertools import chain, compress
from operator import attrgetter

import numpy as np

from ..analysis.session import current_session, read_submatrices
from ..analysis.variables import matrix_sizes, submatrix_array
from ..computation import SUBMATRIX_FIELDS, Command, NnetComputation, make_submatrix
from ..computation import CommandType as CT

#: the id fields, in the columns of the id array renumbering reads them into
_ID_FIELDS = (*SUBMATRIX_FIELDS, "matrix", "src_matrix", "table", "precomputed",
              "deriv_table")
_COL = {f: j for j, f in enumerate(_ID_FIELDS)}
_TABLE, _PRECOMPUTED, _DERIV_TABLE = _COL["table"], _COL["precomputed"], _COL["deriv_table"]
# what a command's ``table`` names: nothing, or an index into one of these lists
_NO_TABLE, _ROWS, _MULTI, _RANGES, _BLOCKS = range(5)
_TABLE_LISTS = ("indexes", "indexes_multi", "indexes_ranges", "indexes_blocks")
_COMPONENT = ("in_value", "out_value", "out_deriv", "in_deriv", "table", "precomputed",
              "deriv_table")  # (deriv_table: a block table too)
#: command types by the id fields they use and the table kind their ``table`` names.
#: Command's contract: a field a type does not use stays at its default, so only
#: these are read (tests/optimize/test_renumber.py checks real pipelines).
#: Group 0, NO_OPERATION, is dropped.
_GROUPS: tuple[tuple[tuple[CT, ...], tuple[str, ...], int], ...] = (
    ((CT.NO_OPERATION,), (), _NO_TABLE),
    ((CT.ALLOC_MATRIX, CT.DEALLOC_MATRIX), ("matrix",), _NO_TABLE),
    ((CT.SWAP_MATRIX,), ("matrix", "src_matrix"), _NO_TABLE),
    ((CT.SET_CONST, CT.ACCEPT_INPUT), ("dst",), _NO_TABLE),
    ((CT.PROVIDE_OUTPUT,), ("src",), _NO_TABLE),
    ((CT.MATRIX_COPY, CT.MATRIX_ADD), ("dst", "src"), _NO_TABLE),
    ((CT.COMPRESS_MATRIX, CT.DECOMPRESS_MATRIX), ("dst", "matrix"), _NO_TABLE),
    ((CT.COPY_ROWS, CT.ADD_ROWS), ("dst", "src", "table"), _ROWS),
    ((CT.ADD_ROW_RANGES,), ("dst", "src", "table"), _RANGES),
    ((CT.COPY_ROWS_MULTI, CT.ADD_ROWS_MULTI), ("dst", "table"), _MULTI),
    ((CT.COPY_TO_ROWS_MULTI, CT.ADD_TO_ROWS_MULTI), ("src", "table"), _MULTI),
    ((CT.PROPAGATE, CT.BACKPROP, CT.BACKPROP_NO_MODEL_UPDATE), _COMPONENT, _BLOCKS),
    ((CT.NO_OPERATION_PERMANENT, CT.NO_OPERATION_MARKER, CT.NO_OPERATION_LABEL,
      CT.GOTO_LABEL), (), _NO_TABLE),
)
_GROUP_OF = {t: g for g, (types, _, _) in enumerate(_GROUPS) for t in types}
_READERS = tuple((attrgetter(*fields), [_COL[f] for f in fields]) if fields else None
                 for _, fields, _ in _GROUPS)
_TABLE_KIND = np.array([kind for _, _, kind in _GROUPS], dtype=np.int8)
_TYPE = attrgetter("type")


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


def _read_ids(c: NnetComputation) -> tuple[list[Command], np.ndarray, np.ndarray]:
    """Drop the NO_OPERATION commands; return the rest, their ``(n, 11)`` id array
    (columns as ``_ID_FIELDS``; a field the type does not use at its default) and
    each one's table kind. One C-level pass reads the types; then each group of
    types has only the fields it uses read."""
    cmds = c.commands
    group = np.fromiter(map(_GROUP_OF.__getitem__, map(_TYPE, cmds)), dtype=np.int8,
                        count=len(cmds))
    keep = group != 0
    if not keep.all():
        c.commands = cmds = list(compress(cmds, keep.tolist()))
        group = group[keep]
    n = len(cmds)
    ids = np.zeros((n, len(_ID_FIELDS)), dtype=np.int64)
    ids[:, _TABLE] = -1
    ids[:, _DERIV_TABLE] = -1
    order = np.argsort(group, kind="stable")
    ends = np.cumsum(np.bincount(group, minlength=len(_GROUPS))).tolist()
    at = cmds.__getitem__
    for g, end in enumerate(ends):
        begin = ends[g - 1] if g else 0
        reader = _READERS[g]
        if begin == end or reader is None:
            continue
        rows = order[begin:end]
        read, cols = reader
        objs = map(at, rows.tolist())
        if len(cols) == 1:
            ids[rows, cols[0]] = np.fromiter(map(read, objs), dtype=np.int64, count=end - begin)
        else:
            ids[rows[:, None], cols] = np.fromiter(
                chain.from_iterable(map(read, objs)), dtype=np.int64,
                count=(end - begin) * len(cols)).reshape(-1, len(cols))
    return cmds, ids, _TABLE_KIND[group]


def drop_noops(c: NnetComputation) -> None:
    """In place: remove NO_OPERATION commands (and nothing else)."""
    NOOP = CT.NO_OPERATION
    c.commands = [cmd for cmd in c.commands if cmd.type is not NOOP]


def renumber(c: NnetComputation) -> None:
    """In place: remove NO_OPERATION commands and unreferenced objects."""
    cmds, ids, kind = _read_ids(c)
    fields, mats_named = ids[:, :6], ids[:, 6:8]
    table, pre = ids[:, _TABLE], ids[:, _PRECOMPUTED]

    # tables of each kind and precomputed indexes the commands name, ascending (few
    # commands have a table: sets beat numpy's fixed costs)
    at = np.flatnonzero(table != -1)
    used: tuple[set[int], ...] = tuple(set() for _ in range(len(_TABLE_LISTS) + 1))
    for k, t in zip(kind[at].tolist(), table[at].tolist(), strict=True):
        used[k].add(t)
    deriv_table = ids[:, _DERIV_TABLE]
    deriv_at = np.flatnonzero(deriv_table != -1)
    used[_BLOCKS].update(deriv_table[deriv_at].tolist())
    named_table = [np.array(sorted(u), dtype=np.int64) for u in used]  # [k]: of kind k
    used_pre = np.array(sorted(set(pre[pre != 0].tolist())), dtype=np.int64)

    # submatrices: those commands name, plus those named inside multi tables
    ns = len(c.submatrices)
    used_sub = np.zeros(ns, dtype=bool)
    used_sub[fields.ravel()] = True
    for k in named_table[_MULTI].tolist():
        subs = c.indexes_multi[k][:, 0]
        used_sub[subs[subs > 0]] = True
    for k in named_table[_BLOCKS].tolist():
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
            sm = new_subs[j]
            new_subs[j] = make_submatrix(m, sm[1], sm[2], sm[3], sm[4])
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
    first_w = np.empty(len(c.matrices), dtype=np.int64)
    first_w[w_mat[::-1]] = w_idx[::-1]  # of repeated indexes the last assignment holds
    firsts = first_w[w_mat] == w_idx
    c._whole = dict(zip(w_mat[firsts].tolist(), w_idx[firsts].tolist(), strict=True))
    if len(c._whole) < len(c.matrices) - 1:
        for m in range(1, len(c.matrices)):
            if m not in c._whole:
                c._whole[m] = c.new_submatrix(m, 0, c.matrices[m].rows, 0, c.matrices[m].cols)
    session = current_session(c)
    if session is not None:  # the next analysis need not read the submatrices again
        if len(c.submatrices) > len(nsa):
            nsa = np.concatenate([nsa, read_submatrices(c.submatrices[len(nsa):])])
        session.remember_submatrix_array(c.submatrices, nsa)

    # index tables and precomputed indexes: the named ones, in their old order
    new_table = table.copy()
    for k, attr in enumerate(_TABLE_LISTS, 1):
        named = named_table[k]
        tables = getattr(c, attr)
        if len(named) < len(tables):  # (all named: the list stays as it is)
            setattr(c, attr, list(map(tables.__getitem__, named.tolist())))
            at = (kind == k) & (table != -1)
            new_table[at] = np.searchsorted(named, table[at])
            if k == _BLOCKS and len(deriv_at):
                new_deriv = deriv_table.copy()
                new_deriv[deriv_at] = np.searchsorted(named, deriv_table[deriv_at])
                deriv_table = new_deriv
    if len(kept) < ns:
        c.indexes_blocks = [sub_map[tab] for tab in c.indexes_blocks]
        c.indexes_multi = list(c.indexes_multi)
        for k, tab in enumerate(c.indexes_multi):
            subs = tab[:, 0]
            pos = subs > 0
            if pos.any():
                tab = tab.copy()
                tab[pos, 0] = sub_map[subs[pos]]
                c.indexes_multi[k] = tab
    c.precomputed = [None, *map(c.precomputed.__getitem__, used_pre.tolist())]
    new_pre = pre.copy()
    at = pre != 0
    new_pre[at] = np.searchsorted(used_pre, pre[at]) + 1

    # write back the ids that changed (command by command, for memory locality;
    # setattr mapped over them, without a Python-level loop body)
    new_ids = np.concatenate([sub_map[fields], mat_map[mats_named], new_table[:, None],
                              new_pre[:, None], deriv_table[:, None]], axis=1)
    rows_, cols_ = np.nonzero(new_ids != ids)
    deque(map(setattr, map(cmds.__getitem__, rows_.tolist()),
              map(_ID_FIELDS.__getitem__, cols_.tolist()), new_ids[rows_, cols_].tolist()),
          maxlen=0)
