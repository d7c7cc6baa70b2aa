"""Shortcut compilation: expand a computation compiled for n in {0, 1} to n = 0..N-1.

The idea is Kaldi's (ExpandComputation): when every sequence of a request has
the same (t, x) pattern, the computation for N sequences is the one for two
sequences with every matrix, row range and index table stretched along n. The
mini computation (already optimized) is expanded here; nothing is re-derived
from the network except the precomputed indexes of components, which are rebuilt
for the expanded input/output indexes.

Layout. Every matrix of the mini computation must have a regular layout (see
:func:`pynnet3.cache.key.regular_layout`) with n in {0, 1}: rows reshape to
``(O, 2, S)``. The expanded matrix has rows ``(O, N, S)``: old row
``o*2S + w`` (n = 0) stands for new rows ``o*N*S + n'*S + w`` for every n'; old
n = 1 rows only confirm the pattern. A submatrix must start on an n = 0 row and
end on an n = 1 row; it stretches from its first row's new place to its last
row's new place at n = N - 1 (a snipped row range keeps its partial blocks).
Index tables must map n = 1 rows exactly like their n = 0 partners, one source
stride further; commands that pair rows one to one need submatrices of the same
local layout. Anything else raises :class:`ExpansionError`, and the caller
compiles the full request.

The precomputed indexes are rebuilt from a *snapshot* taken on the unoptimized
mini computation (component, input indexes, output indexes, need-backprop per
precomputed object), because optimization may merge a component's input matrix
into another one whose ``MatrixInfo.indexes`` describe a different node.

Everything that does not depend on N (layouts, the checks, where each table entry
goes) is worked out once per mini computation in an :class:`ExpansionPlan`; an
expansion to a given N is then a few vectorized numpy expressions per matrix,
table and component, with no Python loop over rows.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from ..computation import CommandType, MatrixInfo, NnetComputation, SubMatrix

CT = CommandType
_ROWS = (CT.COPY_ROWS, CT.ADD_ROWS)
_MULTI = (CT.COPY_ROWS_MULTI, CT.ADD_ROWS_MULTI, CT.COPY_TO_ROWS_MULTI, CT.ADD_TO_ROWS_MULTI)
_TO_MULTI = (CT.COPY_TO_ROWS_MULTI, CT.ADD_TO_ROWS_MULTI)
_BACKPROPS = (CT.BACKPROP, CT.BACKPROP_NO_MODEL_UPDATE)


class ExpansionError(Exception):
    """The mini computation does not have the structure expansion needs (internal:
    the caching compiler then compiles the full request)."""


@dataclass
class PrecomputedInfo:
    """How one precomputed-indexes object was made: by the component of ``node``
    for these input/output indexes (row orders of the component's matrices)."""

    node: str
    input_indexes: np.ndarray
    output_indexes: np.ndarray
    need_backprop: bool


def snapshot_precomputed(computation: NnetComputation) -> dict[int, PrecomputedInfo]:
    """``id(object) -> PrecomputedInfo`` for every precomputed object of an
    UNOPTIMIZED computation, read off its Propagate commands (whose submatrices are
    then whole matrices with the component's own indexes). Ids, because
    optimization may renumber the objects: see :func:`rekey_snapshot`."""
    c = computation
    with_bp = {cmd.precomputed for cmd in c.commands if cmd.type in _BACKPROPS}
    out: dict[int, PrecomputedInfo] = {}
    empty = np.zeros((0, 3), dtype=np.int64)
    for cmd in c.commands:
        if cmd.type is not CT.PROPAGATE or not cmd.precomputed:
            continue
        obj = c.precomputed[cmd.precomputed]
        if obj is None or id(obj) in out:
            continue
        out[id(obj)] = PrecomputedInfo(
            cmd.node,
            _sub_indexes(c, cmd.in_value) if cmd.in_value else empty,
            _sub_indexes(c, cmd.out_value),
            cmd.precomputed in with_bp)
    return out


def rekey_snapshot(snapshot: dict[int, PrecomputedInfo],
                   computation: NnetComputation) -> dict[int, PrecomputedInfo]:
    """The snapshot keyed by position in ``computation.precomputed`` (taken while
    the objects of the snapshot are still alive); objects a pass made are absent."""
    return {p: snapshot[id(obj)] for p, obj in enumerate(computation.precomputed)
            if obj is not None and id(obj) in snapshot}


def _sub_indexes(c: NnetComputation, s: int) -> np.ndarray:
    sm = c.submatrices[s]
    idx = c.matrices[sm.matrix].indexes
    if idx is None:
        raise ExpansionError(f"matrix {sm.matrix} has no indexes")
    return idx[sm.row_offset:sm.row_offset + sm.num_rows]


def _check(cond, message: str) -> None:
    if not cond:
        raise ExpansionError(message)


def _segments(arrays: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Layouts of many small index arrays at once: for each, its n stride S, with
    the check that it reads ``(O, 2, S)`` with n = 0 then 1 and equal (t, x) in
    both halves. Returns ``(stride, outer)``; raises ExpansionError otherwise."""
    lens = np.array([len(a) for a in arrays], dtype=np.int64)
    _check(bool((lens > 0).all()), "an empty matrix")
    big = np.concatenate(arrays) if arrays else np.zeros((0, 3), dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
    ncol = big[:, 0]
    _check(bool(((ncol == 0) | (ncol == 1)).all()), "n outside {0, 1}")
    ones = np.flatnonzero(ncol == 1)
    first_one = np.searchsorted(ones, starts)
    _check(bool((first_one < len(ones)).all()), "a matrix without n = 1 rows")
    stride = ones[first_one] - starts
    _check(bool((stride > 0).all() and (lens % (2 * stride) == 0).all()),
           "rows are not (O, 2, S) blocks")
    seg = np.repeat(np.arange(len(arrays)), lens)
    s_row = stride[seg]
    local = np.arange(len(big), dtype=np.int64) - starts[seg]
    _check(np.array_equal((local // s_row) % 2, ncol), "n is not in (O, 2, S) blocks")
    one_rows = np.flatnonzero(ncol == 1)
    _check(np.array_equal(big[one_rows, 1:], big[one_rows - s_row[one_rows], 1:]),
           "the two sequences differ in (t, x)")
    return stride, lens // (2 * stride)


def _expand_many(arrays: list[np.ndarray], stride: np.ndarray, num_n: int) -> list[np.ndarray]:
    """Each ``(O*2*S, 3)`` array (n in {0, 1}) as its ``(O*N*S, 3)`` expansion.

    Arrays of one shape ``(O, S)`` are expanded together: stacked, then one
    broadcast copy for the whole group, each result a contiguous view of its
    group's block. A network with many small matrices of one shape (an LSTM's
    per-frame matrices) then costs a few numpy calls, not a few per matrix."""
    out: list = [None] * len(arrays)
    groups: dict[tuple[int, int], list[int]] = {}
    for k, (idx, s) in enumerate(zip(arrays, stride.tolist(), strict=True)):
        groups.setdefault((len(idx) // (2 * s), s), []).append(k)
    for (outer, s), ks in groups.items():
        g = len(ks)
        src = arrays[ks[0]][None] if g == 1 else np.stack([arrays[k] for k in ks])
        # the n = 0 block of each outer step, repeated N times (contiguous chunks
        # of S rows: much faster than a broadcast copy with 3-wide inner loops),
        # then the n column written as one (N * S)-long pattern per outer step
        new = np.repeat(src.reshape(g, outer, 2, s, 3)[:, :, :1].astype(np.int64, copy=False),
                        num_n, axis=2)
        new.reshape(g * outer, num_n * s, 3)[:, :, 0] = np.repeat(
            np.arange(num_n, dtype=np.int64), s)
        flat = new.reshape(g, outer * num_n * s, 3)
        for j, k in enumerate(ks):
            out[k] = flat[j]
    return out


@dataclass
class _TablePlan:
    """Where the n = 0 entries of a table go, independent of N: destination row
    ``o * N * S + w (+ n' * S)`` of submatrix ``sub``, and the value likewise
    (for multi tables: per-entry stride and submatrix)."""

    kind: str  # "rows", "multi", "ranges"
    sub: int
    pos_o: np.ndarray
    pos_w: np.ndarray
    pos_s: int
    val_o: np.ndarray
    val_w: np.ndarray
    val_s: np.ndarray | int
    val_sub: np.ndarray | None = None
    size: np.ndarray | None = None


class ExpansionPlan:
    """The N-independent part of expanding ``mini`` (module doc). Construction
    raises :class:`ExpansionError` when ``mini`` cannot be expanded."""

    def __init__(self, mini: NnetComputation, snapshot: dict[int, PrecomputedInfo], nnet):
        self.mini = mini
        self.nnet = nnet
        self._matrices()
        self._submatrices()
        self._precomputed(snapshot)
        self._commands()

    # -- matrices and submatrices ----------------------------------------------------------
    def _matrices(self) -> None:
        infos = self.mini.matrices[1:]
        _check(all(m.indexes is not None for m in infos), "a matrix has no indexes")
        stride, _ = _segments([m.indexes for m in infos])
        self.stride = np.concatenate([[1], stride])

    def _submatrices(self) -> None:
        """Each submatrix must start on an n = 0 row and end on an n = 1 row of its
        matrix (Kaldi's rule); it then runs from the new place of its first row
        (n = 0) to the new place of its last row taken at n = N - 1."""
        subs = self.mini.submatrices
        arr = np.array([(s.matrix, s.row_offset, s.num_rows) for s in subs],
                       dtype=np.int64).reshape(-1, 3)
        arr[0] = (0, 0, 2)  # the empty submatrix: a harmless stand-in
        stride = self.stride[arr[:, 0]]
        first, last = arr[:, 1], arr[:, 1] + arr[:, 2] - 1
        o_a, phase = np.divmod(first, 2 * stride)
        o_l, rem_l = np.divmod(last, 2 * stride)
        _check(bool((phase < stride).all() and (rem_l >= stride).all()),
               "a submatrix does not start at n = 0 and end at n = 1")
        self.sub_stride, self.sub_phase, self.sub_rows = stride, phase, arr[:, 2]
        self.sub_o_a, self.sub_span, self.sub_tail = o_a, o_l - o_a, rem_l - stride - phase
        self.stride_list, self.phase_list = stride.tolist(), phase.tolist()

    def sub_new_rows(self, num_n: int, sub=slice(None)) -> np.ndarray:
        s = self.sub_stride[sub]
        return self.sub_span[sub] * num_n * s + (num_n - 1) * s + self.sub_tail[sub] + 1

    def sub_new_offsets(self, num_n: int) -> np.ndarray:
        return self.sub_o_a * num_n * self.sub_stride + self.sub_phase

    # -- local rows of submatrices -------------------------------------------------------------
    def _local(self, sub, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For local rows of submatrices ``sub``: their n (bool), their outer block
        (relative) and their place in it (relative to the phase): the new local row
        at sequence n' is ``o * N * S + w + n' * S``."""
        stride = self.sub_stride[sub]
        phase = self.sub_phase[sub]
        o, rem = np.divmod(phase + rows, 2 * stride)
        n = rem >= stride
        return n, o, np.where(n, rem - stride, rem) - phase

    def _zero_rows(self, sub, rows: np.ndarray, what: str) -> tuple[np.ndarray, np.ndarray]:
        """(o, w) of local rows that must be n = 0 rows and whose expansions must
        stay inside the expanded submatrix (an N-independent condition)."""
        n, o, w = self._local(sub, rows)
        _check(not n.any(), f"{what} reads an n = 1 row for an n = 0 row")
        last = o * 2 * self.sub_stride[sub] + w + self.sub_stride[sub]
        _check(bool((last < self.sub_rows[sub]).all()),
               f"{what}: a row falls outside its expanded submatrix")
        return o, w

    def _split(self, sub: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Local rows of ``sub`` with n = 0, with n = 1, and for the latter the local
        row of their n = 0 partner (negative when outside the submatrix)."""
        n, _, _ = self._local(sub, np.arange(int(self.sub_rows[sub]), dtype=np.int64))
        zero, one = np.flatnonzero(~n), np.flatnonzero(n)
        return zero, one, one - int(self.sub_stride[sub])

    # -- index tables ---------------------------------------------------------------------------
    def _rows_plan(self, tab: np.ndarray, dst: int, src: int) -> _TablePlan:
        zero, one, partner = self._split(dst)
        inside = partner >= 0
        want = np.full(len(one), -1, dtype=np.int64)
        pv = tab[partner[inside]]
        want[inside] = np.where(pv >= 0, pv + int(self.sub_stride[src]), -1)
        _check(np.array_equal(tab[one], want), "a row table is not regular in n")
        valid = tab[zero] >= 0
        po, pw = self._zero_rows(dst, zero[valid], "a row table")
        vo, vw = self._zero_rows(src, tab[zero][valid], "a row table")
        return _TablePlan("rows", dst, po, pw, int(self.sub_stride[dst]), vo, vw,
                          int(self.sub_stride[src]))

    def _multi_plan(self, tab: np.ndarray, own: int) -> _TablePlan:
        zero, one, partner = self._split(own)
        inside = partner >= 0
        subs, rows = tab[:, 0], tab[:, 1]
        psub, prow = subs[partner[inside]], rows[partner[inside]]
        ok = psub >= 0
        want_sub = np.full(len(one), -1, dtype=np.int64)
        want_row = np.full(len(one), -1, dtype=np.int64)
        want_sub[inside] = np.where(ok, psub, -1)
        want_row[inside] = np.where(ok, prow + self.sub_stride[np.maximum(psub, 0)], -1)
        _check(np.array_equal(subs[one], want_sub) and np.array_equal(rows[one], want_row),
               "a multi-row table is not regular in n")
        valid = subs[zero] >= 0
        s0, r0 = subs[zero][valid], rows[zero][valid]
        po, pw = self._zero_rows(own, zero[valid], "a multi-row table")
        vo, vw = self._zero_rows(s0, r0, "a multi-row table")
        return _TablePlan("multi", own, po, pw, int(self.sub_stride[own]), vo, vw,
                          self.sub_stride[s0], s0)

    def _ranges_plan(self, tab: np.ndarray, dst: int, src: int) -> _TablePlan:
        zero, one, partner = self._split(dst)
        inside = partner >= 0
        ss = int(self.sub_stride[src])
        b, e = tab[:, 0], tab[:, 1]
        size = e - b
        pb, psize = b[partner[inside]], size[partner[inside]]
        _check(np.array_equal(size[one][inside], psize)
               and np.array_equal(b[one][inside][psize > 0], pb[psize > 0] + ss)
               and not (size[one][~inside] > 0).any(), "a row-range table is not regular in n")
        sel = zero[size[zero] > 0]
        po, pw = self._zero_rows(dst, sel, "a row-range table")
        vo, vw = self._zero_rows(src, b[sel], "a row-range table")
        lo, lw = self._zero_rows(src, e[sel] - 1, "a row-range table")
        # The range must stay contiguous: its first and last rows in one n = 0 block.
        _check(np.array_equal(lo, vo) and np.array_equal(lw - vw, size[sel] - 1),
               "a row range spans n blocks")
        return _TablePlan("ranges", dst, po, pw, int(self.sub_stride[dst]), vo, vw, ss,
                          size=size[sel])

    @staticmethod
    def _table(plan: _TablePlan, new_rows: int, num_n: int) -> np.ndarray:
        n = np.arange(num_n, dtype=np.int64)[None, :]
        pos = (plan.pos_o * (num_n * plan.pos_s) + plan.pos_w)[:, None] + n * plan.pos_s
        vs = np.reshape(plan.val_s, (-1, 1)) if plan.kind == "multi" else plan.val_s
        val = (plan.val_o[:, None] * (num_n * vs) + plan.val_w[:, None]) + n * vs
        if plan.kind == "rows":
            new = np.full(new_rows, -1, dtype=np.int64)
            new[pos] = val
        elif plan.kind == "multi":
            new = np.full((new_rows, 2), -1, dtype=np.int64)
            new[pos, 0] = plan.val_sub[:, None]
            new[pos, 1] = val
        else:
            new = np.zeros((new_rows, 2), dtype=np.int64)
            new[pos, 0] = val
            new[pos, 1] = val + plan.size[:, None]
        return new

    # -- precomputed indexes -----------------------------------------------------------------
    def _precomputed(self, snapshot: dict[int, PrecomputedInfo]) -> None:
        c = self.mini
        props = {}
        for cmd in c.commands:
            if cmd.type is CT.PROPAGATE and cmd.precomputed:
                props.setdefault(cmd.precomputed, cmd)
        self.pre: list[tuple[int, PrecomputedInfo]] = []
        arrays = []
        ours: list[np.ndarray] = []  # n of the rows the optimized computation reads ...
        theirs: list[np.ndarray] = []  # ... and of the rows the snapshot describes
        for p, obj in enumerate(c.precomputed):
            if obj is None:
                continue
            info = snapshot.get(p)
            _check(info is not None and p in props,
                   f"precomputed indexes {p} were made by an optimization pass")
            cmd = props[p]
            if cmd.in_value:
                ours.append(_sub_indexes(c, cmd.in_value)[:, 0])
                theirs.append(info.input_indexes[:, 0])
            ours.append(_sub_indexes(c, cmd.out_value)[:, 0])
            theirs.append(info.output_indexes[:, 0])
            self.pre.append((p, info))
            arrays.append(info.output_indexes)
            if len(info.input_indexes):
                arrays.append(info.input_indexes)
        # The optimized computation must still read the components' rows with the
        # snapshot's n pattern (so both expand to the same row order): one
        # comparison for all of them.
        _check(all(len(a) == len(b) for a, b in zip(ours, theirs, strict=True))
               and (not ours or np.array_equal(np.concatenate(ours), np.concatenate(theirs))),
               "a component's input or output rows were reordered")
        self.pre_arrays = arrays
        self.pre_stride = _segments(arrays)[0] if arrays else np.zeros(0, dtype=np.int64)

    # -- commands ---------------------------------------------------------------------------
    def _same_layout(self, a: int, b: int, t: CT) -> None:
        """Row i of submatrix a goes with row i of b: their local n structure
        (stride, phase) must agree so both stretch the same way."""
        if a and b and (self.stride_list[a] != self.stride_list[b]
                        or self.phase_list[a] != self.phase_list[b]):
            raise ExpansionError(f"{t.value} mixes n layouts")

    def _commands(self) -> None:
        c = self.mini
        simple = {n.name: self.nnet.components[n.component].is_simple()
                  for n in self.nnet.nodes if n.kind == "component-node"}
        memo: dict[tuple, int] = {}
        self.tables: list[_TablePlan] = []
        self.table_of: list[tuple[int, int]] = []  # (command index, plan index)
        stride, phase = self.stride_list, self.phase_list
        same = self._same_layout
        MC, MA, PR, RR = CT.MATRIX_COPY, CT.MATRIX_ADD, CT.PROPAGATE, CT.ADD_ROW_RANGES
        for k, cmd in enumerate(c.commands):
            t = cmd.type
            if t is MC or t is MA:
                a, b = cmd.dst, cmd.src
                if a and b and (stride[a] != stride[b] or phase[a] != phase[b]):
                    same(a, b, t)  # raises
            elif t is PR or t in _BACKPROPS:
                same(cmd.in_value, cmd.in_deriv, t)
                same(cmd.out_value, cmd.out_deriv, t)
                if simple.get(cmd.node, False):
                    same(cmd.in_value or cmd.in_deriv, cmd.out_value or cmd.out_deriv, t)
                if cmd.table >= 0:
                    # input read as column blocks: row i of every block goes with row
                    # i of the output (derivative). Submatrix ids keep their meaning
                    # under expansion, so the block table itself is shared unchanged.
                    for s in c.indexes_blocks[cmd.table].tolist():
                        same(s, cmd.out_value or cmd.out_deriv, t)
            elif t in _ROWS or t is RR or t in _MULTI:
                if t in _MULTI:
                    # The table runs over the command's own submatrix: dst for the
                    # gathers, src for the scatters (kCopyToRowsMulti's one argument).
                    own = cmd.src if t in _TO_MULTI and cmd.src else cmd.dst
                    key = ("multi", cmd.table, own)
                else:
                    key = (t.value, cmd.table, cmd.dst, cmd.src)
                plan_id = memo.get(key)
                if plan_id is None:
                    if t in _MULTI:
                        plan = self._multi_plan(c.indexes_multi[cmd.table], own)
                    elif t is RR:
                        plan = self._ranges_plan(c.indexes_ranges[cmd.table], cmd.dst, cmd.src)
                    else:
                        plan = self._rows_plan(c.indexes[cmd.table], cmd.dst, cmd.src)
                    self.tables.append(plan)
                    plan_id = memo[key] = len(self.tables) - 1
                self.table_of.append((k, plan_id))
            elif t is CT.GOTO_LABEL:
                raise ExpansionError("looped computations are not expanded")
            # SWAP_MATRIX needs only equal sizes, which expansion keeps (rows * N / 2);
            # the swapped-in contents are undefined (allocate-from-other).

    # -- expansion -------------------------------------------------------------------------
    def expand(self, num_n: int, request=None, debug_info: bool = True) -> NnetComputation:
        """The computation for ``num_n`` sequences (module doc). Commands without
        index tables are shared with the mini computation (cached computations are
        read-only)."""
        if num_n < 2:
            raise ExpansionError("expansion needs at least 2 sequences")
        c, N = self.mini, num_n
        new = copy.copy(c)
        infos = c.matrices[1:]
        idx = (_expand_many([m.indexes for m in infos], self.stride[1:], N)
               if debug_info else [None] * len(infos))
        new.matrices = [c.matrices[0]] + [
            MatrixInfo(m.rows // 2 * N, m.cols, m.node, m.is_deriv, ix)
            for m, ix in zip(infos, idx, strict=True)]
        offs, rows = self.sub_new_offsets(N).tolist(), self.sub_new_rows(N).tolist()
        new.submatrices = [c.submatrices[0]] + [
            SubMatrix(s.matrix, offs[k], rows[k], s.col_offset, s.num_cols)
            for k, s in enumerate(c.submatrices[1:], start=1)]
        tables = [self._table(p, rows[p.sub], N) for p in self.tables]
        new.indexes, new.indexes_multi, new.indexes_ranges = [], [], []
        lists = {"rows": new.indexes, "multi": new.indexes_multi,
                 "ranges": new.indexes_ranges}
        slot = []
        for p, table in zip(self.tables, tables, strict=True):
            lst = lists[p.kind]
            lst.append(table)
            slot.append(len(lst) - 1)
        cmds = list(c.commands)
        for k, plan_id in self.table_of:
            cmd = copy.copy(cmds[k])
            cmd.table = slot[plan_id]
            cmds[k] = cmd
        new.commands = cmds
        new.precomputed = self._expand_precomputed(N)
        new._whole = dict(c._whole)
        if request is not None:
            new.request = request
        return new

    def _expand_precomputed(self, num_n: int) -> list:
        out = [None] * len(self.mini.precomputed)
        expanded = iter(_expand_many(self.pre_arrays, self.pre_stride, num_n))
        empty = np.zeros((0, 3), dtype=np.int64)
        for p, info in self.pre:
            new_out = next(expanded)
            new_in = next(expanded) if len(info.input_indexes) else empty
            comp = self.nnet.components[self.nnet.node(info.node).component]
            out[p] = comp.precompute_indexes(new_in, new_out, info.need_backprop)
        return out


def expand_computation(mini: NnetComputation, snapshot: dict[int, PrecomputedInfo],
                       num_n: int, nnet, request=None,
                       debug_info: bool = True) -> NnetComputation:
    """The computation for ``num_n`` sequences from ``mini`` (compiled for n in
    {0, 1}, usually optimized; ``snapshot`` from :func:`rekey_snapshot`): a
    one-off :class:`ExpansionPlan` and its expansion. Raises
    :class:`ExpansionError` when ``mini`` lacks the regular structure."""
    return ExpansionPlan(mini, snapshot, nnet).expand(num_n, request, debug_info)
